"""Benchmark arithmetic: percentiles, nccl-tests bandwidths, alpha-beta fit.

Pure functions over the per-rank timings the workers report. Conventions are
nccl-tests' (see docs/smoke.md):

* time of one iteration = the slowest rank's time for that iteration;
* algbw = bytes / time, where bytes is the buffer for all_sum, the gathered
  total for all_gather and one message for send_recv;
* busbw = algbw * 2(n-1)/n for all_sum, algbw * (n-1)/n for all_gather,
  algbw for send_recv;
* alpha (latency, s) and beta (bandwidth, bytes/s) fit ``t = alpha + bytes/beta``
  by least squares over every size of one op.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mlxcluster.errors import InputError


@dataclass(frozen=True)
class BenchRow:
    """One op at one size: slowest-rank p50/p90 time and the bandwidths at p50."""

    op: str
    dtype: str
    bytes: int
    ranks: int
    p50_s: float
    p90_s: float
    algbw_gbps: float
    busbw_gbps: float
    min_s: float = 0.0  # fastest iteration (of the slowest rank): the least load-polluted time


@dataclass(frozen=True)
class OpFit:
    """Latency-bandwidth model of one op: t = alpha + bytes / beta."""

    op: str
    alpha_s: float
    beta_gbps: float | None  # None when time does not grow with size


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor for ``op`` on ``n`` ranks."""
    if op == "all_sum":
        return 2 * (n - 1) / n
    if op == "all_gather":
        return (n - 1) / n
    if op == "send_recv":
        return 1.0
    raise ValueError(f"unknown op {op!r}")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def slowest_per_iteration(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Element-wise max over ranks: iteration i took as long as its slowest rank."""
    if not per_rank:
        return []
    length = min(len(times) for times in per_rank)
    return [max(times[i] for times in per_rank) for i in range(length)]


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes per second)."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def summarize(op: str, dtype: str, nbytes: int, per_rank: Sequence[Sequence[float]]) -> BenchRow:
    """One table row from every rank's iteration times of one op and size."""
    times = slowest_per_iteration(per_rank)
    n = len(per_rank)
    p50, p90 = percentile(times, 50), percentile(times, 90)
    alg = algbw(nbytes, p50)
    return BenchRow(op, dtype, nbytes, n, p50, p90, alg, alg * bus_factor(op, n), min(times))


def fit_alpha_beta(points: Iterable[tuple[int, float]]) -> tuple[float, float | None]:
    """Least-squares fit of ``t = alpha + bytes / beta`` to (bytes, seconds).

    Returns (alpha seconds, beta GB/s). Latency cannot be negative: when the
    free fit gives alpha < 0 the line is refitted through the origin. beta is
    None when time does not grow with size (flat or noisy at these sizes),
    and alpha is then the mean time. One point gives alpha = t."""
    pts = [(float(b), float(t)) for b, t in points]
    if not pts:
        raise ValueError("fit of no points")
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx == 0:
        return mean_y, None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in pts) / sxx
    alpha = mean_y - slope * mean_x
    if slope <= 0:
        return mean_y, None
    if alpha < 0:
        alpha, slope = 0.0, sum(x * y for x, y in pts) / sum(x * x for x in xs)
    return alpha, 1 / slope / 1e9


def fit_ops(rows: Iterable[BenchRow]) -> list[OpFit]:
    """One alpha-beta fit per op over its rows' p50 times, ops in first-seen order."""
    by_op: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        by_op.setdefault(row.op, []).append((row.bytes, row.p50_s))
    return [OpFit(op, *fit_alpha_beta(points)) for op, points in by_op.items()]


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


MAX_SIZE = 16 << 30  # 16 GiB: a buffer per rank (x ranks for all_gather) far above any link test


def parse_size(text: str) -> int:
    """'1K' -> 1024, '256M' -> 268435456, '4096' -> 4096 (binary units, 'KiB' too);
    at least 1 byte, at most MAX_SIZE."""
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    number, unit = raw, ""
    if raw and raw[-1] in _UNITS:
        number, unit = raw[:-1], raw[-1]
    try:
        amount = float(number)
    except ValueError:
        raise InputError(f"bad size {text!r}", "use a number of bytes with K, M or G, e.g. 64K") from None
    if not math.isfinite(amount):  # 'inf', 'nan', '1e400' (float overflows to inf)
        raise InputError(f"bad size {text!r}: not a finite number",
                         "use a number of bytes with K, M or G, e.g. 64K")
    if amount * _UNITS[unit] > MAX_SIZE:
        raise InputError(f"size {text!r} is above the limit of {format_bytes(MAX_SIZE)}",
                         f"use sizes up to {format_bytes(MAX_SIZE)}, e.g. --sizes 1K:256M")
    value = int(amount * _UNITS[unit])
    if value < 1:
        raise InputError(f"bad size {text!r}: must be at least 1 byte")
    return value


def parse_size_range(text: str) -> tuple[int, int]:
    """'1K:256M' -> (1024, 268435456); a single size means LO = HI."""
    lo_text, _, hi_text = text.partition(":")
    lo = parse_size(lo_text)
    hi = parse_size(hi_text) if hi_text else lo
    if hi < lo:
        raise InputError(f"bad size range {text!r}: {hi} < {lo}", "write LO:HI, e.g. 1K:256M")
    return lo, hi


def format_bytes(n: int) -> str:
    """1024 -> '1K', 3145728 -> '3M', 1000 -> '1000' (exact binary units only)."""
    for unit in ("G", "M", "K"):
        scale = _UNITS[unit]
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)
