"""`python -m reference_train.pipeline_train`: pipeline-parallel training, one rank per stage.

    mlx.launch -n 2 --backend ring --python "$(which python)" -- \\
        -m reference_train.pipeline_train --pipeline 2 [--pipeline_split 1,1] \\
        [--micro_batches 4] [--pipeline_schedule 1f1b|gpipe] --config tiny --out runs/pp \\
        [any trainer flag]

The stand-in loop until the trainer's loop is handed a step function (then
`--pipeline` joins `python -m reference_train.train`): the same settings, data,
initial weights, learning-rate schedule and losses as train.py, each rank holding
only its stage (stage_load.py) and stepping with pipeline.PipelineStep. Rank 0
writes OUT/metrics.jsonl (or mlxcluster's record) as train.py does, one record a
logged step. Not here yet: evaluation, checkpoints and resume, OUT/model and
OUT/adapters, heartbeats and the stop request.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim

from . import kernels, lora
from .config import TrainConfig, build_config, model_args
from .data import ShardedBatches, load_meta, open_split
from .errors import DataError
from .hf_io import is_quantized
from .launch_env import current_backend, init_group
from .metrics import save_record, start_record
from .pipeline import PipelineStep, SingleReplica, Stage
from .precision import compute_copy, dtype_of
from .prepare import ensure_default_data
from .stage_load import held_bytes, load_stage, model_bytes, new_stage, shaped_stage
from .stages import (
    StagePlan,
    bubble_fraction,
    check_micro_batches,
    check_schedule,
    check_world,
    default_micro_batches,
    folder_bytes,
    held_at_once,
    parse_split,
    plan_stages,
    schedule,
)
from .train import make_out_dir
from .train import schedule as lr_schedule


@dataclass
class StageRun:
    """One rank's part of a pipeline run: its plan, master and compute stages, data."""

    plan: StagePlan
    stage: Stage
    compute: Stage
    batches: ShardedBatches
    n_layers: int


def pipeline_options(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(--pipeline, --pipeline_split, --micro_batches; the trainer's own flags)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--pipeline", type=int, required=True)
    parser.add_argument("--pipeline_split", default="")
    parser.add_argument("--micro_batches", type=int, default=0)  # 0: default_micro_batches
    parser.add_argument("--pipeline_schedule", default="1f1b")  # or gpipe (stages.schedule)
    return parser.parse_known_args(argv)


def data_of(cfg: TrainConfig) -> tuple[Path, dict]:
    """(the data directory, its meta.json)."""
    data_dir = Path(cfg.data) if cfg.data else ensure_default_data()
    return data_dir, load_meta(data_dir)


def plan_for(cfg: TrainConfig, n_stages: int, split: list[int] | None) -> list[StagePlan]:
    """The stages of this run's model (--init_from's folder, or the config's shape), from
    the bytes of its parts: no weight is loaded. A DataError for a split that cannot be."""
    if cfg.init_from:
        return plan_stages(folder_bytes(cfg.init_from), n_stages, split)
    return plan_stages(model_bytes(model_args(cfg, data_of(cfg)[1]["vocab_size"])), n_stages,
                       split)


def build_stage(cfg: TrainConfig, plan: StagePlan) -> StageRun:
    """This rank's stage, built as one process builds its model (the same seed and
    draws), with its compute copy and the whole global batch's data."""
    kernels.use(cfg.kernels)
    data_dir, meta = data_of(cfg)
    batches = ShardedBatches(open_split(data_dir, "train", cfg.block_size), cfg.global_batch,
                             SingleReplica(), cfg.seed)
    adapt = (lambda model: lora.apply_config(model, cfg)) if cfg.fine_tune == "lora" else None
    mx.random.seed(cfg.seed)
    if cfg.init_from:
        stage = load_stage(cfg.init_from, plan, cfg.fine_tune, adapt, meta, data_dir)
    else:
        stage = new_stage(model_args(cfg, meta["vocab_size"]), plan)
    if cfg.dtype != "float32" and is_quantized(stage):
        raise DataError(f"--dtype {cfg.dtype} with a quantized base ({cfg.init_from}) is not "
                        "supported", "use --dtype float32")
    compute = compute_copy(stage, lambda: shaped_stage(stage.args, plan, adapt=adapt),
                           dtype_of(cfg.dtype))
    for s in (stage, compute):
        s.grad_checkpoint = cfg.grad_checkpoint
    return StageRun(plan, stage, compute, batches, stage.args.n_layers)


def make_step(cfg: TrainConfig, run: StageRun, group, micro_batches: int,
              schedule: str = "1f1b") -> PipelineStep:
    """The stage's step, with train.py's optimizer and learning-rate schedule."""
    optimizer = optim.AdamW(learning_rate=lr_schedule(cfg),
                            betas=[cfg.beta1, cfg.beta2], weight_decay=cfg.weight_decay)
    return PipelineStep(run.stage, optimizer, group, micro_batches, cfg.grad_clip,
                        run.compute, dtype_of(cfg.dtype), schedule)


def main(argv: list[str] | None = None) -> int:
    try:
        opts, rest = pipeline_options(sys.argv[1:] if argv is None else argv)
        cfg = build_config(rest)
        split = parse_split(opts.pipeline_split) if opts.pipeline_split else None
        plans = plan_for(cfg, opts.pipeline, split)  # before any rank starts: bad splits end here
        micro_batches = opts.micro_batches or default_micro_batches(opts.pipeline, cfg.global_batch)
        check_micro_batches(micro_batches, cfg.global_batch)
        check_schedule(opts.pipeline_schedule)
        group = init_group()
        rank = group.rank()
        check_world(opts.pipeline, group.size(), current_backend(group))
        run = build_stage(cfg, plans[rank])
        print(f"rank {rank}: {run.plan.describe(run.n_layers)} (held: "
              f"{held_bytes(run.stage) / 2**20:.2f} MiB)", flush=True)
        step = make_step(cfg, run, group, micro_batches, opts.pipeline_schedule)
        out = Path(cfg.out)
        metrics = out / "metrics.jsonl"
        if rank == 0:
            make_out_dir(out)
            held = held_at_once(schedule(opts.pipeline_schedule, 0, opts.pipeline, micro_batches))
            print(f"pipeline of {opts.pipeline} stages, {micro_batches} micro-batches of "
                  f"{cfg.global_batch // micro_batches} rows, {opts.pipeline_schedule}: bubble "
                  f"{bubble_fraction(opts.pipeline, micro_batches):.0%}, at most {held} "
                  "micro-batches' activations held", flush=True)
            start_record(metrics, 0, group.size())
        last = min(cfg.steps, cfg.stop_after) if cfg.stop_after else cfg.steps
        for n in range(last):
            start = time.perf_counter()
            x, y, *weights = run.batches.batch(n)
            result = step(x, y, weights[0] if weights else None)
            seconds = time.perf_counter() - start
            if rank == 0 and ((n + 1) % cfg.log_every == 0 or n + 1 == last):
                record = {"step": n + 1, "loss": result.loss,
                          "tokens_per_s": round(result.tokens / seconds, 1),
                          "lr": float(step.optimizer.learning_rate.item()),
                          "grad_norm": result.grad_norm, "ranks": group.size(),
                          "pipeline": opts.pipeline, "micro_batches": micro_batches,
                          "schedule": opts.pipeline_schedule,
                          "dtype": cfg.dtype, **result.split}
                print(f"step {n + 1:>6}/{cfg.steps} | loss {result.loss:.4f} | "
                      f"{record['tokens_per_s']:,.0f} tok/s | rank 0 waited "
                      f"{result.split['wait_s'] * 1000:.0f} ms", flush=True)
                save_record(metrics, record)
    except (ValueError, DataError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
