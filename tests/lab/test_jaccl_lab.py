"""`train` and `run --backend jaccl|jaccl-ring` on three real lab hosts
(Linux: no Thunderbolt, no RDMA): exit 3 within seconds, every host named
with its reasons, no rank started, nothing left on any host."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests import waits
from tests.lab.jobs import bracketed, left_on_hosts, training_setup
from tests.waits import JACCL_UNAVAILABLE_BUDGET_S

pytestmark = pytest.mark.lab

# Would leave a trace of every rank that started (the lab's hosts share this machine's files).
MARKER_SCRIPT = """
import os, pathlib, sys, time
pathlib.Path(sys.argv[1], f"started-{os.environ.get('MLX_RANK')}").touch()
time.sleep(300)
"""
LINUX_REASON = ("runs Linux, not macOS (JACCL needs macOS 26.2 or later); no rdma_* devices "
                "(ibv_devices not found); no Thunderbolt link faster than 40 Gb/s (no "
                "Thunderbolt cable to another host)")


def mlxcluster(args: list[str], env: dict[str, str], cwd) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = waits.run([sys.executable, "-m", "mlxcluster", *args], env=env, cwd=cwd)
    return proc, time.monotonic() - start


def assert_unavailable_named(proc, took: float, backend: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    assert took < JACCL_UNAVAILABLE_BUDGET_S, took
    assert f"{backend} cannot run: 3 of 3 host(s) cannot take part" in proc.stderr, out[-3000:]
    for name in ("labhost1", "labhost2", "labhost3"):
        assert f"  {name}: {LINUX_REASON}" in proc.stderr, out[-3000:]
    assert "fix: JACCL needs macOS 26.2+" in proc.stderr
    assert "launching" not in proc.stdout and "Traceback" not in out


@pytest.mark.parametrize("backend", ["jaccl", "jaccl-ring"])
def test_run_on_jaccl_exits_3_before_any_rank_starts(lab3, tmp_path, backend):
    inventory, env = training_setup(lab3, tmp_path)
    script = tmp_path / "marker.py"
    script.write_text(MARKER_SCRIPT)
    marks = tmp_path / "marks"
    marks.mkdir()
    proc, took = mlxcluster(["run", "-i", str(inventory), "--backend", backend, "--logs",
                             str(tmp_path / "logs"), "--", "python", str(script), str(marks)],
                            env, tmp_path)
    print(f"run --backend {backend} on the lab: exit {proc.returncode} in {took:.1f} s")
    assert_unavailable_named(proc, took, backend)
    assert list(marks.iterdir()) == [] and not (tmp_path / "logs").exists()
    assert left_on_hosts(lab3, bracketed(str(script))) == {}


def test_train_on_jaccl_exits_3_before_any_rank_starts(lab3, tmp_path):
    inventory, env = training_setup(lab3, tmp_path)
    out = tmp_path / "train-out"
    proc, took = mlxcluster(["train", "-i", str(inventory), "--backend", "jaccl", "--config",
                             "tiny", "--", "--steps", "2", "--global_batch", "6", "--out",
                             str(out)], env, tmp_path)
    print(f"train --backend jaccl on the lab: exit {proc.returncode} in {took:.1f} s")
    assert_unavailable_named(proc, took, "jaccl")
    assert "doctor" not in proc.stdout  # the verdict came before the doctor preflight
    assert not out.exists()
    assert left_on_hosts(lab3, bracketed(str(out))) == {}
