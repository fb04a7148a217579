"""What runs on each host for `train --data DIR` (mlxcluster.launch.sync): a
stdlib-only script, sent as ``python -c`` with one JSON argument, so that it
needs nothing on the host but the job's python.

    check   {"dir": D, "files": [{"name", "bytes", "sha256"}, ...]}
            -> {"files": {name: "ok" | "missing" | "size" | "different"},
                "free": bytes free where D is (or would be made), "rsync": bool,
                "dir": D as this host names it}
    receive {"dir": D, "files": [...]}, the files' bytes one after another on stdin
            -> {"installed": [names]}  (each verified, then renamed into D)
    install {"dir": D, "files": [...], "from": D/.incoming.rsync}
            -> the same, for files rsync left in "from"

A D starting with ``~`` is the host's own home (the cache of the code ranks
import: mlxcluster.launch.code). A received file goes to a folder inside D first and is renamed into place only
once its sha256 is the one asked for, meta.json last: a copy cut off half way
is never taken for whole (the next check finds it and sends what is missing).
Failures: one line on stderr, exit 1.
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile

CHUNK = 1 << 20


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def status_of(folder, want):
    path = os.path.join(folder, want["name"])
    try:
        size = os.path.getsize(path)
    except OSError:
        return "missing"
    if size != want["bytes"]:
        return "size"
    return "ok" if sha256_of(path) == want["sha256"] else "different"


def existing_parent(path):
    while not os.path.isdir(path):
        path = os.path.dirname(path) or "/"
    return path


def check(spec):
    return {"files": {f["name"]: status_of(spec["dir"], f) for f in spec["files"]},
            "free": shutil.disk_usage(existing_parent(spec["dir"])).free,
            "rsync": shutil.which("rsync") is not None, "dir": spec["dir"]}


def install(spec, incoming, digests=None):
    """Verify each file in ``incoming`` (by ``digests`` taken as it arrived,
    else read again) and rename it into the data folder (meta.json last)."""
    names = []
    for f in sorted(spec["files"], key=lambda f: f["name"] == "meta.json"):
        path = os.path.join(incoming, f["name"])
        got = digests[f["name"]] if digests else sha256_of(path)
        if got != f["sha256"]:
            raise ValueError(f"{f['name']} arrived with sha256 {got[:12]}, not {f['sha256'][:12]}")
        target = os.path.join(spec["dir"], f["name"])
        os.makedirs(os.path.dirname(target), exist_ok=True)  # tokenizer/...
        os.replace(path, target)
        names.append(f["name"])
    return {"installed": names}


def receive(spec):
    os.makedirs(spec["dir"], exist_ok=True)
    incoming = tempfile.mkdtemp(prefix=".incoming.", dir=spec["dir"])
    try:
        stream, digests = sys.stdin.buffer, {}
        for f in spec["files"]:
            left, h = f["bytes"], hashlib.sha256()
            path = os.path.join(incoming, f["name"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as out:
                while left:
                    chunk = stream.read(min(CHUNK, left))
                    if not chunk:
                        raise ValueError(f"the stream ended {left} bytes before the end of {f['name']}")
                    out.write(chunk)
                    h.update(chunk)
                    left -= len(chunk)
            digests[f["name"]] = h.hexdigest()
        return install(spec, incoming, digests)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def main(argv):
    what, spec = argv[1], json.loads(argv[2])
    spec["dir"] = os.path.expanduser(spec["dir"])
    try:
        if what == "check":
            answer = check(spec)
        elif what == "receive":
            answer = receive(spec)
        else:
            try:
                answer = install(spec, spec["from"])
            finally:
                shutil.rmtree(spec["from"], ignore_errors=True)
    except (OSError, ValueError) as err:
        print(f"{what} {spec['dir']}: {err}", file=sys.stderr)
        return 1
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
