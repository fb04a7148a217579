"""What a pipeline run keeps: each stage's checkpoints, the resume they agree on, the outputs.

Checkpoints: each stage writes its own piece on its own host, in a folder of
its own, with checkpoint.py's format and rules (atomic, `latest`, pruning,
hashes); copies of a stage (pipelines x replicas) keep one writer per host as
data-parallel ranks do (resume.py, storage.py):

    OUT/checkpoints/stage_1_of_2/step_000010/model.safetensors      the stage's parameters
                                                                    (LoRA / DoRA: its adapters)
    OUT/checkpoints/stage_1_of_2/step_000010/optimizer.safetensors  its AdamW state
    OUT/checkpoints/stage_1_of_2/step_000010/state.json             ... "pipeline": {"stages": 2,
                                                                    "stage": 0, "blocks": [0, 2]}
    OUT/checkpoints/stage_1_of_2/latest
    OUT/checkpoints/stage_2_of_2/...

A resume starts every stage from the newest step every stage holds (a stage
stopped before its last write resumes its neighbours one checkpoint back), and
only with the same stages: a checkpoint of another --pipeline (or of a
data-parallel run) is refused, as is one whose stage holds other blocks
(another --pipeline_split): its pieces do not re-split.

Outputs (the first copy of the pipeline writes them):

    OUT/adapters/          LoRA / DoRA: rank 0 gathers every stage's adapters (small) and
                           writes mlx-lm's folder, as a data-parallel run does
    OUT/model/model-0000K-of-0000N.safetensors
                           full fine-tuning: stage K writes its own shard on its own host
                           (the whole model is never in one rank's memory)
    OUT/model/config.json, model.safetensors.index.json, tokenizer files
                           rank 0 (the index names every stage's tensors)

On one host (or a disk the hosts share) OUT/model is whole; on several, each
host holds its stages' shards and `mlxcluster train` brings them together.
Everything here is collective over the group it is given.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlx.core as mx
import numpy as np

from .checkpoint import checkpoint_name, checkpoint_problem, checkpoint_steps
from .errors import DataError
from .resume import ResumeError, all_gather_bytes
from .stages import StagePlan

STAGE_DIR = re.compile(r"stage_(\d+)_of_(\d+)$")
RECENT = 8  # the newest whole checkpoints of each stage the stages compare


def stage_dir(plan: StagePlan) -> str:
    return f"stage_{plan.index + 1}_of_{plan.count}"


def stage_state(plan: StagePlan) -> dict:
    """What a stage's state.json says of its place ("pipeline")."""
    return {"stages": plan.count, "stage": plan.index,
            "blocks": [plan.blocks.start, plan.blocks.stop]}


# ---------------------------------------------------------------- refusing together


def refuse_together(problem: str | None, group, hint: str = "") -> None:
    """Raise on every rank of `group` when any rank has a problem (its own message, or
    which ranks refused): a rank that stopped alone would leave the others waiting in
    their next collective."""
    flag = mx.array(1 if problem else 0, dtype=mx.int32)
    refusing = int(mx.distributed.all_sum(flag, group=group).item()) if group.size() > 1 \
        else int(flag.item())
    if problem:
        raise DataError(problem, hint)
    if refusing:
        raise DataError(f"{refusing} other rank(s) refused to resume: their messages say why")


def layout_problem(checkpoints: Path, plan: StagePlan) -> str | None:
    """Why `checkpoints` cannot resume this stage when it holds no folder of it: a
    data-parallel run's checkpoints, or another --pipeline's; None when it may."""
    if (checkpoints / stage_dir(plan)).is_dir():
        return None
    return other_layout(checkpoints, f"--pipeline {plan.count}")


def other_layout(checkpoints: Path, asked: str) -> str | None:
    """What else `checkpoints` holds than `asked` ("--pipeline 2", or "data-parallel"),
    as a refusal; None when it holds nothing of another kind."""
    counts = sorted({int(m.group(2)) for p in checkpoints.glob("stage_*_of_*")
                     if (m := STAGE_DIR.match(p.name)) and p.is_dir()})
    kinds = [f"--pipeline {n}" for n in counts if f"--pipeline {n}" != asked]
    if asked != "data-parallel" and checkpoint_steps(checkpoints):
        kinds.insert(0, "a data-parallel run (no --pipeline)")
    if not kinds:
        return None
    return (f"{checkpoints} holds the checkpoints of {' and '.join(kinds)}, and this run asks "
            f"for {asked}: a checkpoint's stages are the pieces its run held and do not "
            f"re-split; resume with the same --pipeline (and --pipeline_split), or start a new "
            f"run with another --out")


# ---------------------------------------------------------------- the step all stages hold


def whole_steps(root: Path, before: int = 0, only: int | None = None) -> list[int]:
    """The newest (at most RECENT) checkpoint steps under `root` whose files match
    their hashes, newest first (only steps below `before` unless 0; exactly `only`)."""
    steps = [only] if only is not None else list(reversed(checkpoint_steps(root)))
    whole = []
    for step in steps:
        if before and step >= before:
            continue
        path = root / checkpoint_name(step)
        if (path / "state.json").exists() and checkpoint_problem(path) is None:
            whole.append(step)
        if len(whole) == RECENT:
            break
    return whole


def common_step(mine: list[int], stage: int, stages: int, group) -> int | None:
    """The newest step every stage holds (some copy of it, in pipelines x replicas),
    agreed over `group` (the world: rank r is stage r % stages); None when no stage
    holds any. A ResumeError when the stages hold steps but no step in common."""
    row = np.full(RECENT, -1, dtype=np.int64)
    row[:len(mine)] = mine[:RECENT]
    if group.size() > 1:
        every = np.array(all_gather_bytes(row.tobytes(), group)).view(np.int64)
        every = every.reshape(group.size(), RECENT)
    else:
        every = row.reshape(1, RECENT)
    held: list[set[int]] = [set() for _ in range(stages)]
    for r, steps in enumerate(every):
        held[r % stages] |= {int(s) for s in steps if s >= 0}
    if not any(held):
        return None
    common = set.intersection(*held)
    if not common:
        raise ResumeError(
            "the stages hold no checkpoint step in common: "
            + "; ".join(f"stage {k + 1}: {sorted(h) or 'none'}" for k, h in enumerate(held))
            + ". Nothing was trained; resume from a --out whose stages all wrote the same "
              "step (keep_checkpoints 2 or more keeps the one before the last)")
    return max(common)


def check_stage_state(state: dict, plan: StagePlan, path: Path) -> str | None:
    """Why checkpoint `path` (its state.json) is not this stage's piece, or None."""
    saved = state.get("pipeline") or {}
    want = stage_state(plan)
    if saved.get("stages") != want["stages"] or saved.get("stage") != want["stage"]:
        return (f"{path} is not a checkpoint of stage {plan.index + 1} of {plan.count} "
                f"(it says {saved or 'no pipeline'})")
    if saved.get("blocks") != want["blocks"]:
        return (f"{path} holds blocks {saved.get('blocks')[0]}-{saved.get('blocks')[1] - 1}, "
                f"this run's stage {plan.index + 1} blocks {plan.blocks.start}-"
                f"{plan.blocks.stop - 1}: resume with the run's --pipeline_split")
    return None


# ---------------------------------------------------------------- gathering


def gather_json(value, group) -> list:
    """Every rank's JSON-able `value`, in rank order, on every rank."""
    data = json.dumps(value).encode()
    if group.size() == 1:
        return [value]
    lengths = np.array(all_gather_bytes(len(data).to_bytes(8, "little"), group))
    lengths = [int.from_bytes(bytes(row), "little") for row in lengths.reshape(-1, 8)]
    every = np.array(all_gather_bytes(data.ljust(max(lengths), b" "), group))
    rows = every.reshape(group.size(), max(lengths))
    return [json.loads(bytes(row[:n])) for row, n in zip(rows, lengths, strict=True)]


def gather_tensors(mine: dict[str, mx.array], group) -> dict[str, mx.array] | None:
    """Every rank's tensors on rank 0 (None elsewhere), one tensor at a time: for
    small ones (adapters). Each goes as its bytes in an all_sum where the other ranks
    add zeros (exact, and any rank reaches any other: ring's send and receive join
    neighbours only)."""
    if group.size() == 1:
        return dict(mine)
    specs = gather_json({n: [list(v.shape), str(v.dtype).rsplit(".", 1)[-1]]
                         for n, v in sorted(mine.items())}, group)
    rank, gathered = group.rank(), {}
    for source, spec in enumerate(specs):
        for name, (shape, dtype) in spec.items():
            kind = getattr(mx, dtype)
            value = mine[name] if rank == source else mx.zeros(shape, dtype=kind)
            raw = value.reshape(-1).view(mx.uint8)
            summed = mx.distributed.all_sum(raw, group=group)
            mx.eval(summed)
            if rank == 0:
                gathered[name] = summed.view(kind).reshape(shape)
    return gathered if rank == 0 else None
