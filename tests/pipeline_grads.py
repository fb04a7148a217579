"""One pipeline step's gradients, each rank's saved: run under mlx.launch by
tests/test_pipeline.py (tests.train_support.run_trainer(module="tests.pipeline_grads")).

    python -m tests.pipeline_grads --grads_out DIR --pipeline 2 --micro_batches 4 [trainer flags]

writes DIR/rank{R}.safetensors: the gradients stage R updates for global batch 0
(PipelineStep.step_gradients: float32, before clipping) and "@loss", the batch's loss.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlx.core as mx

from reference_train.config import build_config
from reference_train.launch_env import init_group
from reference_train.pipeline_train import build_stage, make_step, pipeline_options, plan_for
from reference_train.stages import parse_split


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--grads_out", required=True)
    mine, argv = parser.parse_known_args(argv)
    opts, rest = pipeline_options(argv)
    cfg = build_config(rest)
    group = init_group()
    split = parse_split(opts.pipeline_split) if opts.pipeline_split else None
    run = build_stage(cfg, plan_for(cfg, opts.pipeline, split)[group.rank()])
    step = make_step(cfg, run, group, opts.micro_batches)
    x, y, *weights = run.batches.batch(0)
    loss, grads = step.step_gradients(x, y, weights[0] if weights else None)
    mx.save_safetensors(str(Path(mine.grads_out) / f"rank{group.rank()}.safetensors"),
                        {**grads, "@loss": loss})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
