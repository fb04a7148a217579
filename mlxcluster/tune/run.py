"""One tune run: candidates, alternating measurement rounds, the decision.

Library code: prints nothing; progress goes to an optional callback."""

from __future__ import annotations

import time
from collections.abc import Callable

from mlxcluster.errors import InputError
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.smoke.worker import sweep_sizes
from mlxcluster.tune.candidates import (
    MPI_ALLREDUCE,
    MPI_TCP_LINKS,
    RING_CONNECTIONS,
    make_candidates,
)
from mlxcluster.tune.measure import (
    Plan,
    RunCandidate,
    RunStream,
    measure,
    smoke_runner,
    stream_runner,
)
from mlxcluster.tune.result import TuneResult, decide


def tune_sizes(lo: int, hi: int) -> tuple[int, ...]:
    """The powers of two the smoke worker sweeps from ``lo`` to ``hi``."""
    return tuple(sweep_sizes(lo, hi))


def run_tune(hosts: tuple[RankHost, ...], backends: tuple[str, ...], plan: Plan,
             run_candidate: RunCandidate | None = None, run_stream: RunStream | None = None,
             clock: Callable[[], float] = time.monotonic,
             on_progress: Callable[[str], None] | None = None,
             ring_connections: tuple[int, ...] = RING_CONNECTIONS,
             mpi_tcp_links: tuple[int, ...] = MPI_TCP_LINKS,
             mpi_allreduce: tuple[str, ...] = MPI_ALLREDUCE) -> TuneResult:
    """Measure every candidate for ``backends`` on ``hosts`` and decide.
    The raw TCP stream runs from the first host to the second (the ring's
    first hop) on their first data IPs."""
    if len(hosts) < 2:
        raise InputError(f"tune needs at least 2 hosts, got {len(hosts)}",
                         "MLX's backends do not start a group of one; list more hosts")
    candidates = make_candidates(backends, hosts, ring_connections, mpi_tcp_links, mpi_allreduce)
    n_ips = min(len(h.ips) for h in hosts)
    started = clock()
    m = measure(candidates, plan, run_candidate or smoke_runner(hosts),
                run_stream or stream_runner(hosts[0], hosts[1]), n_ips, clock, on_progress)
    result = TuneResult(backends, tuple(h.name for h in hosts), plan, candidates, m, n_ips)
    result.duration_s = clock() - started
    return decide(result)
