"""Where each host's ranks write checkpoints, and how all ranks agree before resuming.

Macs have their own disks, so every host keeps its own copy of each
checkpoint (one writer per host: the lowest rank among those on it; hosts
that see the same --out, found out by storage.py, keep one copy, written by
the lowest rank among them). A resume then has to make sure every rank
starts from the same state:

1. each rank names the newest whole checkpoint on its own disk (its step and
   a hash of its arrays; a copy whose files do not match the hashes in its
   state.json is damaged and passed over) and the ranks exchange these;
2. the newest step anyone holds wins; if its holders hold different contents,
   nobody trains: a ResumeError names every host, its step and its hash;
3. a host lacking that checkpoint (the hosts sharing an --out hold the same
   copy, so lack it together) receives it over the job's own group from
   the lowest holder (an all_sum in which only the holder sends non-zero
   bytes, so it works on ring and MPI, under mlxcluster or a plain
   `mlx.launch` / `mpirun`), verifies it against its hashes and writes it,
   once per --out;
4. after loading, the ranks exchange (step, hash of what they loaded) once
   more and refuse to train unless all agree.

Everything here is collective: every rank calls the same functions in the
same order. Nothing prints; the trainer logs the notes returned.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np

from .checkpoint import (
    CHECKPOINT_FILES,
    checkpoint_name,
    checkpoint_problem,
    checkpoint_steps,
    content_hash,
    install_checkpoint,
    load_checkpoint,
    resolve_checkpoint,
)
from .collectives import all_gather, all_gather_bytes, barrier, broadcast_bytes
from .disk_room import said_when_full
from .errors import DataError
from .files import file_sha256
from .fine_tune import ADAPTER_FIELDS
from .model import args_match
from .storage import STORAGE_DIR, TOKEN_BYTES, storage_groups

NAME_BYTES = 64  # a hostname, padded, as exchanged between ranks


class ResumeError(DataError):
    """The ranks cannot start from one state; the message names the hosts and steps."""


@dataclass
class HostLayout:
    """Which host every rank runs on, which ranks see the same --out, and
    whether this rank writes for them.

    `storage[r]` is the writer of rank r's --out: the lowest rank among those
    that see the same folder (storage.py finds out, with tokens). None until
    then: each host its own disk, as on Macs, so the lowest rank of each host.
    """

    hosts: list[str]
    rank: int
    storage: list[int] | None = None

    def writer(self, rank: int) -> int:
        """The rank that writes rank `rank`'s checkpoints and exports."""
        if self.storage is not None:
            return self.storage[rank]
        return self.hosts.index(self.hosts[rank])

    @property
    def writes(self) -> bool:
        """The lowest rank of those sharing this rank's --out writes for all of them."""
        return self.writer(self.rank) == self.rank

    def sharing(self, rank: int) -> list[int]:
        """The ranks that see rank `rank`'s --out (itself included)."""
        return [r for r in range(len(self.hosts)) if self.writer(r) == self.writer(rank)]

    def name(self, rank: int) -> str:
        return f"rank {rank} on {self.hosts[rank]}"


@dataclass
class Holding:
    """The newest whole checkpoint one rank found on its disk (step -1: none)."""

    step: int
    digest: str = ""
    notes: list[str] = field(default_factory=list)


def host_layout(group) -> HostLayout:
    """Every rank's hostname, gathered once at start (a collective)."""
    mine = socket.gethostname().encode()[:NAME_BYTES].ljust(NAME_BYTES, b"\0")
    if group.size() == 1:
        return HostLayout([mine.rstrip(b"\0").decode(errors="replace")], 0)
    every = np.array(all_gather_bytes(mine, group)).reshape(group.size(), NAME_BYTES)
    names = [bytes(row).rstrip(b"\0").decode(errors="replace") for row in every]
    return HostLayout(names, group.rank())


def newest_whole(root: Path, only: int | None = None,
                 before: int = 0) -> tuple[Holding, Path | None]:
    """The newest checkpoint under `root` whose files match their hashes
    (or exactly step `only`; only steps below `before` unless it is 0), with
    a note for every damaged one passed over."""
    notes = []
    steps = [only] if only is not None else list(reversed(checkpoint_steps(root)))
    steps = [s for s in steps if not before or s < before]
    for step in steps:
        path = root / checkpoint_name(step)
        if not (path / "state.json").exists():
            continue
        problem = checkpoint_problem(path)
        if problem:
            notes.append(f"{path} is damaged ({problem}): not used")
            continue
        return Holding(step, content_hash(path), notes), path
    return Holding(-1, "", notes), None


def exchange(holding: Holding, group) -> list[Holding]:
    """Every rank's (step, digest), in rank order."""
    packed = int(holding.step + 1).to_bytes(8, "little") + bytes.fromhex(holding.digest or "0" * 64)
    if group.size() == 1:
        rows = [packed]
    else:
        every = np.array(all_gather_bytes(packed, group)).reshape(group.size(), len(packed))
        rows = [bytes(r) for r in every]
    out = []
    for row in rows:
        step = int.from_bytes(row[:8], "little") - 1
        out.append(Holding(step, row[8:].hex() if step >= 0 else ""))
    return out


def checkpoint_root(resume: str, out: Path) -> tuple[Path, int | None]:
    """Where this host's checkpoints for `--resume` live, and the exact step asked
    for (None: the newest there). `auto` is OUT/checkpoints."""
    if resume == "auto":
        return out / "checkpoints", None
    path = Path(resume)
    if path.name.startswith("step_") and path.name[5:].isdigit():
        return path.parent, int(path.name[5:])
    found = resolve_checkpoint(path)
    if found is not None:
        return found.parent, None
    return (path if path.name == "checkpoints" else path / "checkpoints"), None


def agree_on_checkpoint(group, layout: HostLayout, root: Path, only: int | None,
                        keep: int, before: int = 0) -> tuple[Path | None, list[str], list[str]]:
    """Steps 1-3 above (collective), among the checkpoints below step `before`
    (0: all). Returns this rank's checkpoint to load (None: no rank has one),
    notes about this rank's own disk (damaged copies passed over) and notes
    every rank holds alike (what was sent where)."""
    mine, _ = newest_whole(root, only, before)
    # Said by the writer alone: the ranks sharing its --out saw the same copies.
    own = [f"{layout.hosts[layout.rank]} (rank {layout.rank}): {n}"
           for n in mine.notes] if layout.writes else []
    notes: list[str] = []
    every = exchange(mine, group)
    step = max(h.step for h in every)
    if step < 0:
        return None, own, notes
    holders = [r for r, h in enumerate(every) if h.step == step]
    digests = {every[r].digest for r in holders}
    if len(digests) > 1:
        raise ResumeError(
            f"the hosts hold different checkpoints for step {step}: "
            + "; ".join(f"{layout.name(r)}: step {h.step} hash {h.digest[:12] or '-'}"
                        for r, h in enumerate(every))
            + ". Keep one run's checkpoints per --out: remove the copies that do not belong "
              "to this run, or resume from an explicit --resume PATH")
    lacking = [r for r, h in enumerate(every) if h.step != step]
    if lacking:
        source = holders[0]
        t0 = time.perf_counter()
        sent = send_checkpoint(group, layout, root, step, source, receive=layout.rank in lacking,
                               keep=keep)
        took = time.perf_counter() - t0
        for r in lacking:
            if layout.writer(r) != r:  # written once for the ranks sharing its --out
                continue
            had = f"step {every[r].step}" if every[r].step >= 0 else "no checkpoint"
            others = [q for q in layout.sharing(r)
                      if layout.hosts[q] != layout.hosts[r]]
            also = (f" (one copy for {', '.join(layout.name(q) for q in others)}, which share "
                    "its --out)") if others else ""
            notes.append(f"{layout.hosts[r]} (rank {r}) had {had}: {checkpoint_name(step)} sent "
                         f"from {layout.hosts[source]} ({sent / 2**20:.1f} MiB in {took:.1f} s)"
                         + also)
    return root / checkpoint_name(step), own, notes


def send_checkpoint(group, layout: HostLayout, root: Path, step: int, source: int,
                    receive: bool, keep: int) -> int:
    """Broadcast checkpoint `step` from rank `source` to every rank (collective);
    the writer of each receiving --out (one per host, or one for the hosts
    sharing a disk) verifies and installs it. Returns bytes sent."""
    is_source = layout.rank == source
    path = root / checkpoint_name(step)
    tmp = None
    what = f"{checkpoint_name(step)} received from {layout.hosts[source]}"
    if receive and layout.writes:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{checkpoint_name(step)}.recv.", dir=root))
    total = 0
    try:
        for name in CHECKPOINT_FILES:
            data = (path / name).read_bytes() if is_source else b""
            size = broadcast_bytes(len(data).to_bytes(8, "little") if is_source else bytes(8),
                                   group)
            n = int.from_bytes(size, "little")
            received = broadcast_bytes(data if is_source else bytes(n), group)
            total += n
            if tmp is not None:
                with said_when_full(root, what):  # a full disk named (disk_room.py)
                    (tmp / name).write_bytes(received)
        if tmp is not None:
            state = json.loads((tmp / "state.json").read_text())
            for name, want in (state.get("hashes") or {}).items():
                if file_sha256(tmp / name) != want:
                    raise ResumeError(f"{layout.hosts[layout.rank]}: {name} of "
                                      f"{checkpoint_name(step)} arrived damaged (hash mismatch)")
            with said_when_full(root, what):
                install_checkpoint(root, tmp, step, keep)
            tmp = None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    barrier(group)  # the other ranks of a receiving host read what its writer installed
    return total


@dataclass
class Loaded:
    """A resumed checkpoint: its state.json, a hash of its arrays (check_loaded), where it
    came from (for the log), and its folder (None: re-cut from another layout's pieces)."""

    state: dict
    digest: str
    where: str
    folder: Path | None = None


def check_trained_alike(saved: dict, where, args, cfg, adapters: bool) -> None:
    """A DataError unless checkpoint `where`'s state.json (`saved`) is of a model of
    shape `args` fine-tuned as `cfg` asks (`adapters`: LoRA's or DoRA's settings too)."""
    saved_args = saved["model_args"]
    if not args_match(saved_args, args):
        raise DataError(f"{where} holds a different model: {saved_args}",
                        "resume with the same model settings")
    tuning = ("fine_tune", "objective", *(ADAPTER_FIELDS if adapters else ()))
    before = {"fine_tune": "full", "objective": "sft"}  # a checkpoint from before the field
    theirs = {k: saved.get("config", {}).get(k, before.get(k)) for k in tuning}
    ours = {k: getattr(cfg, k) for k in tuning}
    if theirs != ours:
        raise DataError(f"{where} was trained with {theirs}, this run asks for {ours}",
                        "resume with the checkpoint's --fine_tune and --lora_* settings, and "
                        "its --objective")


def load_folder(path: Path, model, optimizer, trainable_only: bool, check) -> Loaded:
    """Checkpoint `path` loaded in place, once `check(its state.json, path)` passed."""
    with open(path / "state.json") as f:
        check(json.load(f), path)
    state = load_checkpoint(path, model, optimizer, trainable_only=trainable_only)
    return Loaded(state, content_hash(path), str(path), path)


def say_notes(own_notes: list[str], notes: list[str], log) -> None:
    """agree_on_checkpoint's notes: about this host's disk, said by the rank that saw it;
    the others in the log."""
    for note in own_notes:
        print(f"note: {note}", flush=True)
    for note in notes:
        log(note)


def check_loaded(group, layout: HostLayout, step: int, digest: str) -> None:
    """Step 4: every rank loaded the same step and the same arrays, or a ResumeError."""
    every = exchange(Holding(step, digest), group)
    if len({(h.step, h.digest) for h in every}) > 1:
        raise ResumeError(
            "the ranks loaded different states: "
            + "; ".join(f"{layout.name(r)}: step {h.step} hash {h.digest[:12] or '-'}"
                        for r, h in enumerate(every))
            + ". Nothing was trained; resume from a checkpoint every host has "
              "(--resume PATH)")


def find_storage(group, layout: HostLayout, out: Path, what: str = "--out",
                 required: bool = True) -> HostLayout:
    """`layout` with `storage` filled in: which ranks see the same `out` (steps
    1-4 above; collective). With one host there is nothing to find out.
    A host that cannot write its token there is a DataError naming `what`,
    or, unless `required` (a --resume PATH only read from), its own folder."""
    size, rank = group.size(), group.rank()
    host_writers = sorted({layout.hosts.index(h) for h in layout.hosts})
    if size == 1 or len(host_writers) == 1:
        return HostLayout(layout.hosts, layout.rank, [0] * size)
    looks = layout.hosts.index(layout.hosts[rank]) == rank
    folder = Path(out) / STORAGE_DIR
    token, failed = bytes(TOKEN_BYTES), None
    if looks:
        try:
            folder.mkdir(parents=required, exist_ok=True)  # a --resume PATH is not made
            token = secrets.token_bytes(TOKEN_BYTES)
            (folder / token.hex()).touch()
        except OSError as e:  # said after the exchange, so the others are not left waiting
            failed, token = e, bytes(TOKEN_BYTES)
    tokens = np.array(all_gather_bytes(token, group)).reshape(size, TOKEN_BYTES)
    row = np.zeros(size, dtype=np.uint8)
    if looks and failed is None:
        for r in host_writers:
            theirs = bytes(tokens[r])
            if r != rank and any(theirs) and (folder / theirs.hex()).exists():
                row[r] = 1
    sees = np.array(all_gather(mx.array(row), group)).reshape(size, size)
    if looks and failed is None:
        (folder / token.hex()).unlink(missing_ok=True)
        try:
            folder.rmdir()
        except OSError:
            pass  # another host's token is still there: that host removes the folder
    if failed is not None and required:
        raise DataError(f"{what} {out} cannot be written on {layout.hosts[rank]}: "
                        f"{failed.strerror or failed}",
                        f"give {what} a path every host can write to")
    return HostLayout(layout.hosts, layout.rank,
                      storage_groups(layout.hosts, sees.astype(bool).tolist()))
