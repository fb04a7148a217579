"""What `mlxcluster run` imports before it launches anything.

A short job pays for every module the command imports (docs/performance-runs.md,
run over bare mlx.launch: the goal is within 0.5 s of bare mlx.launch).
The preflight's modules (paramiko, doctor, the HTML report, the smoke
launcher) are imported only when a preflight runs. Checked in a fresh
interpreter, by what lands in ``sys.modules``, not by timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PREFLIGHT_ONLY = ("paramiko", "jinja2", "tabulate", "matplotlib", "mlxcluster.doctor.doctor",
                  "mlxcluster.cli.doctor", "mlxcluster.report", "mlxcluster.smoke.run",
                  "mlxcluster.ssh.remote")


def imported_by(statement: str) -> set[str]:
    probe = (f"import sys, json\n{statement}\n"
             f"print(json.dumps([m for m in {list(PREFLIGHT_ONLY)!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_run_without_preflight_imports_none_of_the_preflights_modules():
    assert imported_by("import mlxcluster.cli.run") == set()


@pytest.mark.parametrize("module", ["mlxcluster.launch.preflight"])
def test_the_preflight_still_brings_what_it_uses(module):
    """The check above can fail: the preflight module imports them."""
    assert {"paramiko", "mlxcluster.doctor.doctor", "mlxcluster.smoke.run"} <= imported_by(f"import {module}")
