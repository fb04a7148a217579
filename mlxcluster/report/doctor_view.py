"""What the page shows of a doctor report and of the Thunderbolt topology.

Plain data for the template: every value from a host (names, evidence,
versions) stays a plain string here and is escaped by the template.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxcluster.doctor.checks.base import CheckResult, Status
from mlxcluster.doctor.doctor import DoctorReport
from mlxcluster.facts.facts import HostFacts
from mlxcluster.report.svg import dot_svg
from mlxcluster.topology.topology import Topology
from mlxcluster.topology.topology_dot import to_dot

# Status -> (mark, css class, word shown).
STATUS = {
    Status.FAIL: ("✗", "fail", "failed"),
    Status.CRASH: ("✗", "fail", "crashed"),
    Status.WARN: ("!", "warn", "warning"),
    Status.PASS: ("✓", "pass", "passed"),
    Status.SKIP: ("–", "skip", "skipped"),
}
_ORDER = {Status.FAIL: 0, Status.CRASH: 0, Status.WARN: 1, Status.PASS: 2, Status.SKIP: 3}
FACT_HEADERS = ("host", "hostname", "macOS / OS (build)", "chip / model", "memory", "python",
                "mlx", "backends", "Open MPI")


@dataclass
class CheckView:
    id: str
    title: str
    status: str  # css class: fail / warn / pass / skip
    mark: str
    word: str
    hosts: list[tuple[str, str]]
    fix: str | None
    open: bool  # unfolded on the page: everything that is not a pass or a skip


@dataclass
class DoctorView:
    verdict: str  # pass / warn / fail
    headline: str
    source: str  # "live", "replay of a --collect folder", "this machine (--local)"
    cluster: str
    seconds: float
    fix_first: list[CheckView]
    warnings: list[CheckView]
    checks: list[CheckView]
    counts: dict[str, int]
    fact_rows: list[list[str]]
    ignored: dict[str, str] = field(default_factory=dict)


def check_view(result: CheckResult) -> CheckView:
    mark, css, word = STATUS[result.status]
    return CheckView(result.id, result.title, css, mark, word, list(result.hosts.items()),
                     result.hint, result.status not in (Status.PASS, Status.SKIP))


def _gib(value: int | None) -> str:
    return f"{value / 2**30:.0f} GiB" if value else "?"


def fact_row(name: str, f: HostFacts) -> list[str]:
    os_text = " ".join(x for x in (f.os_name, f.os_version) if x) or "?"
    if f.os_build:
        os_text += f" ({f.os_build})"
    chip = " / ".join(x for x in (f.chip, f.model) if x) or "?"
    return [name, f.hostname or "?", os_text, chip, _gib(f.memory_bytes), f.python_version or "?",
            f.mlx_version or "-", ", ".join(b for b, ok in f.backends.items() if ok) or "-",
            f.mpirun_version or "-"]


def headline(report: DoctorReport) -> str:
    failed, warned = report.failed(), report.warned()
    if failed:
        return (f"{len(failed)} check(s) failed: {', '.join(r.id for r in failed)}"
                + (f"; {len(warned)} warning(s)" if warned else ""))
    if warned:
        return f"no failures, {len(warned)} warning(s): {', '.join(r.id for r in warned)}"
    return "no issues found"


def doctor_view(report: DoctorReport) -> DoctorView:
    """The doctor part of the page: verdict, what to fix first, every check
    (problems first, then passes, then skips), the facts table."""
    views = [check_view(r) for r in report.results]
    ranked = [v for _, v in sorted(enumerate(views), key=lambda iv: (
        _ORDER[report.results[iv[0]].status], iv[0]))]
    counts: dict[str, int] = {}
    for v in views:
        counts[v.word] = counts.get(v.word, 0) + 1
    if report.live:
        source = "live"
    elif "ignored" in report.extra:  # set by every replay of a folder (doctor --from, report DIR)
        source = "replay of a --collect folder"
    else:
        source = "this machine (--local)"
    return DoctorView(
        verdict=report.verdict, headline=headline(report), source=source,
        cluster=report.cluster or "captures", seconds=report.seconds,
        fix_first=[v for v in ranked if v.status == "fail"],
        warnings=[v for v in ranked if v.status == "warn"],
        checks=ranked, counts=counts,
        fact_rows=[fact_row(n, f) for n, f in report.facts.items()],
        ignored=dict(report.extra.get("ignored") or {}),
    )


@dataclass
class LinkRow:
    a: str
    b: str
    interfaces: str
    speed: str
    note: str  # "", "slow", "missing", "inferred"


@dataclass
class TopologyView:
    svg: object | None  # Markup from graphviz, None: the table alone
    links: list[LinkRow]
    ring: str
    full_mesh: bool
    ports: int  # Thunderbolt ports seen over every host (0: nothing to draw)
    problems: list[str]
    missing_drawn: bool = True  # the drawing shows uncabled pairs (dotted grey)


MAX_HOSTS_WITH_MISSING_EDGES = 4


def _speed(value: float | None) -> str:
    return "? Gb/s" if value is None else f"{value:g} Gb/s"


def topology_view(t: Topology, *, draw: bool = True) -> TopologyView:
    """Cables as rows (slow ones and missing pairs marked, as in the DOT
    drawing) and, when graphviz is installed, the drawing as SVG."""
    fastest = max((lk.speed_gbps for lk in t.links if lk.speed_gbps), default=None)
    rows = []
    for lk in t.links:
        slow = fastest is not None and (lk.speed_gbps is None or lk.speed_gbps < fastest)
        note = "slow" if slow else ("inferred" if lk.matched_by == "inferred" else "")
        rows.append(LinkRow(lk.a, lk.b, f"{lk.a_interface or '?'} – {lk.b_interface or '?'}",
                            _speed(lk.speed_gbps), note))
    names = t.names()
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if not t.links_between(a, b):
                rows.append(LinkRow(a, b, "", "", "missing"))
    ports = sum(len(h.ports) for h in t.hosts.values())
    problems = [f"{r.a} – {r.b}: {r.note}" for r in rows if r.note in ("slow", "missing")]
    dot_text = to_dot(t)
    # Past 4 hosts the dotted "missing" edges of every uncabled pair (a ring of 8 has 20)
    # hide the cables: the drawing leaves them out, the table below keeps them.
    missing_drawn = len(names) <= MAX_HOSTS_WITH_MISSING_EDGES
    if not missing_drawn:
        dot_text = "".join(line for line in dot_text.splitlines(keepends=True)
                           if 'label="missing"' not in line)
    svg = dot_svg(dot_text) if draw and ports else None
    ring = " → ".join([*t.ring, t.ring[0]]) if t.ring else "none through all hosts"
    return TopologyView(svg, rows, ring, t.full_mesh, ports, problems, missing_drawn)
