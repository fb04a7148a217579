"""`python -m tests.cpu_stream_standin TRAIN-ARGS`: the trainer with its collectives named on
the CPU stream, as on a Mac's GPU (reference_train.collectives.collective_stream returns
mx.cpu there, None on Linux's CPU). Only the choice is forced; the rest is the trainer."""

from __future__ import annotations

import sys

import mlx.core as mx

import reference_train.collectives as collectives
import reference_train.train as train


def on_cpu(device=None):
    return mx.cpu


if __name__ == "__main__":
    collectives.collective_stream = on_cpu  # every collective asks it at its call
    sys.exit(train.main(sys.argv[1:]))
