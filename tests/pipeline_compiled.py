"""A pipeline step compiled against the same step run eagerly, on each rank: run
under mlx.launch by tests/test_pipeline.py (tests.train_support.run_trainer(
module="tests.pipeline_compiled")).

    python -m tests.pipeline_compiled --report DIR --batches 3 --pipeline 2 [trainer flags]

builds the trainer's own parts (train.Trainer: this rank's stage and its step, compiled
by default) and a second step on the same stage with `compile=False`; both compute
the loss and gradients (PipelineStep.step_gradients) of the first --batches global
batches, the stage's weights moved (SGD) after each. Writes DIR/rank{R}.json: how many times each step built a micro-batch's pass
in Python (`traced`), the micro-batches run, and the largest differences between the
two (the loss, and every gradient relative to its largest magnitude).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from reference_train.config import build_config
from reference_train.launch_env import init_group
from reference_train.pipeline import PipelineStep
from reference_train.train import Trainer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--report", required=True)
    parser.add_argument("--batches", type=int, default=3)
    mine, argv = parser.parse_known_args(argv)
    group = init_group()
    trainer = Trainer(build_config(argv), group, log=lambda _: None)
    compiled = trainer.step_fn
    assert isinstance(compiled, PipelineStep) and compiled.compile
    eager = PipelineStep(compiled.stage, compiled.group, compiled.micro_batches,
                         compute=compiled.compute, compute_dtype=compiled.compute_dtype,
                         schedule=compiled.schedule, compile=False,
                         random_state=compiled.random_state)
    worst_loss = worst_grad = 0.0
    for n in range(mine.batches):
        x, y, *weights = trainer.train_data.batch(n)
        w = weights[0] if weights else None
        mx.random.seed(1000 + n)  # both draw the same dropout masks
        loss, grads = compiled.step_gradients(x, y, w)
        mx.random.seed(1000 + n)
        loss_eager, grads_eager = eager.step_gradients(x, y, w)
        worst_loss = max(worst_loss, abs(loss.item() - loss_eager.item()) / abs(loss_eager.item()))
        assert set(grads) == set(grads_eager)
        for name, g in grads.items():
            want = grads_eager[name]
            scale = max(mx.abs(want).max().item(), 1e-30)
            worst_grad = max(worst_grad, mx.abs(g - want).max().item() / scale)
        # a step of plain SGD on the stage both share: a pass that kept the first
        # batch's weights (compiled as constants) would differ from the next batch on
        params = dict(tree_flatten(compiled.stage.parameters()))
        compiled.stage.update(tree_unflatten([(name, params[name] - 0.5 * g)
                                              for name, g in grads_eager.items()]))
        mx.eval(compiled.stage.parameters())
    report = {"traced_compiled": compiled.traced, "traced_eager": eager.traced,
              "micro_batches_run": mine.batches * compiled.micro_batches,
              "worst_loss": worst_loss, "worst_grad": worst_grad, "loss": loss.item()}
    (Path(mine.report) / f"rank{group.rank()}.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
