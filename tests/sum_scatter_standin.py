"""`python -m tests.sum_scatter_standin TRAIN-ARGS`: the trainer as the ranks of a
backend with ``sum_scatter`` (JACCL, NCCL) run it, on ring.

No backend here has ``mx.distributed.sum_scatter`` (ring and MPI raise; JACCL
needs Thunderbolt 5, NCCL CUDA). So that the trainer's reduce-scatter branch
(--shard_optimizer where the backend has one) runs across real ranks, this
puts in its place the same collective built from ring's ``all_sum``: the sum
of every rank's array, of which rank r receives the r-th of group.size()
equal pieces along axis 0 (MLX's definition, mlx/distributed/ops.cpp), and
makes the trainer believe the backend has it. Only the primitive is a
stand-in; everything around it is the trainer's own code.
"""

from __future__ import annotations

import sys

import mlx.core as mx

import reference_train.data_parallel as data_parallel
import reference_train.train as train

all_sum = mx.distributed.all_sum


def sum_scatter(x: mx.array, *, group=None, stream=None) -> mx.array:
    if x.shape[0] % group.size():
        raise ValueError("[sum_scatter] axis 0 must be divisible by the group size")  # as MLX
    piece = x.shape[0] // group.size()
    at = group.rank() * piece
    return all_sum(x, group=group, stream=stream)[at:at + piece]


if __name__ == "__main__":
    mx.distributed.sum_scatter = sum_scatter
    data_parallel.has_sum_scatter = lambda backend, version: True  # DataParallel asks it
    sys.exit(train.main(sys.argv[1:]))
