"""What runs on a host for every transfer (mlxcluster.transfer): a stdlib-only
script, sent as ``python -S -c`` with one JSON argument, so that it needs
nothing on the host but its python. Its ``receive`` also runs here, on what
a host sends (mlxcluster.transfer.fetch): one check of what arrives, both ways.

    mark    {"dir": D, "token": T}  -> {}  (D made if missing; an empty file D/.mlxcluster-storage/T)
    check   {"dir": D, "files": [{"name", "bytes", "sha256"}, ...],
             "tokens": [T, ...], "here": T0 (optional)}
            -> {"files": {name: "ok" | "missing" | "size" | "different"},
                "partial": {name: bytes of it already received, kept from a send cut off},
                "free": bytes free where D is (or would be made), "rsync": bool,
                "dir": D as this host names it,
                "sees": [the tokens found in D/.mlxcluster-storage], "same_as_here": bool}
               (D holding this machine's token T0 is this machine's folder: not hashed again)
    unmark  {"dir": D, "token": T}  -> {}  (the token removed, and its folder when empty)
    receive {"dir": D, "files": [{..., "from": OFFSET}, ...], "resumable": bool}, the
            files' bytes from their OFFSET (0 when left out) one after another on stdin
            -> {"installed": [names]}  (each verified, then renamed into D)
    install {"dir": D, "files": [...], "from": D/.incoming.rsync.<random>}
            -> the same, for files rsync left in "from"
    send    {"dir": D}  -> on stdout, one line {"dir": D, "files": [...]} (D's regular files,
            not its dot files, links or folders), then their bytes one after another
    offer   {"dir": D, "files": [...], "bind": IP, "token": T, "seconds": S}
            -> on stdout, one line {"port": P} at once; then D's files are given, each
               from the byte asked, to whoever connects to IP:P and sends T first,
               until stdin ends (the ssh session that started it) or S seconds pass
    take    {"dir": D, "files": [{..., "from": OFFSET}, ...], "at": "IP:P", "token": T}
            -> the files from an ``offer`` on another host: received as ``receive``
               does (resumable, verified, installed); while they come, lines
               {"progress": bytes received so far} (at most 4 a second); last
               {"installed": [names]}
    list    {"dir": D}  -> {"dir": D, "files": [{"name", "bytes", "sha256"}, ...]}: every file
            below D, links followed (a Hugging Face snapshot is links to its blobs), but dot
            files and folders: the manifest of a model a host downloaded itself
    heads   {"dir": D, "whole": [names], "headers": [names]} -> on stdout, as ``send``: one
            line {"dir": D, "files": [...]}, then the bytes of each "whole" file (links
            followed) and only the header of each "headers" one (a safetensors file: its
            8-byte length and its JSON): what this machine reads of a model only the hosts
            hold (mlxcluster.transfer.view), not its tensors

A D starting with ``~`` is the host's own home (the cache of the code ranks
import: mlxcluster.launch.code; the doctor's wheels). A received file goes
to a folder inside D first and is renamed into place only once its sha256 is
the one asked for, meta.json last: a copy cut off half way is never taken
for whole (the next check finds it and sends what is missing). A name that
would leave D (absolute, or with ``..``) is refused.

A file streamed ``resumable`` is written, as it arrives and unbuffered, to a
part of its own, D/.mlxcluster-partial/<its sha256>.<random> (the folder
removed once empty): a send cut off (link down, host asleep, Ctrl-C) leaves
there what arrived, ``check`` reports the longest part's length, and the
next send starts that file where it stopped (its ``from``): the new agent
copies that many bytes of the part into a part of its own, hashing them,
removes the old one and appends what follows. An agent of the cut send
still waiting on its dead connection (sshd may not notice for hours) thus
never writes into the new part. A whole that is not the sha256 asked for is
removed, never installed. At most the one chunk being read when the agent
was killed is lost.
Failures: one line on stderr, exit 1.
"""

import contextlib
import hashlib
import hmac
import json
import os
import shutil
import struct
import sys
import tempfile
import time

CHUNK = 1 << 20
STORAGE_DIR = ".mlxcluster-storage"  # as reference_train/storage.py names it
PARTIAL_DIR = ".mlxcluster-partial"  # files being received, by sha256: a cut send resumes
HEADER_LIMIT = 100 * 2**20  # safetensors' own cap on a header (mlxcluster.fit.model_folder)


def sha256_of(path):
    with open(path, "rb") as f:
        return copy_bytes(f, None, os.fstat(f.fileno()).st_size, path)


def inside(folder, name):
    """``folder``/``name``, refused when ``name`` would leave ``folder``."""
    parts = name.split("/")
    if not name or name.startswith("/") or ".." in parts or "" in parts:
        raise ValueError(f"refused the file name {name!r}: it would leave {folder}")
    return os.path.join(folder, *parts)


def status_of(folder, want):
    path = inside(folder, want["name"])
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


def token_path(spec, token):
    return os.path.join(spec["dir"], STORAGE_DIR, token)


def parts_of(folder, want):
    """The parts of ``want`` cut sends left in ``folder``, longest first:
    [(bytes, path)], none longer than the file."""
    sha256 = want["sha256"]
    if not sha256 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError(f"refused the sha256 {sha256!r}")
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(os.path.join(folder, PARTIAL_DIR)):
            if entry.name.startswith(sha256 + "."):
                with contextlib.suppress(OSError):
                    size = entry.stat(follow_symlinks=False).st_size
                    if size <= want["bytes"]:
                        found.append((size, entry.path))
    return sorted(found, reverse=True)


def partial_bytes(folder, want):
    """How much of ``want`` a send cut off left here (0: nothing usable)."""
    parts = parts_of(folder, want)
    return parts[0][0] if parts else 0


def check(spec):
    here = spec.get("here")
    same = bool(here) and os.path.exists(token_path(spec, here))
    files = {f["name"]: "ok" if same else status_of(spec["dir"], f) for f in spec["files"]}
    partial = {f["name"]: partial_bytes(spec["dir"], f) for f in spec["files"]
               if files[f["name"]] != "ok"}
    return {"files": files, "partial": {name: n for name, n in partial.items() if n},
            "free": shutil.disk_usage(existing_parent(spec["dir"])).free,
            "rsync": shutil.which("rsync") is not None, "dir": spec["dir"],
            "sees": [t for t in spec.get("tokens", ()) if os.path.exists(token_path(spec, t))],
            "same_as_here": same}


def mark(spec):
    os.makedirs(os.path.join(spec["dir"], STORAGE_DIR), exist_ok=True)
    open(token_path(spec, spec["token"]), "w").close()
    return {}


def unmark(spec):
    try:
        os.remove(token_path(spec, spec["token"]))
        os.rmdir(os.path.join(spec["dir"], STORAGE_DIR))
    except OSError:
        pass  # another host's token still there: that host removes the folder
    return {}


def install(spec, incoming, digests=None):
    """Verify each file in ``incoming`` (by ``digests`` taken as it arrived,
    else read again) and rename it into the folder (meta.json last)."""
    return put_in_place(spec, {f["name"]: inside(incoming, f["name"]) for f in spec["files"]},
                        digests)


def put_in_place(spec, paths, digests=None):
    """Each file at ``paths[name]`` verified (``digests`` or read again) and
    renamed into the folder, meta.json last; one with other bytes is removed
    (never resumed from, never installed) and named."""
    names = []
    for f in sorted(spec["files"], key=lambda f: f["name"] == "meta.json"):
        path = paths[f["name"]]
        got = digests[f["name"]] if digests else sha256_of(path)
        if got != f["sha256"]:
            with contextlib.suppress(OSError):
                os.remove(path)
            raise ValueError(f"{f['name']} arrived with sha256 {got[:12]}, not {f['sha256'][:12]}")
        target = inside(spec["dir"], f["name"])
        os.makedirs(os.path.dirname(target), exist_ok=True)  # tokenizer/...
        os.replace(path, target)
        names.append(f["name"])
    return {"installed": names}


def receive(spec, stream=None):
    """The files of ``spec``, read one after another from ``stream`` (stdin
    on a host), each hashed as it arrives (``resumable``: from its ``from``,
    kept as it comes in PARTIAL_DIR), then installed."""
    stream = sys.stdin.buffer if stream is None else stream
    os.makedirs(spec["dir"], exist_ok=True)
    incoming = tempfile.mkdtemp(prefix=".incoming.", dir=spec["dir"])
    resumable = bool(spec.get("resumable"))
    if resumable:
        os.makedirs(os.path.join(spec["dir"], PARTIAL_DIR), exist_ok=True)
    try:
        digests, paths = {}, {}
        for f in spec["files"]:
            paths[f["name"]], digests[f["name"]] = receive_file(spec["dir"], incoming, f, stream,
                                                                resumable)
        installed = put_in_place(spec, paths, digests)
        if resumable:
            with contextlib.suppress(OSError):  # empty once every file is in place
                os.rmdir(os.path.join(spec["dir"], PARTIAL_DIR))
        return installed
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def receive_file(folder, incoming, want, stream, resumable):
    """One file from ``stream``: when ``resumable``, into a part of its own
    (PARTIAL_DIR), the first ``want["from"]`` bytes taken from a cut send's
    part, then what arrives, kept as it comes; else into ``incoming`` (dropped
    with it when cut). (Where it now is, its sha256.)"""
    if not resumable:
        path = inside(incoming, want["name"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            return path, copy_bytes(stream, out, want["bytes"], want["name"])
    start = int(want.get("from", 0))
    parts = parts_of(folder, want)  # before ours exists
    path = os.path.join(folder, PARTIAL_DIR, f"{want['sha256']}.{os.getpid()}-{os.urandom(4).hex()}")
    h = hashlib.sha256()
    with open(path, "xb", buffering=0) as out:  # every chunk on disk as it comes
        if start:
            source = next((p for size, p in parts if size >= start), None)
            if source is None:
                raise ValueError(f"{want['name']}: the {start} bytes a cut send left are no longer "
                                 "here: send again")
            with open(source, "rb") as before:
                copy_bytes(before, out, start, want["name"], h)
            with contextlib.suppress(OSError):
                os.remove(source)  # ours holds them now
        return path, copy_bytes(stream, out, want["bytes"] - start, want["name"], h)


def send(spec, out):
    """D's regular files (no dot files, links or folders): their list, then their bytes."""
    names = sorted(e.name for e in os.scandir(spec["dir"])
                   if e.is_file(follow_symlinks=False) and not e.name.startswith("."))
    stream_files(spec["dir"], [(n, None) for n in names], out)


def heads(spec, out):
    """The "whole" files of D, and of each "headers" file its safetensors
    header alone: their list, then their bytes (``stream_files``)."""
    folder = spec["dir"]
    stream_files(folder, [(n, None) for n in spec["whole"]]
                 + [(n, header_bytes(inside(folder, n), n)) for n in spec["headers"]], out)


def header_bytes(path, name):
    """How many bytes a safetensors file's header takes: its 8-byte length
    (little-endian) and the JSON that follows."""
    with open(path, "rb") as f:
        head = f.read(8)
        size = os.fstat(f.fileno()).st_size
    length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
    if length < 0 or length > HEADER_LIMIT or 8 + length > size:
        raise ValueError(f"{name} is not a safetensors file (its header cannot be read)")
    return 8 + length


def stream_files(folder, parts, out):
    """For each (name, count) of ``parts``, the first ``count`` bytes of the
    file (None: all of it): their list with each part's sha256, then the
    bytes one after another (the stream ``receive`` reads)."""
    files = []
    for name, count in parts:
        path = inside(folder, name)
        count = os.path.getsize(path) if count is None else count
        with open(path, "rb") as source:
            files.append({"name": name, "bytes": count,
                          "sha256": copy_bytes(source, None, count, name)})
    out.write(json.dumps({"dir": folder, "files": files}).encode() + b"\n")
    for f in files:
        with open(inside(folder, f["name"]), "rb") as source:
            # the bytes listed, no more: a file changed since is refused here already
            if copy_bytes(source, out, f["bytes"], f["name"]) != f["sha256"]:
                raise ValueError(f"{f['name']} changed while it was sent")
    out.flush()


def listing(spec):
    """Every file below D (links followed), by name, size and sha256: what a
    model this host downloaded holds, for the others to take and check."""
    root, files = spec["dir"], []
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for n in sorted(names):
            path = os.path.join(folder, n)
            if n.startswith(".") or not os.path.isfile(path):
                continue
            files.append({"name": os.path.relpath(path, root).replace(os.sep, "/"),
                          "bytes": os.path.getsize(path), "sha256": sha256_of(path)})
    if not os.path.isdir(root):
        raise ValueError("no such folder")
    return {"dir": root, "files": files}


def copy_bytes(source, out, count, name, h=None):
    """Exactly ``count`` bytes of the file ``name`` from ``source`` to ``out``
    (None: only hashed); their sha256 (with what ``h`` hashed before). The one
    hash on the host."""
    h = hashlib.sha256() if h is None else h
    while count:
        chunk = source.read(min(CHUNK, count))
        if not chunk:
            raise ValueError(f"the stream ended {count} bytes before the end of {name}")
        if out is not None:
            out.write(chunk)
        h.update(chunk)
        count -= len(chunk)
    return h.hexdigest()


def main(argv):
    what, spec = argv[1], json.loads(argv[2])
    spec["dir"] = os.path.expanduser(spec["dir"])
    try:
        if what in ("send", "heads"):
            (send if what == "send" else heads)(spec, sys.stdout.buffer)
            return 0
        if what == "check":
            answer = check(spec)
        elif what in ("mark", "unmark"):
            answer = (mark if what == "mark" else unmark)(spec)
        elif what == "receive":
            answer = receive(spec)
        elif what == "offer":
            answer = offer(spec)
        elif what == "take":
            answer = take(spec)
        elif what == "list":
            answer = listing(spec)
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


def offer(spec):
    """Give the folder's files to the hosts that connect with the token (one
    thread each), until stdin ends or the time is up: a copy one host has
    goes to the next over the hosts' own link (mlxcluster.transfer.fanout)."""
    import socket
    import threading

    listener = socket.create_server((spec["bind"], 0))
    listener.settimeout(1.0)
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    files = {f["name"]: f for f in spec["files"]}
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), done.set()), daemon=True).start()
    deadline = time.monotonic() + float(spec["seconds"])

    def give(conn):
        with conn, conn.makefile("rb") as asked:
            conn.settimeout(60)
            request = json.loads(asked.readline(1 << 20) or b"{}")
            if not hmac.compare_digest(str(request.get("token", "")), spec["token"]):
                return
            for want in request.get("files", []):
                f = files[want["name"]]
                start = int(want.get("from", 0))
                with open(inside(spec["dir"], f["name"]), "rb") as source:
                    # not hashed here: the taker hashes what arrives (sendfile: no copy)
                    conn.sendfile(source, start, f["bytes"] - start)

    while not done.is_set() and time.monotonic() < deadline:
        try:
            conn, _ = listener.accept()
        except OSError:  # socket.timeout (not TimeoutError before Python 3.10)
            continue
        threading.Thread(target=give, args=(conn,), daemon=True).start()
    return {}


def take(spec):
    """The files of ``spec`` from another host's ``offer`` (its IP:port and
    token), each from its ``from``: received, verified and installed as
    ``receive`` does."""
    import socket

    host, _, port = spec["at"].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.settimeout(60)  # a source that stops giving: given up, what arrived kept
        request = {"token": spec["token"],
                   "files": [{"name": f["name"], "from": int(f.get("from", 0))} for f in spec["files"]]}
        conn.sendall(json.dumps(request).encode() + b"\n")
        with conn.makefile("rb") as stream:
            counted = Counted(stream, sys.stdout)
            installed = receive({**spec, "resumable": True}, counted)
            counted.say()  # the whole, once every file is in place
            return installed


class Counted:
    """A stream whose reads are told on ``out``, as {"progress": bytes so far}
    lines: the taking host's progress, which this machine cannot see (the
    bytes go from host to host). At least PROGRESS_S apart (a line per
    1 MiB chunk would be thousands a second), and the whole at the end."""

    PROGRESS_S = 0.25

    def __init__(self, stream, out):
        self.stream, self.out, self.done, self.said_at = stream, out, 0, 0.0

    def read(self, n=-1):
        data = self.stream.read(n)
        self.done += len(data)
        now = time.monotonic()
        if now - self.said_at >= self.PROGRESS_S:
            self.say()
            self.said_at = now
        return data

    def say(self):
        self.out.write(json.dumps({"progress": self.done}) + "\n")
        self.out.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
