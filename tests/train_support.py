"""Helpers for the trainer tests: run reference_train in 1 or N local processes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from mlxcluster.facts.blas import find_openblas, with_openblas
from mlxcluster.jobs.hosts import local_hosts
from mlxcluster.jobs.plan import free_port_block
from mlxcluster.jobs.process import launcher_argv
from tests import waits

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
MLX_LAUNCH = shutil.which("mlx.launch", path=str(Path(PYTHON).parent)) or shutil.which("mlx.launch")


def trainer_env() -> dict[str, str]:
    """The environment the trainer runs in: repo importable, OpenBLAS preloaded when present."""
    env = with_openblas(os.environ, find_openblas())
    # One BLAS thread per rank: this machine is small and shared (see mlxcluster.jobs.preflight.openblas_env).
    env["OPENBLAS_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_trainer(args: list[str], ranks: int = 1,
                module: str = "reference_train.train",
                extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m reference_train.train ARGS` (or another ``module``), alone or
    under `mlx.launch -n RANKS` (ring) on ports free here: tests run in
    parallel workers, so no two runs may count on the same fixed ports.
    ``extra_env``: variables every rank gets besides the trainer's. No fixed
    limit: it waits while the run advances (tests.waits.communicate: its output,
    its --out, MLX's kernels, its ranks' CPU)."""
    extra_env = extra_env or {}
    cmd = ["-m", module, *args]
    if ranks == 1:
        full = [PYTHON, *cmd]
    else:
        assert MLX_LAUNCH, "mlx.launch not found beside the test python"
        env = trainer_env()
        port = free_port_block(ranks)
        full = [MLX_LAUNCH, "-n", str(ranks), "--backend", "ring", "--starting-port", str(port),
                "--python", PYTHON, "--env", f"PYTHONPATH={env['PYTHONPATH']}"]
        for key in ("LD_PRELOAD", "OPENBLAS_NUM_THREADS"):
            if key in env:
                full += ["--env", f"{key}={env[key]}"]
        full += [part for key, value in extra_env.items() for part in ("--env", f"{key}={value}")]
        # Started as the jobs layer starts ranks that all run here (without mlx.launch's
        # busy loop, which took a core of this machine's two: docs/performance-runs.md).
        full = launcher_argv([*full, "--", *cmd], local_hosts(ranks, PYTHON))
    # A session of its own, so that a timeout kills mlx.launch's ranks too
    # (subprocess.run kills only the launcher; its ranks trained on for
    # half an hour once, slowing every test after).
    proc = subprocess.Popen(full, cwd=REPO, env={**trainer_env(), **extra_env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    out = [Path(args[i + 1]) for i, arg in enumerate(args[:-1]) if arg == "--out"]
    stdout, stderr = waits.communicate(proc, f"{module} on {ranks} rank(s)", paths=out)
    return subprocess.CompletedProcess(full, launched_exit(proc.returncode, stderr), stdout, stderr)


# mlx.launch exits 0 when a rank fails: it only warns (mlx/_distributed_utils/launch.py).
RANK_FAILED = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")


def launched_exit(code: int, stderr: str) -> int:
    """The run's exit: the launcher's, or when it says 0 the first failed rank's (its code,
    or -9 for a rank killed), so that a test asserting success cannot pass on a dead rank."""
    failed = RANK_FAILED.search(stderr)
    if code != 0 or failed is None:
        return code
    return int(failed.group(2)) if failed.group(2) else -9


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            if line.strip()]


def train_losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out) if "loss" in r}


class FakeGroup:
    """Only what sharding asks of a group: a rank and a size."""

    def __init__(self, rank: int, size: int):
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


# The trainer's tiny run, as the pipeline and resplit tests compare it.
TINY = ["--config", "tiny", "--eval_every", "0", "--sample_tokens", "0", "--steps", "3"]
PARITY = 1e-5  # relative, every logged loss (float32); measured ~5e-7


def one_process(out, flags) -> dict[int, float]:
    proc = run_trainer([*flags, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return train_losses(out)


def pipelined(out, flags, ranks, *extra):
    # Eager unless the caller names --compile: the compiled pass is the eager one bit for bit
    # (tests/test_pipeline.py proves it, pass by pass and over the trainer's whole run), and
    # each parity case compiled would first build MLX kernels of its own (a cold cache).
    eager = [] if "--compile" in (*extra, *flags) else ["--compile", "false"]
    proc = run_trainer(["--pipeline", str(ranks), *extra, *flags, *eager, "--out", str(out)],
                       ranks=ranks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
