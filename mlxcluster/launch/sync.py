"""The trainer's ``--data DIR`` (and `run`'s script) on every host, as on this machine.

Macs have their own disks: a token folder prepared here is not on the other
hosts. Before a launch, ``check_copies`` asks every remote host, in one ssh
call each, what its copy of DIR holds, by the sizes and sha256 recorded in
DIR/meta.json (``reference_train.prepare`` writes them), and how much space
is free there. ``check_space`` refuses, before anything is sent, a host that
cannot hold what it lacks. ``send`` copies what a host lacks or holds
differently over the job's shared ssh connection: with rsync when both ends
have it, else as one stream of bytes into a python on the host; the host
verifies every file's sha256 before renaming it into place
(mlxcluster.launch.sync_agent, which runs there).

This machine's copy is the source. Its files are hashed here first: a
damaged source is refused, not spread.

Storage several of them see (a NAS, a network home) is found by a token
each in the folder (``mark_here``, ``mark_host``, the check looking for the
others'): a host that sees this machine's folder, or the folder of a host
before it, is sent nothing (docs/training.md, "Shared storage").

``sync_data``, ``sync_model`` and ``sync_script`` (and launch/code.py's
``sync_code``, for what ranks import of this project) do all of it for a job's
remote hosts (check every copy, check the room, send each host what it
lacks), reporting every step as an event (jobs/events.py).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from mlxcluster.errors import InputError, MlxclusterError
from mlxcluster.jobs.cleanup import SSH_LOST
from mlxcluster.jobs.events import Note, OnEvent, SendEnded, Sending, SendProgress
from mlxcluster.jobs.hosts import (
    RankHost,
    for_each_host,
    host_argv,
    remote_hosts,
    run_script,
    ssh_argv,
)
from mlxcluster.jobs.job import Job
from reference_train.data import load_meta
from reference_train.errors import DataError
from reference_train.files import file_sha256
from reference_train.storage import STORAGE_DIR, TOKEN_BYTES, linked_groups

CHECK_TIMEOUT_S = 600.0  # hashing a host's copy reads all of it (a few GB: tens of seconds)
MARK_TIMEOUT_S = 60.0  # a token written or removed: a mkdir and a file, over ssh
STALL_S = 60.0  # a transfer that moves no byte for this long is given up
HEADROOM = 1.05  # a host must have room for what it lacks plus 5%
INCOMING_RSYNC = ".incoming.rsync"
REMOTE_SOURCE = (Path(__file__).parent / "sync_agent.py").read_text

Progress = Callable[[int], None]  # bytes sent so far, to this host


class DataSyncError(MlxclusterError):
    """A host's copy of the data could not be checked or sent."""


class HostUnreachable(DataSyncError):
    """ssh could not reach the host: exit 255, as the launchers' own ssh failure."""

    exit_code = SSH_LOST


@dataclass(frozen=True)
class DataFile:
    name: str
    bytes: int
    sha256: str

    def spec(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True)
class Manifest:
    """What a whole copy of the data folder holds (meta.json last)."""

    folder: str  # absolute: the ranks open the same path on every host (or ~/...: each host's own)
    files: tuple[DataFile, ...]
    source: str | None = None  # the folder here, when it is not ``folder`` (launch/code.py)

    @property
    def here(self) -> str:
        """The folder on this machine the files are read from."""
        return self.source or self.folder

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def spec(self, files: Sequence[DataFile] | None = None, **more) -> str:
        return json.dumps({"dir": self.folder,
                           "files": [f.spec() for f in (self.files if files is None else files)],
                           **more})


@dataclass(frozen=True)
class HostCopy:
    """One host's copy, as its check answered."""

    host: RankHost
    status: dict[str, str]  # file name -> ok | missing | size | different
    free: int
    rsync: bool
    folder: str = ""  # the folder as the host resolved it (~ expanded there)
    sees: tuple[str, ...] = ()  # the other hosts' tokens found in it (one folder with theirs)
    same_as_here: bool = False  # this machine's token found in it: the folder here

    def lacking(self, manifest: Manifest) -> tuple[DataFile, ...]:
        return tuple(f for f in manifest.files if self.status.get(f.name) != "ok")

    def summary(self, manifest: Manifest) -> str:
        """'missing' / 'train.bin different' / 'whole'."""
        bad = self.lacking(manifest)
        if not bad:
            return "whole"
        if all(self.status.get(f.name, "missing") == "missing" for f in manifest.files):
            return "missing"
        return ", ".join(f"{f.name} {self.status.get(f.name, 'missing')}" for f in bad)


@dataclass(frozen=True)
class Sent:
    host: str
    bytes: int
    seconds: float
    via: str  # "rsync" or "ssh stream"

    @property
    def rate(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else float("inf")


# ---------------------------------------------------------------- this machine's copy


def read_manifest(folder: str | Path) -> Manifest:
    """The data folder here, every file hashed and checked against meta.json
    (older folders without recorded hashes are hashed as they are)."""
    path = Path(folder).resolve()
    try:
        meta = load_meta(path)
    except (DataError, OSError, ValueError) as err:
        raise InputError(f"--data {folder}: {err}",
                         "prepare it here with python -m reference_train.prepare --out DIR, "
                         "or pass --no-sync-data when every host already has its own copy") from None
    files = []
    for split in meta["splits"].values():
        file = path / split["file"]
        if not file.is_file():
            raise InputError(f"--data {folder}: {split['file']} is missing here",
                             "prepare the folder again (python -m reference_train.prepare)")
        digest, size = file_sha256(file), file.stat().st_size
        if split.get("sha256") not in (None, digest) or split.get("bytes") not in (None, size):
            raise InputError(f"--data {folder}: {split['file']} here does not match its meta.json "
                             f"(sha256 {digest[:12]}, recorded {split['sha256'][:12]}): the copy "
                             "here is damaged and would not be sent",
                             "prepare the folder again (python -m reference_train.prepare)")
        files.append(DataFile(split["file"], size, digest))
    for file in sorted((path / "tokenizer").rglob("*")):  # an exported model needs them (prepare)
        if file.is_file():
            files.append(DataFile(file.relative_to(path).as_posix(), file.stat().st_size,
                                  file_sha256(file)))
    meta_file = path / "meta.json"
    files.append(DataFile("meta.json", meta_file.stat().st_size, file_sha256(meta_file)))
    return Manifest(str(path), tuple(files))


def folder_manifest(folder: str | Path) -> Manifest:
    """Every file under ``folder`` (a model folder for --init_from), hashed here
    (but dot files and folders: the storage tokens of a run beside it, caches)."""
    path = Path(folder).resolve()
    if not path.is_dir():
        raise InputError(f"no such folder here: {folder}",
                         "give the path of the folder on this machine (it is sent to every host)")
    return Manifest(str(path), tuple(
        DataFile(f.relative_to(path).as_posix(), f.stat().st_size, file_sha256(f))
        for f in sorted(path.rglob("*"))
        if f.is_file() and not any(part.startswith(".") for part in f.relative_to(path).parts)))


def file_manifest(path: str | Path) -> Manifest:
    """One file (a `run` script) as a manifest of its folder."""
    path = Path(path).resolve()
    return Manifest(str(path.parent), (DataFile(path.name, path.stat().st_size,
                                                file_sha256(path)),))


# ---------------------------------------------------------------- the hosts' copies


def remote_command(python: str, what: str, spec: str) -> str:
    """The shell words that run sync_agent on a host (everything quoted)."""
    return shlex.join([python, "-S", "-c", REMOTE_SOURCE(), what, spec])


def check_copy(manifest: Manifest, host: RankHost, env: dict[str, str] | None = None,
               timeout: float = CHECK_TIMEOUT_S, what: str = "--data",
               tokens: Sequence[str] = (), here: str | None = None) -> HostCopy:
    """Ask ``host`` what its copy holds, and which of ``tokens`` (the other
    hosts') and ``here`` (this machine's) it sees there (DataSyncError when it
    cannot answer; HostUnreachable, exit 255 as ssh's, when ssh cannot reach it)."""
    command = remote_command(host.python, "check",
                             manifest.spec(tokens=list(tokens), **({"here": here} if here else {})))
    try:
        proc = subprocess.run(host_argv(host, command), capture_output=True, text=True,
                              timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise DataSyncError(f"{host.name} did not answer within {timeout:.0f} s whether it has "
                            f"{what} {manifest.folder}",
                            "check the host (asleep? its disk?)" + opt_out(what)) from None
    said = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    if proc.returncode == SSH_LOST:
        raise HostUnreachable(f"the ssh connection to {host.name} failed: {said}",
                              "bring the host back (mlxcluster doctor names what is wrong), or "
                              "leave it out of the inventory")
    if proc.returncode != 0:
        raise DataSyncError(f"could not check {what} {manifest.folder} on {host.name}: {said}",
                            "the host must run the job's python" + opt_out(what))
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    return HostCopy(host, answer["files"], int(answer["free"]), bool(answer["rsync"]),
                    answer.get("dir") or manifest.folder, tuple(answer.get("sees", ())),
                    bool(answer.get("same_as_here")))


# ---------------------------------------------------------------- one folder for several

# A host that sees this machine's folder (a NAS mounted here and there), or the
# folder of a host already sent to, is sent nothing: a token each, as the
# trainer finds which hosts share --out (reference_train/storage.py).


def mark_here(manifest: Manifest) -> str | None:
    """This machine's token in the folder the files are read from, when the hosts
    are asked for that same path (not the code's cache); None when it cannot be
    written (a read-only folder: the hosts are then compared by their hashes)."""
    if manifest.source:
        return None
    token = secrets.token_hex(TOKEN_BYTES)
    try:
        (Path(manifest.folder) / STORAGE_DIR).mkdir(exist_ok=True)
        (Path(manifest.folder) / STORAGE_DIR / token).touch()
    except OSError:
        return None
    return token


def unmark_here(manifest: Manifest, token: str | None) -> None:
    if token:
        (Path(manifest.folder) / STORAGE_DIR / token).unlink(missing_ok=True)
        try:
            (Path(manifest.folder) / STORAGE_DIR).rmdir()
        except OSError:
            pass  # a host's token is still there, or another run's


def mark_host(manifest: Manifest, host: RankHost, what: str, token: str,
              env: dict[str, str] | None = None) -> bool:
    """``token`` written in the host's folder (``what``: mark or unmark); False
    when that failed (the host is then sent to as one on its own: the check
    and the send say what is wrong there)."""
    spec = json.dumps({"dir": manifest.folder, "token": token})
    try:
        proc = subprocess.run(host_argv(host, remote_command(host.python, what, spec)),
                              capture_output=True, text=True, timeout=MARK_TIMEOUT_S, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def shared_with(copies: Sequence[HostCopy], tokens: dict[str, str]) -> dict[str, str]:
    """Host name -> the first host (in order) that sees its folder, for every
    host whose folder an earlier one sees (found by either side's token)."""
    names = [c.host.name for c in copies]
    sees = [[tokens.get(other, "") in c.sees for other in names] for c in copies]
    group = linked_groups(sees, list(range(len(copies))))
    return {names[i]: names[g] for i, g in group.items() if g != i}


def check_space(manifest: Manifest, copies: Sequence[HostCopy], what: str = "data") -> None:
    """InputError naming every host that cannot hold what it lacks (with the figures)."""
    short = []
    for copy in copies:
        need = sum(f.bytes for f in copy.lacking(manifest))
        if need and copy.free < need * HEADROOM:
            short.append(f"{copy.host.name} needs {human_bytes(need)} for {manifest.folder} and "
                         f"has {human_bytes(copy.free)} free")
    if short:
        raise InputError(f"not enough free space for the {what}: " + "; ".join(short) +
                         " (nothing was sent)",
                         "free space on that host" + ("" if manifest.source else
                                                      ", or give --data a folder on a larger disk "
                                                      "(the same path on every host)"))


# ---------------------------------------------------------------- a job's hosts


def sync_data(job: Job, folder: str, env: dict[str, str], on_event: OnEvent) -> None:
    """The trainer's --data ``folder`` on every remote host of ``job``: what
    is lacking or different sent, each file verified on arrival. Raises
    before anything is sent when a host cannot be asked or has not the room."""
    if remote_hosts(job.hosts):
        send_where_needed(job, read_manifest(folder), "data", env, on_event)


def sync_model(job: Job, folder: str, env: dict[str, str], on_event: OnEvent) -> None:
    """The trainer's --init_from folder on every remote host, as here."""
    if remote_hosts(job.hosts):
        send_where_needed(job, folder_manifest(folder), "model", env, on_event)


def sync_script(job: Job, script: str, env: dict[str, str], on_event: OnEvent) -> None:
    """`run`'s script file on every remote host, at its absolute path here."""
    if remote_hosts(job.hosts):
        send_where_needed(job, file_manifest(script), "script", env, on_event)


def send_where_needed(job: Job, manifest: Manifest, what: str, env: dict[str, str],
                      on_event: OnEvent) -> list[HostCopy]:
    """Every remote host's copy checked (in parallel), the room checked on
    all of them, then each host sent what it lacks, in turn. A host that
    sees this machine's folder, or the same folder as a host before it (a
    token each: ``mark_here``, ``mark_host``), is sent nothing. Returns the
    copies as checked (each with its folder as its host resolved it)."""
    flag = {"data": "--data", "model": "--init_from"}.get(what, "the " + what)
    hosts = remote_hosts(job.hosts)
    here = mark_here(manifest)
    tokens = {h.name: secrets.token_hex(TOKEN_BYTES) for h in hosts} if len(hosts) > 1 else {}
    try:
        if tokens:
            marked = for_each_host(hosts, lambda h: mark_host(manifest, h, "mark", tokens[h.name], env))
            tokens = {h.name: t for h, t, ok in zip(hosts, tokens.values(), marked, strict=True) if ok}
        copies = for_each_host(hosts, lambda h: check_copy(
            manifest, h, env, what=flag, here=here,
            tokens=[t for name, t in tokens.items() if name != h.name]))
    finally:
        for_each_host([h for h in hosts if h.name in tokens],
                      lambda h: mark_host(manifest, h, "unmark", tokens[h.name], env))
        unmark_here(manifest, here)
    same = shared_with(copies, tokens)
    check_space(manifest, [c for c in copies if c.host.name not in same], what)
    size = human_bytes(manifest.total_bytes)
    shown = manifest.folder if len(manifest.files) > 1 else \
        f"{manifest.folder}/{manifest.files[0].name}"
    done: dict[str, str] = {}  # host -> what became of its folder: whole there, or sent
    for copy in copies:
        name = copy.host.name
        if copy.same_as_here:
            on_event(Note(f"{what}: {name} sees {shown} here, one folder with this machine's "
                          "(shared storage): nothing sent"))
            continue
        if name in same:
            on_event(Note(f"{what}: {name} sees the same {shown} as {same[name]}, one folder "
                          f"(shared storage): {done.get(same[name], 'checked there')}, nothing "
                          "sent again"))
            continue
        state = copy.summary(manifest)
        if state == "whole":
            on_event(Note(f"{what}: {copy.host.name} has {shown} ({size}, sha256 checked)"))
            done[name] = "whole there"
            continue
        lacking = copy.lacking(manifest)
        need = sum(f.bytes for f in lacking)
        on_event(Note(f"{what}: {copy.host.name}: {shown} {state}: sending "
                      f"{len(lacking)} file(s), {human_bytes(need)}"))
        name = copy.host.name
        on_event(Sending(name, need))
        try:
            sent = send(manifest, copy, lambda n, name=name: on_event(SendProgress(name, n)), env=env)
        finally:
            on_event(SendEnded(name))
        on_event(Note(f"{what}: {name}: sent {human_bytes(sent.bytes)} in {sent.seconds:.1f} s "
                      f"({human_bytes(sent.rate)}/s) by {sent.via}, sha256 verified there"))
        done[name] = "sent there"
    return copies


# ---------------------------------------------------------------- sending


def send(manifest: Manifest, copy: HostCopy, progress: Progress, *,
         env: dict[str, str] | None = None, use_rsync: bool | None = None) -> Sent:
    """Send what ``copy``'s host lacks; the host verifies it before
    renaming it into place. rsync when both ends have it (``use_rsync``
    None), else a stream of bytes over ssh."""
    files = copy.lacking(manifest)
    manifest = replace(manifest, folder=copy.folder or manifest.folder)  # as the host names it
    if use_rsync is None:
        use_rsync = copy.rsync and shutil.which("rsync") is not None
    start = time.monotonic()
    if use_rsync:
        sent = _send_rsync(manifest, copy.host, files, progress, env)
    else:
        sent = _send_stream(manifest, copy.host, files, progress, env)
    return Sent(copy.host.name, sent, time.monotonic() - start, "rsync" if use_rsync else "ssh stream")


def _send_stream(manifest: Manifest, host: RankHost, files: Sequence[DataFile], progress: Progress,
                 env: dict[str, str] | None) -> int:
    argv = host_argv(host, remote_command(host.python, "receive", manifest.spec(files)))
    with tempfile.TemporaryFile() as said:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=said, env=env)
        sent = 0
        with Watchdog(proc) as watchdog:
            try:
                for f in files:
                    with open(Path(manifest.here) / f.name, "rb") as source:
                        for chunk in iter(lambda: source.read(1 << 20), b""):
                            proc.stdin.write(chunk)
                            sent += len(chunk)
                            watchdog.moved()
                            progress(sent)
                proc.stdin.close()
            except BrokenPipeError:
                pass  # the host stopped reading: its own message says why
            proc.wait()  # the host verifies and renames: the watchdog bounds it
        if proc.returncode != 0:
            said.seek(0)
            raise _failed(host, manifest, watchdog.why or said.read().decode(errors="replace"))
    return sent


class Watchdog:
    """Kills a transfer that moves no byte for ``STALL_S`` (or, once the
    bytes are out, does not end within ``CHECK_TIMEOUT_S``)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.last, self.why = proc, time.monotonic(), ""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def moved(self) -> None:
        self.last = time.monotonic()

    def _watch(self) -> None:
        while not self._done.wait(1.0):
            idle = time.monotonic() - self.last
            if idle > STALL_S + CHECK_TIMEOUT_S or (idle > STALL_S and self.proc.stdin
                                                    and not self.proc.stdin.closed):
                self.why = f"no progress for {idle:.0f} s: stopped"
                self.proc.kill()
                return

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


PROGRESS_RE = re.compile(rb"^\s*([\d,.]+)\s+\d+%")  # rsync --progress: '  1,234,567  45% ...'


def _send_rsync(manifest: Manifest, host: RankHost, files: Sequence[DataFile], progress: Progress,
                env: dict[str, str] | None) -> int:
    # One staging folder per send: two senders of one folder at once (jobs
    # launched side by side onto hosts that share a home: the code cache)
    # each install their own verified files, never each other's half.
    incoming = f"{manifest.folder}/{INCOMING_RSYNC}.{secrets.token_hex(6)}"
    made = run_script(host, f"mkdir -p {shlex.quote(incoming)}", timeout=30, env=env)
    if not made.ok:
        raise _failed(host, manifest, made.error)
    ssh = shlex.join(ssh_argv(host, "")[:-3])  # ssh and its options, without '--', target, command
    # --relative with 'DIR/./NAME': each file lands at incoming/NAME (tokenizer/... included).
    argv = ["rsync", "--partial", "--times", "--progress", "--relative", f"--timeout={STALL_S:.0f}",
            "-e", ssh, *(f"{manifest.here}/./{f.name}" for f in files),
            f"{host.ssh_target}:{incoming}/"]
    with tempfile.TemporaryFile() as said:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=said, env=env)
        done, current = 0, 0
        with Watchdog(proc) as watchdog:
            for piece in _pieces(proc.stdout):
                watchdog.moved()
                found = PROGRESS_RE.match(piece)
                if found:
                    current = int(found.group(1).replace(b",", b"").replace(b".", b""))
                    progress(done + current)
                elif piece.strip():  # a file's name: the one before it is done
                    done, current = done + current, 0
            proc.wait()
        if proc.returncode != 0:
            said.seek(0)
            raise _failed(host, manifest, watchdog.why or said.read().decode(errors="replace"))
    installed = run_script(host, remote_command(host.python, "install",
                                                manifest.spec(files, **{"from": incoming})),
                           timeout=CHECK_TIMEOUT_S, env=env)
    if not installed.ok:
        raise _failed(host, manifest, installed.error)
    return sum(f.bytes for f in files)


def _pieces(stream) -> Iterator[bytes]:
    """rsync's progress lines, split on both '\\r' and '\\n' as they arrive."""
    pending = b""
    while chunk := stream.read1(4096) if hasattr(stream, "read1") else stream.read(4096):
        pending += chunk
        *whole, pending = re.split(rb"[\r\n]", pending)
        yield from whole
    if pending:
        yield pending


def _failed(host: RankHost, manifest: Manifest, said: str) -> DataSyncError:
    last = [ln for ln in said.strip().splitlines() if ln.strip()]
    # A folder of this machine's (data, model, script) may be copied by hand
    # instead; what ranks import (a ``source`` apart: launch/code.py) may not.
    by_hand = "" if manifest.source else (", or copy it by hand and pass --no-sync-data (train) "
                                          "or --no-sync-script (run)")
    return DataSyncError(f"sending {manifest.folder} to {host.name} failed: "
                         f"{last[-1] if last else 'no message'}",
                         "check the host's disk and ssh; nothing half-sent is used (the next "
                         "launch checks again)" + by_hand)


def opt_out(what: str) -> str:
    """How to go without sending ``what`` (the code ranks import has no way round)."""
    if what == "the code":
        return ""
    return ", or pass " + ("--no-sync-script" if what == "the script" else "--no-sync-data")


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def local_path(folder: str) -> str:
    """The absolute path the ranks get for ``folder`` (relative to here)."""
    return os.path.abspath(folder)
