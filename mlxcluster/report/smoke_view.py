"""What the page shows of a smoke run: its ``--json`` document (docs/smoke.md),
whether it comes from the run just made or from a file (``report --smoke``).

Correctness: every rank's verdict and each failed check (op, dtype, size);
the benchmark: bus bandwidth and p50 latency against size as SVG plots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxcluster.report.svg import figure_svg, pyplot
from mlxcluster.smoke.plot import draw_bench


@dataclass
class BackendView:
    backend: str
    status: str  # passed | failed | unavailable
    css: str
    reason: str
    hint: str
    checks: int
    duration_s: float
    ranks: list[dict]
    failures: list[dict]  # rank, op, dtype, size, detail
    host_reasons: list[tuple[str, str]]
    bench: list[dict]
    fits: list[dict]
    command: str
    # Correctness per op and dtype: [(op, dtype, [(elements, bytes, failed ranks)])]; None
    # when the worker's arguments are not in the command (they say what was checked).
    grid: list[tuple[str, str, list[tuple[int, int, list[int]]]]] | None = None


@dataclass
class SmokeView:
    ok: bool
    backends: list[BackendView]
    plot: object | None = None  # Markup: busbw and latency against size
    notes: list[str] = field(default_factory=list)


CSS = {"passed": "pass", "failed": "fail", "unavailable": "warn"}


def _size(n: int) -> str:
    for unit, scale in (("M", 2**20), ("K", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _failures(rank: dict) -> list[dict]:
    """A rank's failed checks; the worker's events name the size in elements
    (``size``) and bytes, and the first wrong element (docs/smoke.md)."""
    out = []
    for f in rank.get("failures") or []:
        detail = str(f.get("detail") or f.get("error") or "")
        if not detail and "bad_index" in f:
            detail = (f"element {f['bad_index']}: got {f.get('got')}, expected {f.get('expected')}"
                      + (f" (from rank {f['peer']})" if "peer" in f else ""))
        size = f"{f.get('size', '?')} el."
        if isinstance(f.get("bytes"), int):
            size += f" ({_size(f['bytes'])} B)"
        out.append({"rank": rank.get("rank"), "host": rank.get("host", ""), "op": f.get("op", "?"),
                    "dtype": f.get("dtype", "?"), "size": size, "detail": detail})
    return out


def _worker_args(command: list) -> dict[str, str]:
    """The worker's --dtypes / --sizes / --ops / --expect from the launch command."""
    args = [str(a) for a in command]
    return {key: args[i + 1] for i, key in enumerate(args[:-1])
            if key in ("--dtypes", "--sizes", "--ops", "--expect")}


def correctness_grid(doc: dict):
    """What the smoke checked, op x dtype x size, and which ranks failed each
    check: rebuilt from the worker's arguments (the counts the worker checks,
    ``correctness_counts``) and the ranks' failures. None when unknown."""
    args = _worker_args(doc.get("command") or [])
    if not {"--dtypes", "--sizes", "--expect"} <= set(args):
        return None
    try:
        from mlxcluster.smoke.worker import DTYPES, OPS, correctness_counts

        n = int(args["--expect"])
        lo, _, hi = args["--sizes"].partition(":")
        ops = [op for op in args.get("--ops", ",".join(OPS)).split(",") if op in OPS]
        dtypes = [d for d in args["--dtypes"].split(",") if d in DTYPES]
        failed: dict[tuple, list[int]] = {}
        for rank in doc.get("ranks") or []:
            for f in rank.get("failures") or []:
                failed.setdefault((f.get("op"), f.get("dtype"), f.get("size")), []).append(rank.get("rank"))
        grid = []
        for op in ops:
            for dtype in dtypes:
                size = DTYPES[dtype].size
                cells = [(count, count * size, sorted(set(failed.get((op, dtype, count), []))))
                         for count in correctness_counts(n, int(lo), int(hi), size)]
                grid.append((op, dtype, cells))
        return grid
    except (ValueError, ImportError):
        return None


def backend_view(doc: dict) -> BackendView:
    ranks = list(doc.get("ranks") or [])
    bench = sorted(doc.get("bench") or [], key=lambda b: (b.get("op", ""), b.get("bytes", 0)))
    return BackendView(
        backend=str(doc.get("backend", "?")), status=str(doc.get("status", "?")),
        css=CSS.get(doc.get("status"), "warn"), reason=str(doc.get("reason") or ""),
        hint=str(doc.get("hint") or ""), checks=int(doc.get("checks") or 0),
        duration_s=float(doc.get("duration_s") or 0.0), ranks=ranks,
        failures=[f for r in ranks for f in _failures(r)],
        host_reasons=list((doc.get("host_reasons") or {}).items()),
        bench=[{**b, "size": _size(b["bytes"]), "p50_us": b["p50_s"] * 1e6,
                "p90_us": b["p90_s"] * 1e6} for b in bench],
        fits=list(doc.get("fits") or []),
        command=" ".join(str(a) for a in doc.get("command") or []),
        grid=correctness_grid(doc) if doc.get("status") in ("passed", "failed") else None,
    )


def bench_plot(backends: list[BackendView]):
    """Bus bandwidth and p50 latency against message size, one line per
    backend and op; None without any benchmark row."""
    if not any(b.bench for b in backends):
        return None
    plt = pyplot()
    series: dict[str, list] = {}
    for b in backends:
        for row in b.bench:
            series.setdefault(f"{b.backend} {row['op']}", []).append(
                (row["bytes"], row["busbw_gbps"], row["p50_s"]))
    fig = draw_bench(plt, series, (10, 3.8))
    return figure_svg(fig)


def smoke_view(doc: dict) -> SmokeView:
    """The page's smoke section from a ``smoke --json`` document."""
    backends = [backend_view(b) for b in doc.get("backends") or []]
    notes = [f"plot: {doc['plot_error']}"] if doc.get("plot_error") else []
    return SmokeView(bool(doc.get("ok")), backends, bench_plot(backends), notes)
