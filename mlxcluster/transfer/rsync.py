"""Files sent by rsync over a ``ProcessLink``'s own ssh, with rsync's progress read.

rsync's ``-e`` is the link's ssh with its options (BatchMode, host keys
checked, the connect timeout, the inventory's ``-F``/``-p``, a shared
connection's ControlPath), so rsync reaches the host exactly as every other
call does. Each source is ``DIR/./NAME`` with ``--relative``: it lands at
``DEST/NAME`` (``tokenizer/...`` included).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

from mlxcluster.ssh.results import CommandResult
from mlxcluster.transfer.link import STALL_S, ProcessLink, Watchdog

PROGRESS_RE = re.compile(rb"^\s*([\d,.]+)\s+\d+%")  # rsync --progress: '  1,234,567  45% ...'


def rsync_argv(link: ProcessLink, sources: Sequence[str], dest: str) -> list[str]:
    return ["rsync", "--partial", "--times", "--progress", "--relative", f"--timeout={STALL_S:.0f}",
            "-e", shlex.join(link.ssh), *sources, f"{link.target}:{dest}/"]


def rsync_files(link: ProcessLink, sources: Sequence[str], dest: str,
                progress: Callable[[int], None], timeout: float) -> CommandResult:
    """rsync ``sources`` into ``dest`` on the link's host; ``progress`` gets
    the bytes sent so far. Given up when rsync says nothing for ``STALL_S +
    timeout`` (rsync's own ``--timeout`` ends a stalled link before)."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as said:
        proc = subprocess.Popen(rsync_argv(link, sources, dest), stdout=subprocess.PIPE,
                                stderr=said, env=link.env)
        done, current = 0, 0
        with Watchdog(proc, STALL_S, timeout, flowing=False) as watchdog:
            for piece in progress_pieces(proc.stdout):
                watchdog.moved()
                found = PROGRESS_RE.match(piece)
                if found:
                    current = int(found.group(1).replace(b",", b"").replace(b".", b""))
                    progress(done + current)
                elif piece.strip():  # a file's name: the one before it is done
                    done, current = done + current, 0
            proc.wait()
        said.seek(0)
        err = watchdog.why or said.read().decode(errors="replace")
    return CommandResult("", err, proc.returncode, time.monotonic() - started)


def progress_pieces(stream) -> Iterator[bytes]:
    """rsync's progress lines, split on both '\\r' and '\\n' as they arrive."""
    pending = b""
    while chunk := stream.read1(4096) if hasattr(stream, "read1") else stream.read(4096):
        pending += chunk
        *whole, pending = re.split(rb"[\r\n]", pending)
        yield from whole
    if pending:
        yield pending
