"""`python -m tests.cpu_stream_standin TRAIN-ARGS`: the trainer with its collectives named on
the CPU stream, as on a Mac's GPU (reference_train.precision.collective_stream returns
mx.cpu there, None on Linux's CPU). Only the choice is forced; the rest is the trainer."""

from __future__ import annotations

import sys

import mlx.core as mx

import reference_train.precision as precision
import reference_train.sharded_optimizer as sharded_optimizer
import reference_train.train as train


def on_cpu(device=None):
    return mx.cpu


if __name__ == "__main__":
    precision.collective_stream = on_cpu
    sharded_optimizer.collective_stream = on_cpu
    sys.exit(train.main(sys.argv[1:]))
