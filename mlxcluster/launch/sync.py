"""The trainer's ``--data DIR`` (and `run`'s script) on every host, as on this machine.

Macs have their own disks: a token folder prepared here is not on the other
hosts. Before a launch, ``check_copy`` asks every remote host, in one ssh
call each, what its copy of DIR holds, by the sizes and sha256 recorded in
DIR/meta.json (``reference_train.prepare`` writes them), and how much space
is free there. ``check_space`` refuses, before anything is sent, a host that
cannot hold what it lacks. Each host is then sent what it lacks or holds
differently over the job's shared ssh connection, by mlxcluster.transfer
(rsync when both ends have it, else one stream of bytes into the transfer's
agent on the host, which verifies every file's sha256 before renaming it
into place).

This machine's copy is the source. Its files are hashed here first: a
damaged source is refused, not spread.

Storage several of them see (a NAS, a network home) is found by a token
each in the folder (``mark_here``, ``mark_host``, the check looking for the
others'): a host that sees this machine's folder, or the folder of a host
before it, is sent nothing (docs/training-cluster.md, "Shared storage").

``sync_data``, ``sync_model`` and ``sync_script`` (and launch/code.py's
``sync_code``, for what ranks import of this project) do all of it for a job's
remote hosts (check every copy, check the room, send each host what it
lacks), reporting every step as an event (jobs/events.py).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from mlxcluster.errors import InputError
from mlxcluster.jobs.events import Note, OnEvent, SendEnded, Sending, SendProgress
from mlxcluster.jobs.hosts import RankHost, for_each_host, host_link, remote_hosts
from mlxcluster.jobs.job import Job
from mlxcluster.transfer.fanout import offering, take
from mlxcluster.transfer.link import ProcessLink, TransferError
from mlxcluster.transfer.manifest import DataFile, Manifest, file_manifest, folder_manifest
from mlxcluster.transfer.send import CHECK_TIMEOUT_S, HostCopy, check, mark, send
from reference_train.data import load_meta
from reference_train.errors import DataError
from reference_train.storage import STORAGE_DIR, TOKEN_BYTES, linked_groups

HEADROOM = 1.05  # a host must have room for what it lacks plus 5%


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
        found = DataFile.of(file, split["file"])
        if split.get("sha256") not in (None, found.sha256) or split.get("bytes") not in (None, found.bytes):
            raise InputError(f"--data {folder}: {split['file']} here does not match its meta.json "
                             f"(sha256 {found.sha256[:12]}, recorded {split['sha256'][:12]}): the copy "
                             "here is damaged and would not be sent",
                             "prepare the folder again (python -m reference_train.prepare)")
        files.append(found)
    for file in sorted((path / "tokenizer").rglob("*")):  # an exported model needs them (prepare)
        if file.is_file():
            files.append(DataFile.of(file, file.relative_to(path).as_posix()))
    files.append(DataFile.of(path / "meta.json", "meta.json"))
    return Manifest(str(path), tuple(files))


# ---------------------------------------------------------------- the hosts' copies


def check_copy(manifest: Manifest, host: RankHost, env: dict[str, str] | None = None,
               timeout: float = CHECK_TIMEOUT_S, what: str = "--data",
               tokens: Sequence[str] = (), here: str | None = None) -> HostCopy:
    """Ask ``host`` what its copy holds, and which of ``tokens`` (the other
    hosts') and ``here`` (this machine's) it sees there (TransferError when it
    cannot answer; HostUnreachable, exit 255 as ssh's, when ssh cannot reach it)."""
    return check(host_link(host, env), manifest, what=what, way_round=opt_out(what),
                 timeout=timeout, tokens=tokens, here=here)


def check_rest(manifest: Manifest, whole: frozenset[str], host: RankHost,
               env: dict[str, str] | None = None, **asked) -> HostCopy:
    """``check_copy`` of the files of ``manifest`` but ``whole`` (known whole on
    the host in this run: each is hashed there once), those counted ok."""
    rest = replace(manifest, files=tuple(f for f in manifest.files if f.name not in whole))
    copy = check_copy(rest, host, env, **asked)
    return replace(copy, status={**copy.status, **{f.name: "ok" for f in manifest.files
                                                   if f.name in whole}})


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
    return mark(host_link(host, env), manifest.folder, token, what)


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


def sync_model(job: Job, folder: str, env: dict[str, str], on_event: OnEvent, *,
               flag: str = "--init_from", left_out: Mapping[str, frozenset[str]] | None = None) -> None:
    """A model folder on every remote host, as here: the trainer's
    --init_from, or what serve serves (``flag``: how messages name it).
    ``left_out``: host name -> the files it goes without (--pipeline: the
    weight files no stage of its loads); the hosts needing the same files
    are sent them together (fanned out), each group in turn, and a group
    takes the files an earlier group holds too (the config and tokenizer, a
    shard that spans two stages) from a host of that group, not from here
    again (``take_held``)."""
    hosts = remote_hosts(job.hosts)
    if not hosts:
        return
    manifest = folder_manifest(folder)
    if not left_out or not any(left_out.get(h.name) for h in hosts):
        send_where_needed(job, manifest, "model", env, on_event, flag=flag)
        return
    groups: dict[frozenset[str], list[str]] = {}
    for h in hosts:
        groups.setdefault(left_out.get(h.name, frozenset()), []).append(h.name)
    holders: list[tuple[HostCopy, str, Manifest]] = []  # a host of each group sent to, its IP, its part
    by_name = {h.name: h for h in hosts}
    for skipped, names in groups.items():
        part = replace(manifest, files=tuple(f for f in manifest.files if f.name not in skipped))
        on_event(Note(f"model: plan: {', '.join(names)} get{'s' if len(names) == 1 else ''} only "
                      f"{stage_words(part, manifest, skipped)}"))
        group = replace(job, hosts=tuple(h for h in job.hosts if h.name in names))
        known: dict[str, frozenset[str]] = {}  # host -> files found or made whole there by the takes
        for holder in holders:
            for name, whole in take_held(group, part, holder, env, on_event, flag).items():
                known[name] = known.get(name, frozenset()) | whole
        copies = send_where_needed(group, part, "model", env, on_event, flag=flag, known=known)
        sources = [c for c in copies if can_offer(c) and not c.same_as_here]
        if sources:  # (a group of this machine alone has no copy of its own)
            holders.append((sources[0], by_name[sources[0].host.name].ip, part))


def can_offer(copy: HostCopy) -> bool:
    """Whether other hosts can take files from ``copy``'s host (fanout.py): one
    reached over ssh, not this machine or a test's stand-in."""
    return isinstance(copy.host, ProcessLink) and bool(copy.host.ssh)


def take_held(job: Job, part: Manifest, holder: tuple[HostCopy, str, Manifest], env: dict[str, str],
              on_event: OnEvent, flag: str) -> dict[str, frozenset[str]]:
    """The files of ``part`` that ``holder``'s host already holds (whole, sent
    to it before), taken by ``job``'s hosts that lack them straight from it,
    over its data IP: they cross this machine's link once in all. A take that
    fails leaves its files to be sent from here, as the rest. Returns, for each
    host, the files of ``part`` now known whole there (sha256 checked there, or
    verified on arrival): its later check need not read them again."""
    source, ip, held = holder
    names = {f.name for f in held.files}
    shared = replace(part, files=tuple(f for f in part.files if f.name in names))
    if not shared.files:
        return {}
    copies = for_each_host(remote_hosts(job.hosts), lambda h: check_copy(shared, h, env, what=flag))
    known = {c.host.name: frozenset(f.name for f in shared.files if f not in c.lacking(shared))
             for c in copies}
    takers = [c for c in copies if c.lacking(shared)]
    if not takers:
        return known
    wanted = {f.name: f for c in takers for f in c.lacking(shared)}
    on_event(Note(f"model: plan: {', '.join(c.host.name for c in takers)} take{'s' if len(takers) == 1 else ''} "
                  f"the {len(wanted)} file(s) {source.host.name} holds too "
                  f"({human_bytes(sum(f.bytes for f in wanted.values()))}) from {source.host.name} "
                  f"over {ip}, not from here again"))
    failed = take_from(shared, source, ip, takers, "model", shared.folder, on_event,
                       then="sent from here below")
    known.update({c.host.name: frozenset(f.name for f in shared.files)
                  for c in takers if c not in failed})
    return known


def stage_words(part: Manifest, whole: Manifest, skipped: frozenset[str]) -> str:
    """'what its stage loads: 2 of 4 weight files (a.safetensors, b...), 60.1 MB of 120.2 MB,
    with the config and tokenizer files'."""
    weights = [f.name for f in part.files if f.name.endswith(".safetensors")]
    every = len(weights) + len(skipped)
    return (f"what its stage loads (--pipeline): {len(weights)} of {every} weight files "
            f"({', '.join(weights)}), {human_bytes(part.total_bytes)} of "
            f"{human_bytes(whole.total_bytes)}, with the config and tokenizer files")


def sync_script(job: Job, script: str, env: dict[str, str], on_event: OnEvent) -> None:
    """`run`'s script file on every remote host, at its absolute path here."""
    if remote_hosts(job.hosts):
        send_where_needed(job, file_manifest(script), "script", env, on_event)


def send_where_needed(job: Job, manifest: Manifest, what: str, env: dict[str, str],
                      on_event: OnEvent, *, flag: str | None = None,
                      known: Mapping[str, frozenset[str]] | None = None) -> list[HostCopy]:
    """Every remote host's copy checked (in parallel), the room checked on
    all of them, then each host sent what it lacks, in turn. A host that
    sees this machine's folder, or the same folder as a host before it (a
    token each: ``mark_here``, ``mark_host``), is sent nothing. ``known``:
    host name -> files already found whole there in this run (``take_held``),
    not read again by its check. Returns the copies as checked (each with its
    folder as its host resolved it)."""
    flag = flag or {"data": "--data", "model": "--init_from"}.get(what, "the " + what)
    hosts = remote_hosts(job.hosts)
    here = mark_here(manifest)
    tokens = {h.name: secrets.token_hex(TOKEN_BYTES) for h in hosts} if len(hosts) > 1 else {}
    known = known or {}
    try:
        if tokens:
            marked = for_each_host(hosts, lambda h: mark_host(manifest, h, "mark", tokens[h.name], env))
            tokens = {h.name: t for h, t, ok in zip(hosts, tokens.values(), marked, strict=True) if ok}
        copies = for_each_host(hosts, lambda h: check_rest(
            manifest, known.get(h.name, frozenset()), h, env, what=flag, here=here,
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
    lacking: list[HostCopy] = []
    for copy in copies:
        name = copy.host.name
        if copy.same_as_here:
            on_event(Note(f"{what}: {name} sees {shown} here, one folder with this machine's "
                          "(shared storage): nothing sent"))
        elif name in same:
            pass  # said once the host it shares the folder with is done
        elif copy.summary(manifest) == "whole":
            on_event(Note(f"{what}: {copy.host.name} has {shown} ({size}, sha256 checked)"))
            done[name] = "whole there"
        else:
            lacking.append(copy)
    by_name = {h.name: h for h in hosts}
    # A model to several hosts crosses this machine's link once: the first host gets it
    # from here, the others take it from that host over the hosts' own link (fanout.py).
    fan_out = what == "model" and len(lacking) > 1 and can_offer(lacking[0])
    if fan_out:
        first, ip = lacking[0], by_name[lacking[0].host.name].ip
        on_event(Note(f"{what}: plan: here -> {first.host.name} over this machine's link, then "
                      f"{first.host.name} -> {', '.join(c.host.name for c in lacking[1:])} over "
                      f"{ip} ({first.host.name}'s data IP), at once"))
        send_from_here(manifest, first, what, shown, on_event)
        lacking = take_from(manifest, first, ip, lacking[1:], what, shown, on_event)
    for copy in lacking:
        send_from_here(manifest, copy, what, shown, on_event)
    done.update({c.host.name: "sent there" for c in copies if c.host.name not in done})
    here_too = {c.host.name for c in copies if c.same_as_here}
    for name, other in same.items():
        if name in here_too:
            continue
        on_event(Note(f"{what}: {name} sees the same {shown} as {other}, one folder "
                      f"(shared storage): {done.get(other, 'checked there')}, nothing sent again"))
    return copies


def send_from_here(manifest: Manifest, copy: HostCopy, what: str, shown: str,
                   on_event: OnEvent) -> None:
    """What ``copy``'s host lacks sent from this machine, said as it goes."""
    lacking = copy.lacking(manifest)
    there = sum(copy.already_there(f) for f in lacking)
    need = copy.need(manifest)
    resuming = f" (resuming: {human_bytes(there)} of it arrived in a send cut off)" if there else ""
    name = copy.host.name
    on_event(Note(f"{what}: {name}: {shown} {copy.summary(manifest)}: sending "
                  f"{len(lacking)} file(s), {human_bytes(need)}{resuming}"))
    on_event(Sending(name, need))
    try:
        # A model's files are large: sent so that a cut send resumes (transfer/send.py).
        sent = send(manifest, copy, lambda n: on_event(SendProgress(name, n)),
                    resumable=what == "model", way_round=by_hand(manifest))
    finally:
        on_event(SendEnded(name))
    on_event(Note(f"{what}: {name}: sent {human_bytes(sent.bytes)} in {sent.seconds:.1f} s "
                  f"({human_bytes(sent.rate)}/s) by {sent.via}, sha256 verified there"))


def take_from(manifest: Manifest, source: HostCopy, ip: str, takers: Sequence[HostCopy],
              what: str, shown: str, on_event: OnEvent,
              then: str = "sending it from here") -> list[HostCopy]:
    """Each of ``takers`` takes what it lacks from ``source``'s host at once,
    over ``ip``; returns those that could not (to be sent from here, each
    resuming what arrived: ``then`` says what becomes of them), each said with why."""
    failed: list[HostCopy] = []
    # One bar for all the takes at once (they run together): the bytes every taker has so far.
    label = ", ".join(c.host.name for c in takers)
    so_far = {c.host.name: 0 for c in takers}
    lock = threading.Lock()

    def progress(name: str, done: int) -> None:
        with lock:
            so_far[name] = done
            on_event(SendProgress(label, sum(so_far.values())))

    def one(copy: HostCopy) -> None:
        on_event(Note(f"{what}: {copy.host.name}: {shown} {copy.summary(manifest)}: taking "
                      f"{len(copy.lacking(manifest))} file(s), {human_bytes(copy.need(manifest))} "
                      f"from {source.host.name}"))
        try:
            got = take(copy.host, manifest, copy, at, token, source.host.name,
                       lambda done: progress(copy.host.name, done))
        except TransferError as err:
            on_event(Note(f"{what}: {copy.host.name}: {err.message}: {then}"))
            failed.append(copy)
            return
        on_event(Note(f"{what}: {got.host}: took {human_bytes(got.bytes)} in {got.seconds:.1f} s "
                      f"({human_bytes(got.rate)}/s) over {got.via}, sha256 verified there"))

    try:
        with offering(source.host, manifest, source, ip) as (at, token):
            on_event(Sending(label, sum(c.need(manifest) for c in takers)))
            threads = [threading.Thread(target=one, args=(c,)) for c in takers]
            try:
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            finally:
                on_event(SendEnded(label))
    except TransferError as err:
        on_event(Note(f"{what}: {err.message}: {then}"))
        return list(takers)
    return [c for c in takers if c in failed]


def by_hand(manifest: Manifest) -> str:
    """The way round a failed send: a folder of this machine's (data, model,
    script) may be copied by hand instead; what ranks import (a ``source``
    apart: launch/code.py) may not."""
    return "" if manifest.source else (", or copy it by hand and pass --no-sync-data (train) "
                                       "or --no-sync-script (run)")


SERVED_MODEL = "the model folder"  # serve's MODEL_DIR, as its messages name it


def opt_out(what: str) -> str:
    """How to go without sending ``what`` (the code ranks import has no way round)."""
    if what == "the code":
        return ""
    if what == SERVED_MODEL:
        return ", or pass --no-sync-model"
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
