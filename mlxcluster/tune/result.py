"""The outcome of a tune run: one choice per op and size, the overall pick
(all_sum at 32 MiB, or the largest size measured), and its JSON form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlxcluster.tune.candidates import Candidate
from mlxcluster.tune.measure import OPS, Measurements, Plan
from mlxcluster.tune.select import Choice, choose, deciding_size


@dataclass
class TuneResult:
    backends: tuple[str, ...]
    hosts: tuple[str, ...]
    plan: Plan
    candidates: list[Candidate]
    measurements: Measurements
    n_ips: int = 1
    choices: list[Choice] = field(default_factory=list)  # by op, then size
    decision: Choice | None = None  # all_sum at the deciding size
    duration_s: float = 0.0
    files: list[str] = field(default_factory=list)  # written hostfile(s)

    @property
    def winner(self) -> Candidate | None:
        return self.decision.winner if self.decision else None


def decide(result: TuneResult) -> TuneResult:
    """Fill in the choices and the overall decision from the measurements."""
    m = result.measurements
    tcp = {c: m.tcp_gbps(c.streams(result.n_ips)) for c in result.candidates}
    result.choices = [c for op in OPS for size in result.plan.sizes
                      if (c := choose(m.samples, op, size, tcp, m.failed)) is not None]
    measured = sorted({c.bytes for c in result.choices if c.op == "all_sum"})
    if measured:
        at = deciding_size(measured)
        result.decision = next(c for c in result.choices if c.op == "all_sum" and c.bytes == at)
    return result


def candidate_dict(c: Candidate) -> dict[str, Any]:
    return {"label": c.label, "backend": c.backend,
            "connections_per_ip": c.connections if c.backend == "ring" else None,
            "btl_tcp_links": c.tcp_links if c.backend == "mpi" else None,
            "mpi_allreduce": c.allreduce if c.backend == "mpi" else None,
            "ip_index": c.ip_index}


def choice_dict(choice: Choice) -> dict[str, Any]:
    return {
        "op": choice.op, "bytes": choice.bytes, "winner": choice.winner.label,
        "best": choice.best.label, "tied": [c.label for c in choice.tied],
        "confidence": choice.confidence,
        "margin": (choice.runner_up.margin if choice.runner_up else None),
        "rows": [{"candidate": s.candidate.label, "busbw_gbps": s.busbw_gbps,
                  "busbw_rounds_gbps": list(s.samples), "tcp_gbps": s.tcp_gbps,
                  "of_tcp": s.of_tcp, "p50_s": s.p50_s, "p90_s": s.p90_s} for s in choice.scores],
        "versus": [{"candidate": v.other.label, "margin": v.margin, "noise": v.noise,
                    "wins": v.wins, "rounds": v.rounds, "clear": v.clear} for v in choice.versus],
    }


def to_dict(result: TuneResult) -> dict[str, Any]:
    """The --json document (docs/tune.md)."""
    m = result.measurements
    return {
        "hosts": list(result.hosts), "backends": list(result.backends),
        "sizes": list(result.plan.sizes), "budget_s": result.plan.budget_s,
        "iters": result.plan.iters, "rounds": m.rounds, "round_s": m.round_s,
        "stopped_by": m.stopped_by, "duration_s": result.duration_s,
        "candidates": [candidate_dict(c) for c in result.candidates],
        "failed": {c.label: why for c, why in m.failed.items()},
        "tcp_gbps": {str(n): values for n, values in sorted(m.tcp.items())},
        "tcp_errors": {str(n): e for n, e in m.tcp_errors.items()},
        "winner": candidate_dict(result.winner) if result.winner else None,
        "decision": choice_dict(result.decision) if result.decision else None,
        "choices": [choice_dict(c) for c in result.choices],
        "files": result.files,
    }
