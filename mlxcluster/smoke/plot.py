"""The benchmark's picture, drawn once for both its readers: ``smoke --plot``
(a PNG, PDF or SVG file) and the HTML report (inline SVG). Bus bandwidth
and p50 latency against message size, one line per backend and op."""

from __future__ import annotations

from collections.abc import Iterable

# One point: (bytes, bus bandwidth GB/s, p50 seconds)
Point = tuple[int, float, float]


def draw_bench(plt, series: dict[str, Iterable[Point]], figsize: tuple[float, float],
               title: str | None = None):
    """A figure of two panels from ``series`` (label -> points, any order);
    ``plt`` is pyplot on a non-interactive backend. The caller saves and
    closes it."""
    fig, (ax_bw, ax_lat) = plt.subplots(1, 2, figsize=figsize)
    for label, points in series.items():
        points = sorted(points)
        xs = [p[0] for p in points]
        ax_bw.plot(xs, [p[1] for p in points], marker="o", markersize=3, label=label)
        ax_lat.plot(xs, [p[2] * 1e6 for p in points], marker="o", markersize=3, label=label)
    ax_bw.set_title("bus bandwidth against size")
    ax_lat.set_title("p50 latency against size")
    for ax, ylabel in ((ax_bw, "bus bandwidth (GB/s)"), (ax_lat, "p50 time (µs)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    ax_lat.set_yscale("log")
    ax_bw.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
