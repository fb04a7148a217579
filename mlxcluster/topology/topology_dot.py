"""Draw a Topology: DOT text (graphviz) and, when ``dot`` is installed, PNG.

Hosts are boxes; each cable is an edge labelled with both interfaces and the
link speed. Cables slower than the fastest one are drawn orange ("slow");
pairs of hosts with no cable are dotted grey ("missing"); a port cabled to a
Mac that could not be matched to a host is drawn to a dashed note.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from mlxcluster.errors import MlxclusterError, ToolMissing
from mlxcluster.outputs import check_output_path
from mlxcluster.topology.topology import Topology

DOT_TIMEOUT_S = 30


def _q(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + escaped + '"'


def _speed(value: float | None) -> str:
    return "? Gb/s" if value is None else f"{value:g} Gb/s"


def to_dot(topology: Topology) -> str:
    """The topology as an undirected DOT graph (deterministic text)."""
    lines = ["graph mlxcluster {", "  node [shape=box];"]
    for name in topology.hosts:
        lines.append(f"  {_q(name)};")
    fastest = max((lk.speed_gbps for lk in topology.links if lk.speed_gbps), default=None)
    for lk in topology.links:
        label = f"{lk.a_interface or '?'} - {lk.b_interface or '?'}\n{_speed(lk.speed_gbps)}"
        attrs = []
        if lk.matched_by == "inferred":
            label += " (inferred)"
        if fastest and (lk.speed_gbps is None or lk.speed_gbps < fastest):
            label += " slow"
            attrs.append('color="orange"')
        attrs.insert(0, f"label={_q(label)}")
        lines.append(f"  {_q(lk.a)} -- {_q(lk.b)} [{', '.join(attrs)}];")
    names = list(topology.hosts)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if not topology.links_between(a, b):
                lines.append(f'  {_q(a)} -- {_q(b)} [label="missing", style=dotted, color="grey"];')
    linked = {(lk.a, lk.a_receptacle) for lk in topology.links} | {
        (lk.b, lk.b_receptacle) for lk in topology.links}
    for name, host in topology.hosts.items():
        for port in host.ports:
            if port.peer is None or (name, port.receptacle) in linked:
                continue
            note = f"{name}:{port.interface or '?'}"
            label = f"{port.peer.name} ({port.peer.model or '?'})\nnot matched to a host"
            lines.append(f"  {_q(note)} [shape=note, style=dashed, label={_q(label)}];")
            lines.append(f"  {_q(name)} -- {_q(note)} [style=dashed, "
                         f"label={_q((port.interface or '?') + ' ' + _speed(port.speed_gbps))}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_program() -> str:
    dot = shutil.which("dot")
    if dot is None:
        raise ToolMissing(
            "graphviz 'dot' is not installed, so no PNG can be drawn",
            "install graphviz (brew install graphviz / apt-get install graphviz), "
            "or use --dot and render the text elsewhere",
        )
    return dot


def check_png_output(path: str | Path) -> Path:
    """Before any work: ``dot`` is installed and ``path`` can be written (a file
    in an existing, writable folder). A bad path is an InputError naming it."""
    _dot_program()
    return check_output_path(path, what="the PNG to ")


def render_png(dot_text: str, path: str | Path) -> Path:
    """Render DOT to a PNG file with graphviz's ``dot``."""
    dot = _dot_program()
    out = Path(path)
    try:
        subprocess.run([dot, "-Tpng", "-o", str(out)], input=dot_text.encode(),
                       capture_output=True, timeout=DOT_TIMEOUT_S, check=True)
    except subprocess.CalledProcessError as exc:
        raise MlxclusterError(f"graphviz dot failed: {exc.stderr.decode(errors='replace').strip()}",
                              "run with --dot to inspect the graph text") from exc
    except subprocess.TimeoutExpired as exc:
        raise MlxclusterError(f"graphviz dot took longer than {DOT_TIMEOUT_S} s",
                              "run with --dot and render it yourself") from exc
    return out
