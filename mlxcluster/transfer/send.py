"""Files sent to a host, checked there by sha256 before they are put in place.

``check`` asks the host's agent, in one call, what its copy of a manifest's
folder holds and how much room it has; ``send`` sends what it lacks: with
rsync when both ends have it and the link is ssh (into a staging folder
``.incoming.rsync.<random>``, then verified and renamed by the agent), else
as one stream of bytes into the agent, which hashes as it receives. The
host renames a file into place only once its sha256 is the manifest's: a
send cut off half way is never taken for whole. Both return one result
type, ``Transferred``, as fetching does (transfer/fetch.py).

The stream resumes: what a cut stream delivered stays on the host (the
agent's PARTIAL_DIR), its check says how much, and the next stream sends
each file from there. A host holding such a part is sent by stream, rsync
or not; a caller sending large files (a model: launch/sync.py) asks for the
stream from the start (``resumable``), since rsync's staging folder is
dropped with a cut send.
"""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from mlxcluster.ssh.openssh import SSH_FAILED
from mlxcluster.transfer.link import HostUnreachable, Link, NoAnswer, ProcessLink, TransferError
from mlxcluster.transfer.manifest import DataFile, Manifest
from mlxcluster.transfer.rsync import rsync_files

SUMMARY_FILES = 3  # files a copy's summary names one by one

CHECK_TIMEOUT_S = 600.0  # hashing a host's copy reads all of it (a few GB: tens of seconds)
MARK_TIMEOUT_S = 60.0  # a token written or removed: a mkdir and a file
MKDIR_TIMEOUT_S = 30.0
INCOMING_RSYNC = ".incoming.rsync"
AGENT_SOURCE = (Path(__file__).parent / "agent.py").read_text

Progress = Callable[[int], None]  # bytes sent so far, to this host


@dataclass(frozen=True)
class HostCopy:
    """One host's copy, as its check answered."""

    host: Link
    status: dict[str, str]  # file name -> ok | missing | size | different
    free: int
    rsync: bool
    folder: str = ""  # the folder as the host resolved it (~ expanded there)
    sees: tuple[str, ...] = ()  # the other hosts' tokens found in it (one folder with theirs)
    same_as_here: bool = False  # this machine's token found in it: the folder here
    partial: dict[str, int] = field(default_factory=dict)  # name -> bytes a cut send left there

    def lacking(self, manifest: Manifest) -> tuple[DataFile, ...]:
        return tuple(f for f in manifest.files if self.status.get(f.name) != "ok")

    def already_there(self, f: DataFile) -> int:
        """Bytes of ``f`` a cut send left on the host: the next send starts there."""
        return min(self.partial.get(f.name, 0), f.bytes)

    def need(self, manifest: Manifest) -> int:
        """The bytes still to cross to this host: what it lacks, less what cut sends left."""
        return sum(f.bytes - self.already_there(f) for f in self.lacking(manifest))

    def summary(self, manifest: Manifest) -> str:
        """'missing' / 'train.bin different' / 'whole'; past SUMMARY_FILES
        files lacking, the first of them and how many more ('a.bin missing,
        b.bin missing and 9 more of 15 files lacking': a model's 30 shards
        are not one line each)."""
        bad = self.lacking(manifest)
        if not bad:
            return "whole"
        if all(self.status.get(f.name, "missing") == "missing" for f in manifest.files):
            return "missing"
        said = [f"{f.name} {self.status.get(f.name, 'missing')}" for f in bad]
        if len(said) > SUMMARY_FILES:
            return (f"{', '.join(said[:SUMMARY_FILES - 1])} and {len(said) - SUMMARY_FILES + 1} more "
                    f"of {len(manifest.files)} files lacking")
        return ", ".join(said)


@dataclass(frozen=True)
class Transferred:
    """What one transfer moved, to or from one host."""

    host: str
    names: tuple[str, ...]
    bytes: int
    seconds: float
    via: str  # "rsync" or "ssh stream"
    resumed: int = 0  # bytes a cut send had left there, not sent again

    @property
    def rate(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else float("inf")


def agent_command(python: str, op: str, spec: dict) -> str:
    """The shell words that run the agent's ``op`` on a host (everything quoted)."""
    return shlex.join([python, "-S", "-c", AGENT_SOURCE(), op, json.dumps(spec)])


def check(link: Link, manifest: Manifest, *, what: str = "", way_round: str = "",
          timeout: float = CHECK_TIMEOUT_S, tokens: Sequence[str] = (),
          here: str | None = None) -> HostCopy:
    """Ask the host what its copy of ``manifest``'s folder holds, and which
    of ``tokens`` (other hosts') and ``here`` (this machine's) it sees there.
    ``what`` names the folder in messages (``--data``); ``way_round`` ends
    their hints. Raises TransferError; HostUnreachable (exit 255, as ssh's)
    when ssh cannot reach the host."""
    named = f"{what} {manifest.folder}".strip()
    spec = manifest.spec(tokens=list(tokens), **({"here": here} if here else {}))
    try:
        result = link.run(agent_command(link.python, "check", spec), timeout=timeout)
    except NoAnswer:
        raise TransferError(f"{link.name} did not answer within {timeout:.0f} s whether it has "
                            f"{named}", "check the host (asleep? its disk?)" + way_round) from None
    said = last_line(result.stderr) or f"exit code {result.exit_status}"
    if result.exit_status == SSH_FAILED:
        raise HostUnreachable(f"the ssh connection to {link.name} failed: {said}",
                              "bring the host back (mlxcluster doctor names what is wrong), or "
                              "leave it out of the inventory")
    if result.exit_status != 0:
        raise TransferError(f"could not check {named} on {link.name}: {said}",
                            f"the host must run {link.python}" + way_round)
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    return HostCopy(link, answer["files"], int(answer["free"]), bool(answer["rsync"]),
                    answer.get("dir") or manifest.folder, tuple(answer.get("sees", ())),
                    bool(answer.get("same_as_here")),
                    {name: int(n) for name, n in (answer.get("partial") or {}).items()})


def mark(link: Link, folder: str, token: str, op: str = "mark") -> bool:
    """``token`` written in (``op`` "mark") or removed from ("unmark") the
    host's ``folder``; False when that failed."""
    try:
        result = link.run(agent_command(link.python, op, {"dir": folder, "token": token}),
                          timeout=MARK_TIMEOUT_S)
    except TransferError:
        return False
    return result.exit_status == 0


def send(manifest: Manifest, copy: HostCopy, progress: Progress, *,
         use_rsync: bool | None = None, resumable: bool = False,
         timeout: float = CHECK_TIMEOUT_S, way_round: str = "") -> Transferred:
    """Send what ``copy`` lacks of ``manifest`` into the folder as its host
    named it, over the link it was checked by; the host verifies each file
    before renaming it into place.
    rsync when both ends have it and the link is ssh (``use_rsync`` None),
    unless the send is to be ``resumable`` or the host holds part of a file
    from a cut send: then the stream, each file from where the host's part
    ends. ``timeout``: how long the host may take to verify and install once
    the bytes are there. Raises TransferError."""
    link, files = copy.host, copy.lacking(manifest)
    manifest = replace(manifest, folder=copy.folder or manifest.folder)  # as the host names it
    resumed = {f.name: copy.already_there(f) for f in files if copy.already_there(f)}
    if use_rsync is None:
        use_rsync = copy.rsync and can_rsync(link) and not resumable
    use_rsync = use_rsync and not resumed  # rsync would send those files whole again
    start = time.monotonic()
    try:
        if use_rsync:
            _send_rsync(link, manifest, files, progress, timeout)
        else:
            _send_stream(link, manifest, files, resumed, progress, timeout)
    except TransferError as err:
        kept = "" if use_rsync else ", and the next send resumes what arrived"
        raise TransferError(f"sending {manifest.folder} to {link.name} failed: {err.message}",
                            "check the host's disk and ssh; nothing half-sent is used (the next "
                            f"check finds what is missing{kept})" + way_round) from None
    return Transferred(link.name, tuple(f.name for f in files),
                       sum(f.bytes - resumed.get(f.name, 0) for f in files),
                       time.monotonic() - start, "rsync" if use_rsync else "ssh stream",
                       sum(resumed.values()))


def can_rsync(link: Link) -> bool:
    """rsync here and an ssh the link reaches the host by (this machine needs none)."""
    return isinstance(link, ProcessLink) and bool(link.ssh) and shutil.which("rsync") is not None


def _send_stream(link: Link, manifest: Manifest, files: Sequence[DataFile],
                 resumed: dict[str, int], progress: Progress, timeout: float) -> None:
    spec = manifest.spec(files, resumable=True)
    for f in spec["files"]:
        if resumed.get(f["name"]):
            f["from"] = resumed[f["name"]]
    with FileChain([(manifest.path_here(f), resumed.get(f.name, 0)) for f in files],
                   progress) as stream:
        result = link.run(agent_command(link.python, "receive", spec), stdin=stream, timeout=timeout)
    _require_ok(result)


def _send_rsync(link: ProcessLink, manifest: Manifest, files: Sequence[DataFile],
                progress: Progress, timeout: float) -> None:
    # One staging folder per send: two senders of one folder at once (jobs
    # launched side by side onto hosts that share a home: the code cache)
    # each install their own verified files, never each other's half.
    incoming = f"{manifest.folder}/{INCOMING_RSYNC}.{secrets.token_hex(6)}"
    _require_ok(link.run(f"mkdir -p {shlex.quote(incoming)}", timeout=MKDIR_TIMEOUT_S))
    sources = [f"{manifest.path_here(f).removesuffix('/' + f.name)}/./{f.name}" for f in files]
    _require_ok(rsync_files(link, sources, incoming, progress, timeout))
    _require_ok(link.run(agent_command(link.python, "install",
                                       manifest.spec(files, **{"from": incoming})),
                         timeout=timeout))


def _require_ok(result) -> None:
    if result.exit_status != 0:
        raise TransferError(last_line(result.stderr) or f"exit code {result.exit_status}")


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class FileChain:
    """Files read one after another as one binary stream (the agent's
    stdin), each from its offset, ``progress`` told the bytes read so far."""

    def __init__(self, paths: Sequence[tuple[str, int]], progress: Progress):
        self.paths, self.progress, self.file, self.sent = list(paths), progress, None, 0

    def read(self, n: int = -1) -> bytes:
        while self.paths or self.file:
            if self.file is None:
                path, offset = self.paths.pop(0)
                self.file = open(path, "rb")
                self.file.seek(offset)
            data = self.file.read(n)
            if data:
                self.sent += len(data)
                self.progress(self.sent)
                return data
            self.file.close()
            self.file = None
        return b""

    def __enter__(self) -> FileChain:
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()
