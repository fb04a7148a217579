"""Follow a detached run's ranks on one host: run there by its python,
standard library only, sent as ``python -c`` by `mlxcluster attach`
(jobs.attach), with the run's folder (the rank wrapper's stacks directory)
as its argument.

Every rank of the run on this host (``rank<R>.pid``) is read from its first
line: what it wrote on stdout (``rank<R>.out``) is printed on stdout, what
it wrote on stderr (``rank<R>.err``) on stderr, complete lines only, until
every rank has ended and its files are read to their end. The exit code is
the highest of theirs (``rank<R>.exit``; 137 for a rank a signal ended,
which writes none); 3 when the folder holds no rank.
"""

import glob
import os
import sys
import time

POLL_S = 0.1
KILLED = 137  # as a shell reports a process SIGKILL ended


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exit_code(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def main(directory):
    ranks = []
    for pid_file in sorted(glob.glob(os.path.join(directory, "rank*.pid"))):
        base = pid_file[:-len(".pid")]
        try:
            with open(pid_file) as f:
                pid = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        streams = []
        for suffix, out in ((".out", sys.stdout.buffer), (".err", sys.stderr.buffer)):
            try:
                streams.append([open(base + suffix, "rb"), out, b""])
            except OSError:
                pass
        ranks.append({"pid": pid, "exit": base + ".exit", "streams": streams, "done": False})
    if not ranks:
        print(f"no rank of this run on this host ({directory})", file=sys.stderr)
        return 3
    while True:
        ended = [r["done"] or not alive(r["pid"]) or exit_code(r["exit"]) is not None
                 for r in ranks]
        for rank in ranks:
            for stream in rank["streams"]:
                data = stream[0].read()
                if data:
                    *lines, stream[2] = (stream[2] + data).split(b"\n")
                    if lines:
                        stream[1].write(b"".join(line + b"\n" for line in lines))
                        stream[1].flush()
        if all(ended):
            break
        time.sleep(POLL_S)
    codes = []
    for rank in ranks:
        for stream in rank["streams"]:
            if stream[2]:
                stream[1].write(stream[2] + b"\n")
                stream[1].flush()
        code = exit_code(rank["exit"])
        codes.append(KILLED if code is None else code)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
