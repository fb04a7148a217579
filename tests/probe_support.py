"""The probe script (mlxcluster/facts/probe_script.py) for the tests that run it or read
its code: run here exactly as doctor runs it on a host (piped to ``<python> -``), or loaded
as a module for its functions and tables."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from mlxcluster.facts.collect import probe_source

PROBE_SCRIPT = Path(__file__).parent.parent / "mlxcluster" / "facts" / "probe_script.py"


def run_probe(env: dict[str, str] | None = None, *args: str, python: str = sys.executable) -> dict:
    """The probe's facts from ``python`` run with ``args`` in ``env`` (by default only HOME
    and PATH=/usr/bin:/bin, as a non-interactive SSH session might give it)."""
    if env is None:
        env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([python, "-", *args], input=probe_source(), capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1  # exactly one JSON object
    return json.loads(lines[0])


def load_probe_module() -> ModuleType:
    """The probe script as a module, for its functions (its main is not run)."""
    spec = importlib.util.spec_from_file_location("probe_under_test", PROBE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
