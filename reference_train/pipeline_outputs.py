"""What a pipeline run keeps: each stage's checkpoints, the resume they agree on, the outputs.

Checkpoints: each stage writes its own piece on its own host, in a folder of
its own, with checkpoint.py's format and rules (atomic, `latest`, pruning,
hashes); copies of a stage (pipelines x replicas) keep one writer per host as
data-parallel ranks do (resume.py, storage.py):

    OUT/checkpoints/stage_1_of_2/step_000010/model.safetensors      the stage's parameters
                                                                    (LoRA / DoRA: its adapters)
    OUT/checkpoints/stage_1_of_2/step_000010/optimizer.safetensors  its AdamW state
    OUT/checkpoints/stage_1_of_2/step_000010/state.json             ... "pipeline": {"stages": 2,
                                                                    "stage": 0, "blocks": [0, 2],
                                                                    "hosts": ["mac1", "mac2"]}
    OUT/checkpoints/stage_1_of_2/latest
    OUT/checkpoints/stage_2_of_2/...

With one copy of the pipeline, each stage's piece is also mirrored on the next
stage's host, under the same folder name, when that host has a disk of its own
(mirror.py): mac2 holds stage_2_of_2 (its own) and stage_1_of_2 (mac1's, mirrored),
so a lost host's piece survives. ("hosts": every stage's host when it was written,
for the refusal that names a lost one.)

A resume (resplit.py chooses) starts from the newest step at which every stage
of some --pipeline is held by some rank, its own folder or a mirror (a stage
stopped before its last write resumes its neighbours one checkpoint back):
- this run's stages and blocks, each stage holding its own piece: each stage
  loads its own (as always);
- another --pipeline (or this one's pieces found only in mirrors): the pieces
  re-split, every tensor sent to every rank, each keeping its stage's; new
  checkpoints go to the new stages' folders (stage_K_of_N), the old ones stay
  until removed;
- the same --pipeline with another --pipeline_split: refused (the two splits'
  pieces would share folders); so is a data-parallel run's checkpoint, and a
  data-parallel run on a pipeline's (`other_layout`);
- a step some stage's piece of which no rank holds, and none older whole:
  refused, naming that stage and its host.

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
The writing (and the gathering, collectives.py) is pipeline_setup.Pipeline's; here
the folders, the stage's state, the whole steps and the refusals, none collective.
"""

from __future__ import annotations

import re
from pathlib import Path

from .checkpoint import checkpoint_name, checkpoint_problem, checkpoint_steps
from .stages import StagePlan

STAGE_DIR = re.compile(r"stage_(\d+)_of_(\d+)$")
RECENT = 8  # the newest whole checkpoints of each stage a resume compares


def stage_dir(plan: StagePlan) -> str:
    return stage_folder(plan.index, plan.count)


def stage_folder(index: int, count: int) -> str:
    """The folder of stage `index` (0-based) of `count`'s checkpoints: stage_1_of_2."""
    return f"stage_{index + 1}_of_{count}"


def stage_state(plan: StagePlan) -> dict:
    """What a stage's state.json says of its place ("pipeline")."""
    return {"stages": plan.count, "stage": plan.index,
            "blocks": [plan.blocks.start, plan.blocks.stop]}


def other_layout(checkpoints: Path, asked: str) -> str | None:
    """What `checkpoints` holds of the other kind than `asked` ("data-parallel", or a
    pipeline's "--pipeline 2"), as a refusal: a pipeline's pieces re-split over another
    --pipeline (resplit.py), but a data-parallel run's checkpoints and a pipeline's are
    not one another's. None when it holds nothing of the other kind."""
    if asked == "data-parallel":
        counts = sorted({int(m.group(2)) for p in checkpoints.glob("stage_*_of_*")
                         if (m := STAGE_DIR.match(p.name)) and p.is_dir()})
        held = " and ".join(f"--pipeline {n}" for n in counts)
        fix = "a --pipeline (any number of stages: its pieces re-split)"
    else:
        held = "a data-parallel run (no --pipeline)" if checkpoint_steps(checkpoints) else ""
        fix = "no --pipeline"
    if not held:
        return None
    return (f"{checkpoints} holds the checkpoints of {held}, and this run asks for {asked}: "
            f"a data-parallel run's checkpoints and a pipeline's pieces do not convert into "
            f"one another; resume with {fix}, or start a new run with another --out")


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
