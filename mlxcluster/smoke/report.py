"""Smoke reports as plain data (for ``--json``) and as a PNG (``--plot``).

The JSON form is documented by example in docs/smoke.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from mlxcluster.errors import InputError
from mlxcluster.smoke.run import SmokeReport

JSON_VERSION = 1


def report_to_dict(report: SmokeReport) -> dict:
    """One backend's report as JSON-ready data."""
    return {
        "backend": report.backend,
        "status": report.status,
        "reason": report.reason,
        "run_id": report.run_id,
        "duration_s": round(report.duration_s, 3),
        "checks": report.checks,
        "ranks": [asdict(r) for r in report.ranks],
        "bench": [asdict(b) for b in report.bench],
        "fits": [asdict(f) for f in report.fits],
        "cleanup_problems": report.cleanup_problems,
        "command": report.command,
    }


def reports_to_dict(reports: Sequence[SmokeReport], exit_code: int) -> dict:
    """Every backend's report plus the overall verdict and exit code."""
    return {
        "version": JSON_VERSION,
        "ok": exit_code == 0,
        "exit_code": exit_code,
        "backends": [report_to_dict(r) for r in reports],
    }


def write_plot(reports: Sequence[SmokeReport], path: str) -> None:
    """A PNG of bus bandwidth and p50 latency against size, one line per
    backend and op (needs matplotlib: ``pip install mlxcluster[plot]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib", "pip install 'mlxcluster[plot]'") from None
    rows = [(r.backend, b) for r in reports for b in r.bench]
    if not rows:
        raise InputError("--plot needs benchmark figures", "add --bench")
    fig, (ax_bw, ax_lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    series: dict[tuple[str, str], list] = {}
    for backend, b in rows:
        series.setdefault((backend, b.op), []).append(b)
    for (backend, op), points in series.items():
        points.sort(key=lambda b: b.bytes)
        xs = [b.bytes for b in points]
        label = f"{backend} {op}"
        ax_bw.plot(xs, [b.busbw_gbps for b in points], marker="o", label=label)
        ax_lat.plot(xs, [b.p50_s * 1e6 for b in points], marker="o", label=label)
    for ax, ylabel in ((ax_bw, "bus bandwidth (GB/s)"), (ax_lat, "p50 time (us)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_lat.set_yscale("log")
    ax_bw.legend(fontsize="small")
    fig.suptitle("mlxcluster smoke --bench")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as err:
        raise InputError(f"cannot write plot {path}: {err.strerror}") from None
    finally:
        plt.close(fig)
