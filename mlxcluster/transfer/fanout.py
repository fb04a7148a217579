"""A folder one host has, taken by other hosts straight from it, over the
hosts' own link (their data IPs: Thunderbolt between Macs), not through
this machine's.

The machine you type on is usually the one on Wi-Fi or 1 GbE; the Macs are
linked to each other by Thunderbolt. Sending a model to N hosts from here
crosses this machine's link N times; with the fan-out it crosses it once
(launch/sync.py sends the first host its copy), then the others take theirs
from that host at the speed of the links between the Macs.

``offering`` starts the agent's ``offer`` on the host that has the folder
(over ssh, as every call): it listens on that host's data IP, at a port it
picks, for connections that bring a random token, and gives each file from
the byte asked. It ends when its ssh session ends (the ``with`` block), or
after OFFER_S at the latest. ``take`` runs the agent's ``take`` on a host
that lacks the folder: it connects to the offer and receives as a send from
here is received (each file from where a cut copy stopped, verified by
sha256, renamed into place). No host needs ssh to another: only the data
IP's TCP, which the ring backend needs anyway.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from mlxcluster.transfer.link import ProcessLink, TransferError
from mlxcluster.transfer.manifest import Manifest
from mlxcluster.transfer.send import HostCopy, Transferred, agent_command, last_line

OFFER_S = 6 * 3600.0  # an offer never outlives this, whatever happens here
START_S = 60.0  # the offer says its port within this, or is given up
# A take says its progress at least every few seconds while bytes come (agent.Counted);
# none for this long (no byte from the offering host, or the take's ssh gone quiet) ends it.
TAKE_QUIET_S = 120.0


@contextmanager
def offering(link: ProcessLink, manifest: Manifest, copy: HostCopy, ip: str) -> Iterator[tuple[str, str]]:
    """The folder ``copy`` holds, offered on ``ip`` by its host while the
    block runs: yields (``ip:port``, the token). TransferError when the
    offer does not start."""
    token = secrets.token_hex(16)
    spec = replace(manifest, folder=copy.folder or manifest.folder).spec(
        bind=ip, token=token, seconds=OFFER_S)
    proc = subprocess.Popen(link.argv(agent_command(link.python, "offer", spec)), env=link.env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = _first_line(proc, START_S)
        try:
            port = int(json.loads(port)["port"])
        except (ValueError, KeyError, TypeError):
            said = last_line(proc.stderr.read().decode(errors="replace")) if proc.poll() is not None else ""
            raise TransferError(f"{link.name} could not offer {manifest.folder} on {ip}: "
                                f"{said or port or 'no answer'}") from None
        yield f"{ip}:{port}", token
    finally:
        _close(proc)


def take(link: ProcessLink, manifest: Manifest, copy: HostCopy, at: str, token: str,
         source: str, on_progress: Callable[[int], None] = lambda done: None) -> Transferred:
    """What ``copy``'s host lacks, taken from the offer at ``at`` (``source``
    names the host offering), ``on_progress`` told the bytes received so far
    as the host says them; TransferError when it fails or goes quiet for
    TAKE_QUIET_S (what arrived is kept: the next pull resumes it)."""
    files = copy.lacking(manifest)
    there = replace(manifest, folder=copy.folder or manifest.folder)
    spec = there.spec(files, at=at, token=token)
    for f in spec["files"]:
        if copy.already_there(next(d for d in files if d.name == f["name"])):
            f["from"] = copy.partial[f["name"]]
    need = copy.need(manifest)
    started = time.monotonic()

    def follow(stream) -> None:
        for line in iter(stream.readline, b""):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                on_progress(int(json.loads(line)["progress"]))

    result, _ = link.read(agent_command(link.python, "take", spec), follow, timeout=TAKE_QUIET_S)
    if result.exit_status != 0:
        raise TransferError(f"{link.name} could not take {manifest.folder} from {source} ({at}): "
                            f"{last_line(result.stderr) or f'exit code {result.exit_status}'}")
    return Transferred(link.name, tuple(f.name for f in files), need, time.monotonic() - started,
                       f"the hosts' link from {source} ({at.rpartition(':')[0]})",
                       sum(copy.already_there(f) for f in files))


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0].decode(errors="replace").strip() if got else ""


def _close(proc: subprocess.Popen) -> None:
    """End the offer: its stdin closed (the agent stops at that), then its
    ssh waited for, killed if it lingers."""
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
