"""The HTML report: one self-contained page to look at and attach (issue #13).

    page = build_page(Report(doctor=report, topology=build_topology(report.captures)))
    write_page(page, "report.html")

The page carries everything inline (CSS, SVG pictures), no script, and no
address of anything to fetch: it opens on an air-gapped Mac and from a mail
attachment. It is rendered from ``templates/report.html.j2`` with Jinja2,
autoescaping on: host names, evidence and command output are untrusted text.
Only SVG drawn here (matplotlib, graphviz) goes in unescaped.

Sections, in the order a person needs them: the verdict, what
``doctor --fix`` changed when it ran (host, command, before -> after, what
is left for you), what to fix first, every check, the host facts, the
Thunderbolt topology, smoke (correctness and benchmark plots), training
(loss, tokens/s, memory).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mlxcluster import __version__
from mlxcluster.doctor.doctor import DoctorReport
from mlxcluster.outputs import write_files
from mlxcluster.topology.topology import Topology

if TYPE_CHECKING:  # its module loads paramiko: only where a --fix page is built
    from mlxcluster.doctor.fixes.outcome import FixOutcome

__all__ = ["Report", "build_page", "write_page", "report_from_folder"]


@dataclass
class Report:
    """Everything one page shows; any part may be missing."""

    doctor: DoctorReport | None = None
    topology: Topology | None = None
    smoke: dict | None = None  # a `smoke --json` document
    runs: list[str | Path] = field(default_factory=list)  # training run folders (metrics.jsonl)
    failed_runs: dict[str, str] = field(default_factory=dict)  # str(run folder) -> why it stopped
    title: str = "mlxcluster report"
    command: str = ""  # the command that made the page, shown at its foot
    generated: _dt.datetime | None = None  # default: now (UTC)
    fix: FixOutcome | None = None  # what doctor --fix did (then ``doctor`` is the report after it)


def _environment():
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    return Environment(loader=PackageLoader("mlxcluster.report", "templates"),
                       autoescape=select_autoescape(default=True, default_for_string=True),
                       undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _overall(doctor, topology, smoke, runs, fix=None) -> tuple[str, str]:
    """(css class, one line): the page's verdict over every section."""
    parts, worst = [], "pass"
    rank = {"pass": 0, "warn": 1, "fail": 2}

    def note(css: str, text: str) -> None:
        nonlocal worst
        parts.append(text)
        worst = css if rank[css] > rank[worst] else worst

    if fix is not None:
        note(fix.css, f"doctor --fix: {fix.summary}")
    if doctor is not None:
        note(doctor.verdict, f"doctor{' after the fix' if fix is not None and fix.journal else ''}: "
                             f"{doctor.headline}")
    elif topology is not None:  # alone (topology --html); with doctor, its checks judge the cabling
        if not topology.ports:
            note("warn", "topology: no Thunderbolt port captured")
        else:
            note("warn" if topology.problems else "pass",
                 f"topology: ring {topology.ring}; {len(topology.problems)} slow or missing link(s)")
    if smoke is not None:
        for b in smoke.backends:
            note(b.css, f"smoke {b.backend}: {b.status}")
    for run in runs:
        note("fail" if run.failed else "pass",
             f"training {run.name}: {'FAILED after ' if run.failed else ''}{run.steps} steps"
             + (f", loss {run.first_loss:.3f} → {run.last_loss:.3f}" if run.last_loss is not None else ""))
    if not parts:
        return "warn", "nothing to report"
    return worst, "; ".join(parts)


def build_page(report: Report) -> str:
    """The whole page as one HTML string."""
    from mlxcluster.report.doctor_view import FACT_HEADERS, doctor_view, topology_view
    from mlxcluster.report.fix_view import fix_view
    from mlxcluster.report.smoke_view import smoke_view
    from mlxcluster.report.train_view import run_view

    doctor = doctor_view(report.doctor) if report.doctor is not None else None
    topology = topology_view(report.topology) if report.topology is not None else None
    smoke = smoke_view(report.smoke) if report.smoke is not None else None
    runs = [run_view(r, failed=report.failed_runs.get(str(r))) for r in report.runs]
    fix = fix_view(report.fix) if report.fix is not None else None
    css, verdict = _overall(doctor, topology, smoke, runs, fix)
    generated = report.generated or _dt.datetime.now(_dt.timezone.utc)
    return _environment().get_template("report.html.j2").render(
        title=report.title, verdict=verdict, verdict_css=css, doctor=doctor, topology=topology, fix=fix,
        smoke=smoke, runs=runs, fact_headers=FACT_HEADERS, command=report.command,
        version=__version__, generated=generated.strftime("%Y-%m-%d %H:%M UTC"),
    )


def write_page(html: str, path: str | Path) -> Path:
    """Write the page (whole or not at all: a temporary file renamed)."""
    write_files({str(path): html})
    return Path(path)


def report_from_folder(folder: str | Path | None, *, inventory=None, backend: str | None = None,
                       smoke: str | Path | None = None, runs: tuple[str | Path, ...] = (),
                       command: str = "") -> Report:
    """The page's inputs from a ``doctor --collect`` folder (replayed as
    ``doctor --from``, against ``inventory`` when given), a ``smoke --json``
    file and training run folders; any of them may be missing (not all)."""
    import json

    from mlxcluster.doctor.doctor import replay_doctor
    from mlxcluster.errors import InputError
    from mlxcluster.facts.capture import read_capture_dir
    from mlxcluster.report.train_view import read_metrics
    from mlxcluster.topology.topology import build_topology

    if folder is None and smoke is None and not runs:
        raise InputError("nothing to report", "give a 'doctor --collect' folder, --smoke FILE or --run DIR")
    doctor = topology = None
    if folder is not None:
        captured = read_capture_dir(folder)
        doctor = replay_doctor(captured.captures, inventory=inventory, backend=backend)
        doctor.extra["ignored"] = captured.ignored
        topology = build_topology(captured.captures)
    smoke_doc = None
    if smoke is not None:
        try:
            smoke_doc = json.loads(Path(smoke).read_text(encoding="utf-8"))
        except OSError as err:
            raise InputError(f"--smoke {smoke}: cannot read it: {err.strerror}",
                             "pass the file 'mlxcluster smoke --json > FILE' wrote") from None
        except json.JSONDecodeError as err:
            raise InputError(f"--smoke {smoke} is not JSON ({err.msg}, line {err.lineno})",
                             "pass the file 'mlxcluster smoke --json > FILE' wrote") from None
        if not isinstance(smoke_doc, dict) or "backends" not in smoke_doc:
            raise InputError(f"--smoke {smoke} is not a smoke --json document (no 'backends')",
                             "pass the file 'mlxcluster smoke --json > FILE' wrote")
    for run in runs:
        read_metrics(run)  # a missing or broken metrics.jsonl is an input error, up front
    return Report(doctor=doctor, topology=topology, smoke=smoke_doc,
                  runs=list(runs), command=command)
