"""What the launcher said: how many ranks, which backend, and the group itself.

mlx.launch and mpirun tell each process its place through environment
variables; MLX reads them in ``mx.distributed.init()`` and, when the backend
fails to start, silently gives a group of 1. This module reads the same
variables, so that the trainer can refuse that silent group and know which
backend it runs on (the sharded optimizer reduce-scatters only where the
backend has ``sum_scatter``).

    mlx.launch --backend ring   MLX_HOSTFILE, MLX_RANK
    mlx.launch --backend jaccl  MLX_IBV_DEVICES, MLX_JACCL_COORDINATOR, MLX_RANK
    mlx.launch --backend nccl   MLX_RANK, MLX_WORLD_SIZE (and a CUDA device)
    mpirun (Open MPI / MPICH)   OMPI_COMM_WORLD_SIZE / PMI_SIZE, PMIX_RANK
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import mlx.core as mx

# Backends with a reduce-scatter, from the mlx release that added it
# (docs/training-reference.md has the table and its sources). Ring raises
# "[ring] sum_scatter not supported" (on macOS the error can hang every rank
# instead, ml-explore/mlx#4285) and MPI "[mpi] sum_scatter not yet
# implemented": the backend is read from the launch, never tried.
SUM_SCATTER_SINCE = {"nccl": (0, 30, 0), "jaccl": (0, 32, 1)}


def expected_world_size(env: Mapping[str, str] = os.environ) -> int | None:
    """The number of ranks a launcher asked for, when it says so in the environment."""
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MLX_WORLD_SIZE"):
        if env.get(var, "").isdigit():
            return int(env[var])
    hostfile = env.get("MLX_HOSTFILE")
    if hostfile and os.path.isfile(hostfile):
        try:
            hosts = json.loads(Path(hostfile).read_text() or "[]")
        except ValueError:
            return None
        return len(hosts) if isinstance(hosts, list) and hosts else None
    return None


def launched_backend(env: Mapping[str, str], cuda: bool) -> str:
    """The backend ``mx.distributed.init()`` picks for this launch, read from
    what the launchers set, in the order MLX tries them (distributed.cpp:
    nccl on CUDA, ring, mpi, jaccl); "none" for a single process."""
    if cuda and "MLX_RANK" in env and "MLX_WORLD_SIZE" in env:
        return "nccl"
    if "MLX_HOSTFILE" in env and "MLX_RANK" in env:
        return "ring"
    if any(var in env for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")):
        return "mpi"
    if (any(var in env for var in ("JACCL_IBV_DEVICES", "MLX_IBV_DEVICES"))
            and any(var in env for var in ("JACCL_COORDINATOR", "MLX_JACCL_COORDINATOR"))):
        return "jaccl"
    return "none"


def has_sum_scatter(backend: str, mlx_version: str) -> bool:
    """Whether ``backend`` of this mlx release has ``mx.distributed.sum_scatter``."""
    since = SUM_SCATTER_SINCE.get(backend)
    if since is None:
        return False
    release = tuple(int(p) for p in mlx_version.split(".")[:3] if p.isdigit())
    return release >= since


def init_group():
    """mx.distributed.init(), refusing the silent group of 1 a failed backend gives."""
    hostfile = os.environ.get("MLX_HOSTFILE")
    if hostfile and os.path.isfile(hostfile) and not Path(hostfile).read_text().strip():
        # `mlx.launch -n 1` writes an empty hostfile, which init() fails to parse.
        del os.environ["MLX_HOSTFILE"]
    group = mx.distributed.init()
    expected = expected_world_size()
    if expected and expected > 1 and group.size() != expected:
        raise RuntimeError(
            f"launched as {expected} ranks but mx.distributed.init() gave a group of "
            f"{group.size()}: the distributed backend did not start (for MPI, is "
            "MLX_MPI_LIBNAME the libmpi of the mpirun used?)")
    return group


def current_backend(group) -> str:
    """This run's backend: "none" for a group of one, else read from the launch."""
    if group.size() == 1:
        return "none"
    cuda = hasattr(mx, "cuda") and mx.cuda.is_available()
    return launched_backend(os.environ, cuda)
