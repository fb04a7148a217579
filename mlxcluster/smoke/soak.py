"""A soak's summary: what every rank's ``soak`` events add up to.

The workers run the checks again and again at seeded random sizes
(``worker.run_soak``) and report, about once a second, their running
tally per op: iterations and the slowest iteration (bytes, seconds). Here
the latest tally of each rank becomes one summary: per op the iterations
every rank completed and the slowest iteration seen on any rank; the wrong
results come from the run's check events (a stall is the run's, in
``SmokeReport.stall``).
Pure logic, no I/O.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

SEED_RANGE = 1 << 31  # a seed a person can read out and type again


def new_seed() -> int:
    """A seed for a soak whose user gave none (printed, so that a failure can be replayed)."""
    return random.SystemRandom().randrange(SEED_RANGE)


@dataclass
class OpSoak:
    """One op over the soak: iterations all ranks completed, the slowest one."""

    op: str
    iterations: int
    slowest_bytes: int
    slowest_s: float
    slowest_rank: int


@dataclass
class WrongResult:
    """A result that was not what the check expected: where and the first bad element."""

    rank: int
    op: str
    dtype: str
    size: int  # elements
    bytes: int
    bad_index: int | None
    got: float | None
    expected: float | None
    peer: int | None = None  # send_recv: the rank it came from


@dataclass
class SoakSummary:
    """What a soak proved, or where it stopped."""

    seed: int
    duration_s: float  # asked for
    elapsed_s: float = 0.0  # the longest any rank soaked
    ops: list[OpSoak] = field(default_factory=list)
    wrong: list[WrongResult] = field(default_factory=list)

    @property
    def iterations(self) -> int:
        return sum(o.iterations for o in self.ops)

    def to_dict(self) -> dict:
        return asdict(self)


class SoakWatch:
    """The latest soak event of every rank (events are cumulative)."""

    def __init__(self):
        self.latest: dict[int, dict] = {}

    def add(self, event: dict) -> None:
        rank = event.get("rank")
        if isinstance(rank, int) and isinstance(event.get("ops"), dict):
            self.latest[rank] = event

    def summary(self, seed: int, duration_s: float, failures: list[dict] = ()) -> SoakSummary:
        """Fold the ranks' tallies; ``failures``: the run's failed check events."""
        result = SoakSummary(seed, duration_s)
        result.elapsed_s = max((float(e.get("elapsed", 0.0)) for e in self.latest.values()),
                               default=0.0)
        ops: dict[str, OpSoak] = {}
        for rank, event in sorted(self.latest.items()):
            for op, tally in event["ops"].items():
                slowest = float(tally.get("slowest_s", 0.0))
                seen = ops.setdefault(op, OpSoak(op, 0, 0, -1.0, rank))
                if slowest > seen.slowest_s:
                    seen.slowest_bytes, seen.slowest_s = int(tally.get("slowest_bytes", 0)), slowest
                    seen.slowest_rank = rank
        for op in ops.values():  # completed by every rank that reported
            op.iterations = min(int(e["ops"].get(op.op, {}).get("iterations", 0))
                                for e in self.latest.values())
        result.ops = sorted(ops.values(), key=lambda o: OP_ORDER.get(o.op, len(OP_ORDER)))
        result.wrong = [wrong_result(f) for f in failures]
        return result


OP_ORDER = {"all_sum": 0, "all_gather": 1, "send_recv": 2}


def wrong_result(check: dict) -> WrongResult:
    """A failed check event of the worker (``worker.verdict``) as a WrongResult."""
    return WrongResult(int(check.get("rank", -1)), str(check.get("op", "?")),
                       str(check.get("dtype", "?")), int(check.get("size", 0)),
                       int(check.get("bytes", 0)), check.get("bad_index"), check.get("got"),
                       check.get("expected"), check.get("peer"))
