"""One SSH connection per host for the whole of a job (OpenSSH connection
sharing: ``ControlMaster``).

A short job makes several ssh calls to every host: the python check or the
probe, the launcher's start of each rank (``mlx.launch`` and ``mpirun`` run
``ssh`` from PATH), the launcher's own stop calls, our sweep for the run id,
and on a stall the state of every rank. Each new connection pays a key
exchange and a login: measured on the lab, 0.37-0.76 s per ``ssh HOST true``
at load 8 (OpenSSH 9.2's default post-quantum key exchange is most of the
client's CPU, docs/performance-history.md), against 0.03-0.06 s for a call on a
shared connection. With these options the first call opens a background
master connection (its own session: a Ctrl-C in the terminal does not reach
it) and every later call of the job rides on it.

- ``ControlPath`` is a socket in a private folder made per job (mode 0700:
  the socket lets whoever can open it run commands as the user on that
  host), under ``/tmp`` because macOS limits a socket path to 104 bytes and
  its ``$TMPDIR`` is long; ``%C`` is a hash of the host, port and user.
- ``ServerAliveInterval``/``CountMax`` are the master's: a host that stops
  answering ends the master within ~15 s, and with it every session on it
  (each ends with ssh's code 255, as a lost connection did before).
- ``ControlPersist`` keeps an idle master this long after its last session;
  ``close`` ends it at once when the job is over. A master left by a killed
  mlxcluster ends by itself after that time.

A master refuses sessions past sshd's ``MaxSessions`` (default 10), so a job
with more ranks than ``MAX_SHARED_RANKS`` on one host does not share.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

PERSIST_S = 30
MAX_SHARED_RANKS = 6  # sessions per host: its ranks, and our sweep and stall calls beside them
CLOSE_TIMEOUT_S = 5.0
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
CONTROL_PATH_OPTION = "ControlPath="


def open_folder() -> str:
    """A new private folder for a job's sockets (short path, mode 0700),
    named after this process (``/tmp/mlxc-PID-XXXXXXXX``): whose it is shows."""
    return tempfile.mkdtemp(prefix=f"mlxc-{os.getpid()}-",
                            dir="/tmp" if os.path.isdir("/tmp") else None)


def share_options(folder: str) -> tuple[str, ...]:
    """The ssh options that make every call of a job share one connection per host."""
    return ("-o", "ControlMaster=auto", "-o", f"{CONTROL_PATH_OPTION}{folder}/%C",
            "-o", f"ControlPersist={PERSIST_S}",
            "-o", f"ServerAliveInterval={KEEPALIVE_INTERVAL_S}",
            "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}")


def shared_in(options: Sequence[str]) -> tuple[str, ...]:
    """The sharing options among ``options`` (a host's ssh options), for the
    launchers' ssh; empty when the host does not share."""
    options = list(options)
    for i, option in enumerate(options[:-1]):
        if option == "-o" and options[i + 1].startswith(CONTROL_PATH_OPTION):
            return share_options(options[i + 1][len(CONTROL_PATH_OPTION):].rsplit("/", 1)[0])
    return ()


def without_sharing(options: Sequence[str]) -> tuple[str, ...]:
    """A host's ssh options with the sharing ones taken out: for a call that
    must have a connection of its own (a port forward lives as long as its
    ssh process only when that process is not a master's client)."""
    sharing = shared_in(options)
    if not sharing:
        return tuple(options)
    options, kept, i = list(options), [], 0
    while i < len(options):
        if options[i] == "-o" and i + 1 < len(options) and options[i + 1] in sharing[1::2]:
            i += 2
            continue
        kept.append(options[i])
        i += 1
    return tuple(kept)


def close(folder: str, env: dict[str, str] | None = None) -> None:
    """End every master connection whose socket is in ``folder`` (none when
    no call was made: nothing is run then), and remove the folder. The
    masters are asked all at once, so closing costs one local round trip
    however many hosts the job had (docs/performance-runs.md, run over bare
    mlx.launch)."""
    try:
        sockets = sorted(os.listdir(folder))
    except OSError:
        sockets = []

    def ask_to_exit(socket: str) -> None:
        # With the socket's own path as ControlPath the host name is only a
        # placeholder: -O exit talks to the local master and connects nowhere.
        argv = ["ssh", "-o", f"{CONTROL_PATH_OPTION}{os.path.join(folder, socket)}", "-O",
                "exit", "mlxcluster-master"]
        try:  # a local socket: answered at once, or the master is gone
            subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=CLOSE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass

    try:
        if sockets:
            with ThreadPoolExecutor(max_workers=min(len(sockets), 16)) as pool:
                list(pool.map(ask_to_exit, sockets))
    finally:  # the folder goes whatever happened (a master left ends after PERSIST_S idle)
        shutil.rmtree(folder, ignore_errors=True)
