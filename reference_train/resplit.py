"""A pipeline's checkpoints resumed over another number of stages (--pipeline M -> N).

Parameter and optimizer-state names are the whole model's (layers.5.attention.wq.weight,
layers.5.attention.wq.weight.m: pipeline.Stage), so the pieces of one step cut
one way can be cut another. A resume of a pipeline run (train.py) goes:

1. each --out's writer (one per disk: storage.py) lists every whole piece on
   its disk (`scan_pieces`): each OUT/checkpoints/stage_K_of_M/step_S whose
   files match their hashes, its own stage's or a neighbour's mirror
   (mirror.py); the ranks exchange the lists, a rank sharing a writer's disk
   holding what the writer found;
2. `choose_checkpoint` (no I/O, no collective: every rank decides alike) takes
   the newest step S at which every stage of some layout M is held by some
   rank (a tie goes to this run's layout):
   - this run's layout (same M and blocks), each stage held by a rank of that
     stage: today's resume (pipeline_outputs.py, resume.py), unchanged;
   - the same M with other blocks (another --pipeline_split): refused, its
     folders would hold two splits at once;
   - otherwise a re-split: old stage k's piece read by the lowest rank holding
     it (`Resplit.sources`);
   - a step some stage of which no rank holds, and nothing older whole: refused,
     naming the stage and the host whose disk held it;
3. `assemble` (collective, in old stage order): the source rank reads each
   tensor of its piece (lazily: one in memory at a time) and every rank gets
   it (an all_sum where the others add zeros: exact); each keeps what its new
   stage holds, the first old stage naming a tensor winning (the tied
   embedding: old stage 0's matrix, the last stage's copy equal to it), and
   old stage 0's state.json (step, rng keys, data position);
4. `missing_names`: every rank got every tensor it needs, or all refuse.

New checkpoints go to the new layout's folders (stage_K_of_N); the old
layout's folders stay until removed by hand.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path

import mlx.core as mx

from .checkpoint import ARRAY_FILES, checkpoint_name, content_hash
from .collectives import gather_json, tensor_from, tensor_specs
from .pipeline_outputs import STAGE_DIR, stage_folder, whole_steps
from .resume import ResumeError


@dataclass(frozen=True)
class Piece:
    """One whole checkpoint of one stage on one disk."""

    count: int  # the stages of the run that wrote it (M of stage_K_of_M)
    stage: int  # 0-based
    step: int
    blocks: tuple[int, int]  # the blocks it holds: [start, stop)
    digest: str  # checkpoint.content_hash
    hosts: tuple[str, ...] = ()  # every stage's host when it was written (older: unknown)

    @classmethod
    def from_json(cls, row: dict) -> Piece:
        return cls(row["count"], row["stage"], row["step"], tuple(row["blocks"]), row["digest"],
                   tuple(row.get("hosts") or ()))


@dataclass(frozen=True)
class Resplit:
    """What a pipeline resumes from: step `step` of the `count` stages' checkpoints."""

    count: int
    step: int
    sources: tuple[int, ...]  # old stage k's piece: read by rank sources[k]
    blocks: tuple[tuple[int, int], ...]  # old stage k's blocks
    digests: tuple[str, ...]
    same: bool  # this run's own layout, each stage held by a rank of it: today's resume
    notes: tuple[str, ...] = ()  # newer steps passed over, and why

    @property
    def digest(self) -> str:
        """One hash of every piece resumed from: the same on every rank."""
        return hashlib.sha256(";".join(self.digests).encode()).hexdigest()


# ---------------------------------------------------------------- what each disk holds


def scan_pieces(root: Path, before: int = 0, only: int | None = None) -> list[Piece]:
    """Every whole stage checkpoint under `root` (OUT/checkpoints): each stage_K_of_M
    folder's newest whole steps (pipeline_outputs.whole_steps: below `before` unless 0,
    or exactly `only`). A piece whose state.json names another place than its folder
    is passed over."""
    pieces = []
    for folder in sorted(root.glob("stage_*_of_*")):
        m = STAGE_DIR.match(folder.name)
        if not m or not folder.is_dir():
            continue
        stage, count = int(m.group(1)) - 1, int(m.group(2))
        for step in whole_steps(folder, before, only):
            path = folder / checkpoint_name(step)
            place = json.loads((path / "state.json").read_text()).get("pipeline") or {}
            if place.get("stages") != count or place.get("stage") != stage:
                continue
            pieces.append(Piece(count, stage, step, tuple(place["blocks"]), content_hash(path),
                                tuple(place.get("hosts") or ())))
    return pieces


def exchange_pieces(mine: list[Piece], writers: list[int], group) -> list[list[Piece]]:
    """Every rank's holding (collective): rank r holds what its disk's writer
    (`writers[r]`) found, the writers alone having looked."""
    every = gather_json([asdict(p) for p in mine], group)
    return [[Piece.from_json(row) for row in every[w]] for w in writers]


# ---------------------------------------------------------------- the choice


def choose_checkpoint(holdings: list[list[Piece]], stages: int,
                      blocks: list[tuple[int, int]]) -> Resplit | None:
    """What this run (`stages` stages holding `blocks`, rank r being stage r % stages)
    resumes from, given what each rank holds: the newest step some layout holds whole
    (a tie to this run's); None when no rank holds any piece. A ResumeError when the
    newest whole step is another --pipeline_split of this run's stages, when a step's
    holders hold different contents, and when no step is whole (naming the stage no
    rank holds)."""
    found = {(p.count, p.step) for held in holdings for p in held}
    passed: list[tuple[int, int, list[int], tuple[str, ...]]] = []
    for count, step in sorted(found, key=lambda c: (-c[1], c[0] != stages, c[0])):
        holders = [[r for r, held in enumerate(holdings)
                    if any((p.count, p.stage, p.step) == (count, k, step) for p in held)]
                   for k in range(count)]
        pieces = [piece_of(holdings, hs, count, k, step) for k, hs in enumerate(holders)]
        missing = [k for k, hs in enumerate(holders) if not hs]
        if missing:
            hosts = next((p.hosts for p in pieces if p is not None and p.hosts), ())
            passed.append((count, step, missing, hosts))
            continue
        old_blocks = tuple(p.blocks for p in pieces)
        if not is_partition(old_blocks):  # two splits' pieces in one folder's steps
            passed.append((count, step, [], ()))
            continue
        same = count == stages
        if same and list(old_blocks) != [tuple(b) for b in blocks]:
            raise ResumeError(
                f"step {step} of --pipeline {count}'s checkpoints holds blocks "
                f"{describe_split(old_blocks)}, this run's stages {describe_split(blocks)}: "
                f"the same number of stages with another --pipeline_split does not re-split "
                f"(its pieces would share the folders stage_K_of_{count})",
                f"resume with --pipeline_split {','.join(str(b - a) for a, b in old_blocks)}, "
                f"or with another --pipeline, or start a new run with another --out")
        own = same and all(any(r % stages == k for r in hs) for k, hs in enumerate(holders))
        return Resplit(count, step, tuple(hs[0] for hs in holders), old_blocks,
                       tuple(p.digest for p in pieces), own,
                       tuple(passed_note(c, s, m, step) for c, s, m, _ in passed))
    lacking = next((p for p in passed if p[2]), None)
    if lacking:
        raise ResumeError(*missing_stage(*lacking))
    if passed:
        count, step = passed[0][:2]
        raise ResumeError(f"step {step} of --pipeline {count}'s checkpoints: its stages' blocks "
                          "do not line up (two --pipeline_split runs in one --out)",
                          "resume from an explicit --resume PATH, or start a new run with "
                          "another --out")
    return None


def piece_of(holdings: list[list[Piece]], holders: list[int], count: int, stage: int,
             step: int) -> Piece | None:
    """The piece the lowest of `holders` holds; a ResumeError when they hold different ones."""
    pieces = {p for r in holders for p in holdings[r]
              if (p.count, p.stage, p.step) == (count, stage, step)}
    if len({p.digest for p in pieces}) > 1:
        raise ResumeError(
            f"the ranks hold different checkpoints of stage {stage + 1} of {count} at step "
            f"{step}: " + "; ".join(
                f"rank {r} hash {p.digest[:12]}" for r in holders for p in holdings[r]
                if (p.count, p.stage, p.step) == (count, stage, step)),
            "keep one run's checkpoints per --out: remove the copies that do not belong to "
            "this run, or resume from an explicit --resume PATH")
    return next((p for p in holdings[holders[0]]
                 if (p.count, p.stage, p.step) == (count, stage, step)), None) if holders else None


def is_partition(blocks: tuple[tuple[int, int], ...]) -> bool:
    """Whether the stages' blocks are contiguous from block 0, in order."""
    return blocks[0][0] == 0 and all(blocks[i][1] == blocks[i + 1][0]
                                     for i in range(len(blocks) - 1))


def describe_split(blocks) -> str:
    return ", ".join(f"{a}-{b - 1}" for a, b in blocks)


def stage_list(stages: Collection[int]) -> str:
    """[0, 1] -> 'stages 1-2'; [2] -> 'stage 3'; [0, 2] -> 'stages 1, 3' (1-based)."""
    ordered = sorted(stages)
    if len(ordered) == 1:
        return f"stage {ordered[0] + 1}"
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"stages {ordered[0] + 1}-{ordered[-1] + 1}"
    return "stages " + ", ".join(str(k + 1) for k in ordered)


def passed_note(count: int, step: int, missing: list[int], resumed: int) -> str:
    why = (f"{stage_list(missing)} of {count} held by no rank" if missing
           else "its stages' blocks do not line up (two --pipeline_split runs in one --out)")
    return f"step {step} of --pipeline {count} passed over ({why}): resuming from step {resumed}"


def missing_stage(count: int, step: int, missing: list[int],
                  hosts: tuple[str, ...]) -> tuple[str, str]:
    """The refusal (message, hint) when no step is whole: step `step` of --pipeline
    `count` lacks the `missing` stages."""
    which = stage_list(missing)
    verb = "is" if len(missing) == 1 else "are"
    where = "; ".join(
        f"stage {k + 1} ran on {hosts[k]}, whose disk holds it"
        + (f", and its mirror is on {hosts[(k + 1) % count]}'s when that is a disk of its own"
           if hosts[(k + 1) % count] != hosts[k] else "")
        for k in missing) if len(hosts) == count else \
        "each stage's host kept its piece on its own disk"
    return (f"{which} of {count}'s checkpoint {verb} on no rank's disk: step {step} of "
            f"--pipeline {count} is held for {stage_list(set(range(count)) - set(missing))} "
            f"only ({where}). Nothing was trained",
            "bring that host back (or copy its OUT/checkpoints/"
            f"{stage_folder(missing[0], count)} onto a host of this run), or resume from a "
            "--out (--resume PATH) where every stage's checkpoint is")


# ---------------------------------------------------------------- the pieces re-cut


@dataclass
class Assembled:
    """What one rank keeps of a re-split: old stage 0's state.json, the tensors its
    stage holds, and which old stages gave its parameters (`used`)."""

    state: dict
    weights: dict[str, mx.array]
    optimizer: dict[str, mx.array]
    used: list[int]


def assemble(choice: Resplit, root: Path, group, weights: Collection[str],
             optimizer: Collection[str]) -> Assembled:
    """Every old stage's piece sent to every rank, one tensor at a time, in stage order
    (collective over `group`, the world): this rank keeps the `weights` and `optimizer`
    names it needs, the first old stage giving a name winning. A source reads its
    piece lazily (mx.load), so one tensor is in memory at a time."""
    rank = group.rank()
    kept: dict[str, dict[str, mx.array]] = {"model.safetensors": {}, "optimizer.safetensors": {}}
    wanted = {"model.safetensors": set(weights), "optimizer.safetensors": set(optimizer)}
    state, used = {}, []
    for k, source in enumerate(choice.sources):
        path = root / stage_folder(k, choice.count) / checkpoint_name(choice.step)
        mine = rank == source
        if k == 0:
            read = json.loads((path / "state.json").read_text()) if mine else None
            state = gather_json(read, group)[source]
        for name in ARRAY_FILES:
            arrays = mx.load(str(path / name)) if mine else {}
            specs = gather_json(tensor_specs(arrays) if mine else None, group)[source]
            for tensor, (shape, dtype) in specs.items():
                value = tensor_from(source, arrays.pop(tensor) if mine else None, shape, dtype,
                                    group)
                if tensor in wanted[name] and tensor not in kept[name]:
                    kept[name][tensor] = value
                    if name == "model.safetensors" and k not in used:
                        used.append(k)
    return Assembled(state, kept["model.safetensors"], kept["optimizer.safetensors"], used)


def missing_names(got: Assembled, weights: Collection[str], optimizer: Collection[str],
                  choice: Resplit, stage: str) -> str | None:
    """Why this rank cannot start from what it assembled (the names no old stage
    gave), or None."""
    lacking = sorted(set(weights) - set(got.weights)) + \
        sorted(set(optimizer) - set(got.optimizer))
    if not lacking:
        return None
    return (f"{stage}: step {choice.step} of --pipeline {choice.count}'s checkpoints lack "
            f"{len(lacking)} of its tensors ({', '.join(lacking[:4])}"
            f"{', ...' if len(lacking) > 4 else ''}): they were written for another model or "
            "--fine_tune; resume with the run's settings, or start a new run with another --out")


def describe_resplit(choice: Resplit, got: Assembled, stage_index: int, stages: int) -> str:
    """This rank's line: 'resumed step 4 re-split from --pipeline 4 (stages 1-2 of 4's
    pieces) into stage 1 of 2'."""
    return (f"resumed step {choice.step} re-split from --pipeline {choice.count} "
            f"({stage_list(got.used)} of {choice.count}'s pieces) into stage {stage_index + 1} "
            f"of {stages}")


def describe_sources(choice: Resplit, hosts: list[str], stages: int) -> str:
    """Rank 0's line: which rank sends each old stage's piece."""
    return (f"re-splitting step {choice.step} of --pipeline {choice.count}'s checkpoints over "
            f"--pipeline {stages}: " + ", ".join(
                f"stage {k + 1}'s piece from rank {r} on {hosts[r]}"
                for k, r in enumerate(choice.sources)))
