"""`make demo`: the main job on this one machine, step by step.

A cluster of N local ranks (127.0.0.1 repeated) goes through every stage that
exists: inventory -> doctor -> hostfile -> smoke (ring, MPI) -> trainer. Each
step returns a ``StepResult``; the CLI prints them. A stage that is not built
yet is reported as such, never faked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlxcluster.inventory import Inventory, local_inventory

# Every rank prints its all_sum; strict init so a silent group of 1 fails.
_ALLSUM = (
    "import mlx.core as mx, sys\n"
    "g = mx.distributed.init(strict=True, backend=sys.argv[1])\n"
    "x = mx.distributed.all_sum(mx.full((1000,), g.rank() + 1.0), group=g)\n"
    "mx.eval(x)\n"
    "print(f'RANK {g.rank()} {g.size()} {x[0].item():.0f}', flush=True)\n"
)


@dataclass
class StepResult:
    name: str
    ok: bool | None  # None: not run (stage not available)
    detail: str
    seconds: float = 0.0


def run_demo(ranks: int = 2, workdir: Path | None = None,
             on_step: Callable[[StepResult], None] | None = None) -> list[StepResult]:
    """Run every available stage on ``ranks`` local ranks; returns each step's result."""
    workdir = Path(workdir or Path.cwd() / "runs" / "demo")
    workdir.mkdir(parents=True, exist_ok=True)
    inventory = local_inventory(ranks)
    steps: list[Callable[[], StepResult]] = [
        lambda: StepResult("inventory", True, f"{ranks} local ranks, python {inventory.python}"),
        lambda: _allsum_step(inventory, "ring", workdir),
        lambda: _allsum_step(inventory, "mpi", workdir),
    ]
    results = []
    for step in steps:
        start = time.monotonic()
        result = step()
        result.seconds = time.monotonic() - start
        results.append(result)
        if on_step:
            on_step(result)
    return results


def _allsum_step(inventory: Inventory, backend: str, workdir: Path) -> StepResult:
    n = len(inventory.hosts)
    script = workdir / "allsum.py"
    script.write_text(_ALLSUM)
    bindir = Path(inventory.python).parent
    env = dict(os.environ)
    if backend == "ring":
        cmd = [str(bindir / "mlx.launch"), "-n", str(n), "--backend", "ring",
               "--python", inventory.python, str(script), "ring"]
    else:
        libdir = bindir.parent / "lib"
        libmpi = next(iter(sorted(libdir.glob("libmpi.so.*")) + sorted(libdir.glob("libmpi*.dylib"))), None)
        if libmpi is None or not (bindir / "mpirun").exists():
            return StepResult(f"all_sum {backend}", False, f"Open MPI not found in {bindir.parent}")
        cmd = [str(bindir / "mpirun"), "-n", str(n), "--oversubscribe"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += ["-x", f"MLX_MPI_LIBNAME={libmpi}", inventory.python, str(script), "mpi"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        return StepResult(f"all_sum {backend}", False, "timed out after 120 s")
    expected = n * (n + 1) // 2
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("RANK ")]
    good = [r for r in rows if r[2] == str(n) and r[3] == str(expected)]
    if len(good) == n:
        return StepResult(f"all_sum {backend}", True, f"{n} ranks, every rank got {expected}")
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return StepResult(f"all_sum {backend}", False,
                      f"{len(good)}/{n} ranks correct (rc {proc.returncode}): {' | '.join(tail)}")


def python_for_demo() -> str:
    return sys.executable
