"""Benchmark arithmetic: percentiles, nccl-tests bandwidths, the alpha-beta fit."""

from __future__ import annotations

import math

import pytest

from mlxcluster.errors import InputError
from mlxcluster.smoke.stats import (
    bus_factor,
    fit_alpha_beta,
    fit_ops,
    format_bytes,
    parse_size,
    parse_size_range,
    percentile,
    slowest_per_iteration,
    summarize,
)


def test_percentile_interpolates_between_ranks():
    values = [4.0, 1.0, 3.0, 2.0, 5.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 5.0
    assert percentile(values, 90) == pytest.approx(4.6)
    assert percentile([1.0, 2.0], 50) == 1.5


def test_iteration_time_is_the_slowest_rank():
    per_rank = [[1.0, 5.0, 2.0], [3.0, 1.0, 2.5], [2.0, 2.0, 9.0, 7.0]]
    assert slowest_per_iteration(per_rank) == [3.0, 5.0, 9.0]


def test_bus_factors_are_nccl_tests():
    assert bus_factor("all_sum", 4) == 1.5  # 2(n-1)/n
    assert bus_factor("all_gather", 4) == 0.75  # (n-1)/n
    assert bus_factor("send_recv", 4) == 1.0
    assert bus_factor("all_sum", 2) == 1.0
    with pytest.raises(ValueError):
        bus_factor("reduce_scatter", 2)


def test_summarize_uses_p50_of_slowest_for_bandwidths():
    # 3 ranks, rank 2 is always 2x slower: its times are the run's times.
    fast = [0.001] * 20
    slow = [0.002] * 19 + [0.004]
    row = summarize("all_sum", "float32", 4_000_000, [fast, fast, slow])
    assert row.ranks == 3
    assert row.p50_s == 0.002
    assert row.p90_s == pytest.approx(0.002)
    assert row.algbw_gbps == pytest.approx(2.0)  # 4e6 B / 2 ms
    assert row.busbw_gbps == pytest.approx(2.0 * 4 / 3)
    assert row.min_s == 0.002


def test_fit_recovers_alpha_and_beta_from_exact_line():
    alpha, beta_bps = 20e-6, 5e9
    points = [(b, alpha + b / beta_bps) for b in (1 << 10, 1 << 16, 1 << 20, 1 << 24)]
    a, beta = fit_alpha_beta(points)
    assert a == pytest.approx(alpha, rel=1e-6)
    assert beta == pytest.approx(5.0, rel=1e-6)  # GB/s


def test_fit_never_reports_negative_latency():
    # Noisy small sizes pull a free fit below zero; refit through the origin.
    points = [(1000, 1e-6), (2000, 1e-6), (1_000_000, 1e-3), (2_000_000, 2.1e-3)]
    a, beta = fit_alpha_beta(points)
    assert a == 0.0
    assert 0.9 < beta < 1.1


def test_fit_flat_times_have_no_bandwidth():
    a, beta = fit_alpha_beta([(1024, 1e-4), (4096, 1e-4), (65536, 0.9e-4)])
    assert beta is None
    assert a == pytest.approx((1e-4 + 1e-4 + 0.9e-4) / 3)
    assert fit_alpha_beta([(1024, 3e-5)]) == (3e-5, None)


def test_fit_ops_groups_rows_by_op():
    rows = [summarize(op, "float32", b, [[1e-5 + b / 1e9] * 3, [1e-5 + b / 1e9] * 3])
            for op in ("all_sum", "send_recv") for b in (1 << 12, 1 << 20, 1 << 24)]
    fits = fit_ops(rows)
    assert [f.op for f in fits] == ["all_sum", "send_recv"]
    assert all(math.isclose(f.beta_gbps, 1.0, rel_tol=1e-6) for f in fits)
    assert all(math.isclose(f.alpha_s, 1e-5, rel_tol=1e-4) for f in fits)


def test_parse_sizes():
    assert parse_size("1K") == 1024
    assert parse_size("256M") == 256 << 20
    assert parse_size("1KiB") == 1024
    assert parse_size("64kb") == 64 << 10
    assert parse_size("4096") == 4096
    assert parse_size("1.5M") == 3 << 19
    assert parse_size_range("1K:256M") == (1024, 256 << 20)
    assert parse_size_range("8M") == (8 << 20, 8 << 20)
    for bad in ("", "K", "lots", "0", "2K:1K"):
        with pytest.raises(InputError):
            parse_size_range(bad)


def test_sizes_must_be_finite_and_at_most_16g():
    """'inf' and '1e400' overflowed int() (OverflowError traceback); a size of
    99999999999999999999G reached the workers, which crashed."""
    for bad in ("inf", "1e400", "1K:inf", "nan", "-inf:1K"):
        with pytest.raises(InputError, match="not a finite number"):
            parse_size_range(bad)
    for bad in ("99999999999999999999G", "1K:17G", "16G:1e30"):
        with pytest.raises(InputError, match="above the limit of 16G"):
            parse_size_range(bad)
    assert parse_size_range("1K:16G") == (1024, 16 << 30)


def test_format_bytes():
    assert format_bytes(1024) == "1K"
    assert format_bytes(3 << 20) == "3M"
    assert format_bytes(1 << 30) == "1G"
    assert format_bytes(1020) == "1020"
