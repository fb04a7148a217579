"""SVG pictures for the HTML report: matplotlib figures and graphviz drawings,
made fit to inline in a self-contained page.

Both programs write a standalone SVG document: an XML declaration, a
DOCTYPE and namespace declarations naming w3.org addresses, and (matplotlib)
an RDF metadata block naming creativecommons.org and purl.org. None of them
is fetched, but an attached page must carry no address at all, so they are
removed; inline SVG in HTML needs none of them (the HTML parser puts
``<svg>`` and ``xlink:href`` in their namespaces itself).
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess

from markupsafe import Markup

DOT_TIMEOUT_S = 30
FONT = "Helvetica,Arial,sans-serif"

_PROLOGUE = re.compile(r"<\?xml[^>]*\?>|<!DOCTYPE[^>]*>|<!--.*?-->", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>", re.S)
_XMLNS = re.compile(r'\s+xmlns(:\w+)?="[^"]*"')


def inline_svg(document: str) -> Markup:
    """A standalone SVG document (from matplotlib or graphviz, never from a
    host) as markup to put in the page: prologue, metadata and namespace
    declarations removed. The programs escape every text they draw."""
    text = _PROLOGUE.sub("", document)
    text = _METADATA.sub("", text)
    text = _XMLNS.sub("", text)
    return Markup(text.strip())


def figure_svg(fig) -> Markup:
    """A matplotlib figure as inline SVG (text kept as text: smaller, and
    searchable in the page), the figure closed."""
    import matplotlib.pyplot as plt

    out = io.StringIO()
    try:
        fig.savefig(out, format="svg", metadata={"Date": None})
    finally:
        plt.close(fig)
    return inline_svg(out.getvalue())


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display), SVG text as text
    and stable ids (the same data draws the same bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.fonttype"] = "none"
    matplotlib.rcParams["svg.hashsalt"] = "mlxcluster"
    return plt


def dot_svg(dot_text: str) -> Markup | None:
    """graphviz ``dot -Tsvg`` of ``dot_text``, or None when dot is not
    installed or fails (the page then shows a table instead)."""
    dot = shutil.which("dot")
    if dot is None:
        return None
    try:
        # The page's sans-serif font for boxes and labels (graphviz defaults to Times).
        proc = subprocess.run([dot, "-Tsvg", f"-Nfontname={FONT}", f"-Efontname={FONT}",
                               "-Nfontsize=12", "-Efontsize=11"], input=dot_text.encode(), capture_output=True,
                              timeout=DOT_TIMEOUT_S, check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
        return None
    return inline_svg(proc.stdout.decode("utf-8", errors="replace"))
