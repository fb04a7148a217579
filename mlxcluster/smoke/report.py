"""Smoke reports as plain data (for ``--json``) and as a PNG (``--plot``).

The JSON form is documented by example in docs/smoke.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from mlxcluster.errors import InputError, MlxclusterError
from mlxcluster.smoke.plot import draw_bench
from mlxcluster.smoke.run import SmokeReport

JSON_VERSION = 1


def report_to_dict(report: SmokeReport) -> dict:
    """One backend's report as JSON-ready data."""
    return {
        "backend": report.backend,
        "status": report.status,
        "reason": report.reason,
        "host_reasons": report.host_reasons,
        "hint": report.hint,
        "run_id": report.run_id,
        "duration_s": round(report.duration_s, 3),
        "checks": report.checks,
        "ranks": [asdict(r) for r in report.ranks],
        "bench": [asdict(b) for b in report.bench],
        "fits": [asdict(f) for f in report.fits],
        "cleanup_problems": report.cleanup_problems,
        "stall": report.stall,
        "stall_dir": report.stall_dir,
        "soak": report.soak.to_dict() if report.soak else None,
        "command": report.command,
    }


def reports_to_dict(reports: Sequence[SmokeReport], exit_code: int,
                    plot_error: str | None = None) -> dict:
    """Every backend's report plus the overall verdict and exit code (and,
    only when ``--plot`` failed after the run, why)."""
    data = {
        "version": JSON_VERSION,
        "ok": exit_code == 0,
        "exit_code": exit_code,
        "backends": [report_to_dict(r) for r in reports],
    }
    if plot_error:
        data["plot_error"] = plot_error
    return data


def plot_format(path: str) -> str:
    """The image format ``--plot`` writes: FILE's extension, PNG without one."""
    return Path(path).suffix.lower().lstrip(".") or "png"


def check_plot_path(path: str) -> None:
    """Refuse, before anything runs, a ``--plot`` file that could not be
    written: no matplotlib, a format matplotlib does not write, a directory
    that does not exist or does not take the file. The file is opened for
    appending (created and removed again when new), so what the filesystem
    refuses (read-only, /proc, no permission) is found here too."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise InputError("--plot needs matplotlib", "pip install 'mlxcluster[plot]'") from None
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    fmt = plot_format(path)
    if fmt not in formats:
        raise InputError(f"--plot {path}: matplotlib cannot write .{fmt} files",
                         f"name the file .png, .pdf or .svg (or one of {', '.join(formats)})")
    parent = Path(path).parent
    if not parent.is_dir():
        raise InputError(f"--plot {path}: directory {parent} does not exist",
                         f"create it first (mkdir -p {parent}) or write the plot elsewhere")
    existed = os.path.lexists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as err:
        raise InputError(f"--plot {path}: cannot write there: {err.strerror}",
                         "choose a file in a directory you can write to") from None
    if not existed:
        os.unlink(path)


def write_plot(reports: Sequence[SmokeReport], path: str) -> None:
    """A PNG (or FILE's format) of bus bandwidth and p50 latency against size,
    one line per backend and op (needs matplotlib: ``pip install
    mlxcluster[plot]``). Runs after the smoke: its errors are MlxclusterError
    (exit 1), not input errors; check_plot_path refuses bad paths before."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib", "pip install 'mlxcluster[plot]'") from None
    rows = [(r.backend, b) for r in reports for b in r.bench]
    if not rows:
        raise MlxclusterError(f"no plot written to {path}: no backend finished its benchmark",
                              "the table above says why; rerun once a backend passes")
    series: dict[str, list] = {}
    for backend, b in rows:
        series.setdefault(f"{backend} {b.op}", []).append((b.bytes, b.busbw_gbps, b.p50_s))
    fig = draw_bench(plt, series, (11, 4.2), "mlxcluster smoke --bench")
    try:
        fig.savefig(path, dpi=110, format=plot_format(path))
    except (OSError, ValueError) as err:  # ValueError: a format matplotlib does not write
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise MlxclusterError(f"cannot write plot {path}: {reason}",
                              "the results above are complete; rerun with another --plot "
                              "file for the plot") from None
    finally:
        plt.close(fig)
