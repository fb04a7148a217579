"""One pipeline step's gradients, each rank's saved: run under mlx.launch by
tests/test_pipeline.py (tests.train_support.run_trainer(module="tests.pipeline_grads")).

    python -m tests.pipeline_grads --grads_out DIR --pipeline 2 --micro_batches 4 [trainer flags]

builds the trainer's own parts (train.Trainer: this rank's stage, its step function)
and writes DIR/rank{R}.safetensors: the gradients stage R updates for global batch 0
(PipelineStep.step_gradients: float32, before clipping) and "@loss", the batch's loss.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlx.core as mx

from reference_train.config import build_config
from reference_train.launch_env import init_group
from reference_train.train import Trainer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--grads_out", required=True)
    mine, argv = parser.parse_known_args(argv)
    group = init_group()
    trainer = Trainer(build_config(argv), group, log=lambda _: None)
    x, y, *weights = trainer.train_data.batch(0)
    loss, grads = trainer.step_fn.step_gradients(x, y, weights[0] if weights else None)
    mx.save_safetensors(str(Path(mine.grads_out) / f"rank{group.rank()}.safetensors"),
                        {**grads, "@loss": loss})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
