"""A pipeline run's parts (--pipeline N): the groups, this rank's stage, its step.

    world of N x R ranks:  rank r is stage r % N of pipeline copy (replica) r // N
    pipe = pipeline_groups(group, N, backend)     the pipeline and replica groups
    plans = run_plans(cfg, meta, N)               stages.plan_stages, no weight loaded
    stage, compute = build_stage(cfg, plans[pipe.stage], meta, data_dir)

One pipeline (R = 1) needs only send and receive, which every backend has. R
copies of the pipeline need the world split into the pipelines and, across
them, the ranks holding the same stage (whose gradients are averaged):
Group.split, which MPI has and ring and JACCL (mlx 0.32) do not; there a world
of any other size than N is refused before anything loads (stages.check_world).
The stage is built as one process builds its model (stage_load.py: the same
seed and draws, LoRA's and DoRA's adapters alike), and only its blocks are read
from --init_from's folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from . import lora
from .config import TrainConfig, model_args
from .errors import DataError
from .fine_tune import trains_adapters
from .hf_io import is_quantized
from .pipeline import TIED, SingleReplica, Stage
from .precision import compute_copy, dtype_of
from .resume import HostLayout
from .stage_load import load_stage, model_bytes, new_stage, shaped_stage
from .stages import (
    StagePlan,
    check_micro_batches,
    check_world,
    default_micro_batches,
    folder_bytes,
    parse_split,
    plan_stages,
)


@dataclass
class PipelineGroups:
    """This rank's place: its stage and pipeline copy, and the groups it talks in."""

    stages: int
    stage: int  # this rank's stage index (0-based)
    replica: int  # which copy of the pipeline
    replicas_count: int
    pipeline: object  # mx.distributed.Group: stage i is rank i
    replicas: object  # the ranks holding this stage in every copy (SingleReplica: one copy)


def pipeline_groups(group, n_stages: int, backend: str) -> PipelineGroups:
    """The pipeline this rank belongs to and its stage's copies (collective when the
    world holds several pipelines: Group.split)."""
    size, rank = group.size(), group.rank()
    check_world(n_stages, size, backend)
    stage, replica = rank % n_stages, rank // n_stages
    if size == n_stages:
        return PipelineGroups(n_stages, stage, 0, 1, group, SingleReplica())
    pipeline = group.split(replica, stage)
    replicas = group.split(stage, replica)
    return PipelineGroups(n_stages, stage, replica, size // n_stages, pipeline, replicas)


def run_plans(cfg: TrainConfig, meta: dict) -> list[StagePlan]:
    """The stages of this run's model (--init_from's folder, or the config's shape),
    planned from the bytes of its parts: nothing drawn or loaded (call it before
    seeding: the skeleton's shapes only). A DataError for a split that cannot be."""
    split = parse_split(cfg.pipeline_split) if cfg.pipeline_split else None
    if cfg.init_from:
        return plan_stages(folder_bytes(cfg.init_from), cfg.pipeline, split)
    return plan_stages(model_bytes(model_args(cfg, meta["vocab_size"])), cfg.pipeline, split)


def micro_batches_of(cfg: TrainConfig, replicas: int) -> int:
    """--micro_batches, or its default, checked against a pipeline's rows: the global
    batch's share of one copy of the pipeline."""
    rows = cfg.global_batch // replicas
    micro = cfg.micro_batches or default_micro_batches(cfg.pipeline, rows)
    check_micro_batches(micro, rows)
    return micro


def adapting(cfg: TrainConfig):
    """What --fine_tune adds to a skeleton: LoRA's or DoRA's adapters, or nothing."""
    return (lambda model: lora.apply_config(model, cfg)) if trains_adapters(cfg.fine_tune) else None


def build_stage(cfg: TrainConfig, plan: StagePlan, meta: dict, data_dir: Path
                ) -> tuple[Stage, Stage]:
    """(this rank's stage: float32 master weights, its compute copy: itself, or a
    bfloat16 twin), built as one process builds its model."""
    adapt = adapting(cfg)
    mx.random.seed(cfg.seed)  # every stage draws what one process draws
    if cfg.init_from:
        stage = load_stage(cfg.init_from, plan, cfg.fine_tune, adapt, meta, data_dir)
    else:
        stage = new_stage(model_args(cfg, meta["vocab_size"]), plan)
    if cfg.dtype != "float32" and is_quantized(stage):
        raise DataError(f"--dtype {cfg.dtype} with a quantized base ({cfg.init_from}) is not "
                        "supported", "use --dtype float32 (the adapters train in float32 on "
                        "the quantized base)")
    compute = compute_copy(stage, lambda: shaped_stage(stage.args, plan, adapt=adapt),
                           dtype_of(cfg.dtype))
    for s in (stage, compute):
        s.grad_checkpoint = cfg.grad_checkpoint
    return stage, compute


def own_tensors(stage: Stage, trainable_only: bool) -> dict[str, mx.array]:
    """The stage's parameters (or trainable ones) that are its own: the last stage's
    copy of a tied embedding is the first stage's."""
    params = stage.trainable_parameters() if trainable_only else stage.parameters()
    held = dict(tree_flatten(params))
    if not stage.plan.first:
        held.pop(TIED, None)
    return held


def stage_writers(layout: HostLayout, pipe: PipelineGroups) -> HostLayout:
    """Who writes this stage's checkpoints, as a layout of the ranks holding the stage
    (one per copy of the pipeline, in `pipe.replicas`' order): of those that see the
    same --out (the world's `layout`, storage.py), the lowest; alone, itself."""
    holders = [r for r in range(len(layout.hosts)) if r % pipe.stages == pipe.stage]
    storage = [next(i for i, q in enumerate(holders) if layout.writer(q) == layout.writer(r))
               for r in holders]
    return HostLayout([layout.hosts[r] for r in holders], pipe.replica, storage)
