"""Pick the winner from alternating rounds of measurements: pure functions.

Every candidate ran once per round, in alternating order, so the load of the
moment (a shared machine, another job) weighs on all of them alike within a
round. A candidate is therefore compared with the best one **round by
round** (paired): it is *clearly* beaten only when the best's median
busbw is ahead by more than the noise (``NOISE_FLOOR`` or the spread of the
paired ratios, whichever is larger) AND the best beat it in at least
``WIN_SHARE`` of the rounds both completed, so one noisy round changes
nothing. Candidates not clearly beaten are *tied* with the best; among them
the simplest one (fewest connections, default interface) is chosen.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from mlxcluster.tune.candidates import Candidate

NOISE_FLOOR = 0.03  # 3%: differences below this are never called a win
WIN_SHARE = 0.75  # the best must win at least this share of the paired rounds


@dataclass(frozen=True)
class Sample:
    """One candidate's result for one op and size in one round."""

    candidate: Candidate
    round: int
    op: str
    bytes: int
    busbw_gbps: float
    p50_s: float
    p90_s: float


@dataclass(frozen=True)
class Score:
    """One candidate at one op and size, over every round it completed."""

    candidate: Candidate
    busbw_gbps: float  # median over rounds
    samples: tuple[float, ...]
    p50_s: float  # median over rounds of each round's p50
    p90_s: float
    tcp_gbps: float | None = None  # raw TCP stream with as many connections

    @property
    def of_tcp(self) -> float | None:
        """busbw as a share of the raw TCP stream (None without one)."""
        return self.busbw_gbps / self.tcp_gbps if self.tcp_gbps else None


@dataclass(frozen=True)
class Versus:
    """The best candidate against another, paired round by round."""

    other: Candidate
    margin: float  # median of best/other - 1 over shared rounds
    noise: float  # the threshold the margin had to pass
    wins: int  # rounds the best was faster
    rounds: int  # rounds both completed
    clear: bool

    def text(self) -> str:
        verdict = "clearly ahead" if self.clear else "tie within noise"
        return (f"{self.margin:+.1%} vs {self.other.label} (noise {self.noise:.1%}, "
                f"won {self.wins}/{self.rounds} rounds): {verdict}")


@dataclass(frozen=True)
class Choice:
    """The pick at one op and size."""

    op: str
    bytes: int
    scores: tuple[Score, ...]  # best first
    best: Candidate  # highest median busbw
    winner: Candidate  # the simplest of those tied with the best
    tied: tuple[Candidate, ...]  # every candidate tied with the best (the best included)
    versus: tuple[Versus, ...]  # the best against every other candidate
    failed: dict[Candidate, str] = field(default_factory=dict)

    @property
    def runner_up(self) -> Versus | None:
        """The closest candidate outside the tie, if any."""
        beaten = [v for v in self.versus if v.clear]
        return min(beaten, key=lambda v: v.margin) if beaten else None

    @property
    def confidence(self) -> str:
        """high: the winner is clearly ahead of everything else; tie: others
        within the noise; low: one round only (no noise estimate)."""
        rounds = max((len(s.samples) for s in self.scores), default=0)
        if rounds < 2:
            return "low"
        return "tie" if len(self.tied) > 1 else "high"


def relative_spread(ratios: list[float]) -> float:
    """Half the inter-quartile range of the paired ratios, relative (robust to
    one wild round); with two or three rounds, half their range; with one,
    nothing is known beyond the floor (the choice then has low confidence)."""
    if len(ratios) < 2:
        return 0.0
    if len(ratios) < 4:
        return (max(ratios) - min(ratios)) / 2
    q = statistics.quantiles(ratios, n=4)
    return (q[2] - q[0]) / 2


def paired(best: list[Sample], other: list[Sample], other_candidate: Candidate) -> Versus:
    """``best`` against ``other`` over the rounds both completed."""
    mine = {s.round: s.busbw_gbps for s in best}
    theirs = {s.round: s.busbw_gbps for s in other}
    shared = sorted(set(mine) & set(theirs))
    ratios = [mine[r] / theirs[r] for r in shared if theirs[r] > 0]
    if not ratios:
        return Versus(other_candidate, math.inf, 0.0, len(shared), len(shared), True)
    margin = statistics.median(ratios) - 1
    noise = max(NOISE_FLOOR, relative_spread(ratios))
    wins = sum(r > 1 for r in ratios)
    clear = margin > noise and wins >= math.ceil(WIN_SHARE * len(ratios))
    return Versus(other_candidate, margin, noise, wins, len(ratios), clear)


def choose(samples: list[Sample], op: str, nbytes: int,
           tcp: dict[Candidate, float] | None = None,
           failed: dict[Candidate, str] | None = None) -> Choice | None:
    """The pick among the candidates measured at ``op`` and ``nbytes``
    (None when none was). ``failed`` candidates (a round that did not pass)
    never win; ``tcp`` gives each candidate's raw TCP stream in GB/s."""
    failed = dict(failed or {})
    by: dict[Candidate, list[Sample]] = {}
    for s in samples:
        if s.op == op and s.bytes == nbytes and s.candidate not in failed:
            by.setdefault(s.candidate, []).append(s)
    if not by:
        return None
    scores = sorted((score(c, rows, (tcp or {}).get(c)) for c, rows in by.items()),
                    key=lambda s: (-s.busbw_gbps, s.candidate.cost))
    best = scores[0].candidate
    versus = tuple(paired(by[best], by[s.candidate], s.candidate) for s in scores[1:])
    tied = (best, *(v.other for v in versus if not v.clear))
    winner = min(tied, key=lambda c: c.cost)
    return Choice(op, nbytes, tuple(scores), best, winner, tied, versus, failed)


def score(candidate: Candidate, rows: list[Sample], tcp_gbps: float | None) -> Score:
    return Score(candidate, statistics.median(s.busbw_gbps for s in rows),
                 tuple(s.busbw_gbps for s in sorted(rows, key=lambda s: s.round)),
                 statistics.median(s.p50_s for s in rows), statistics.median(s.p90_s for s in rows),
                 tcp_gbps)


def deciding_size(sizes: list[int], preferred: int = 32 << 20) -> int:
    """The size the overall winner is chosen at: 32 MiB (the groups
    nn.average_gradients sends) when measured, else the largest."""
    return preferred if preferred in sizes else max(sizes)
