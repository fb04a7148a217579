"""What mlx.launch's busy loop costs, and what quiet_launch gives back.

    python bench/launcher_cpu.py                 # 3-host lab, ring, 5 rounds (root, Linux)
    python bench/launcher_cpu.py --rounds 7 --steps 60

Builds its own 3-host lab (tests/lab) and runs the same small data-parallel
loop (per step: a 384x384 matmul chain on each rank, then an all_sum of
1 MiB, as a training step does) two ways, alternating in rounds so that each
sees the same load:

1. plain: `mlx.launch --hosts IP,IP,IP --backend ring --python PY -- prog.py`,
   stdin closed, as the jobs layer started it before quiet_launch;
2. quiet: the same argv through ``mlxcluster.jobs.quiet_launch.command``,
   as the jobs layer starts it now.

Reports, per way: the launcher's CPU seconds (user + system, sampled every
0.1 s until it ends) per second of the job, the ranks' median step time
(each rank times its own steps; rank 0's median is printed), and wall time.
Every run's ranks must all print their result.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlxcluster.jobs import quiet_launch  # noqa: E402
from tests.lab import lab_unavailable_reason, start_lab  # noqa: E402

PROGRAM = """
import sys, time, statistics
import mlx.core as mx
steps = int(sys.argv[1])
g = mx.distributed.init(strict=True, backend="any")
a = mx.random.normal((384, 384))
grad = mx.ones((256 * 1024,))
times = []
for _ in range(steps):
    t = time.perf_counter()
    b = a
    for _ in range(4):
        b = (b @ a) / 384.0
    total = mx.distributed.all_sum(grad)
    mx.eval(b, total)
    times.append(time.perf_counter() - t)
print(f"RESULT rank {g.rank()} median_step_ms {statistics.median(times) * 1000:.2f} "
      f"sum {total[0].item():.0f}", flush=True)
"""


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, float]:
    """(launcher CPU seconds, rank 0's median step ms, wall seconds); raises
    when a rank's result is missing."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ps = psutil.Process(proc.pid)
    cpu = 0.0
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    while proc.poll() is None:
        try:
            t = ps.cpu_times()
            cpu = max(cpu, t.user + t.system)
        except psutil.Error:
            pass
        time.sleep(0.1)
    reader.join(timeout=10)
    wall = time.monotonic() - start
    results = [ln.split() for ln in lines if ln.startswith("RESULT ")]
    if len(results) != 3 or any(r[-1] != "3" for r in results):
        raise SystemExit(f"{argv[:3]}... exited {proc.returncode}:\n{''.join(lines[-30:])}")
    rank0 = next(float(r[4]) for r in results if r[2] == "0")
    return cpu, rank0, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    why = lab_unavailable_reason()
    if why:
        raise SystemExit(f"no lab here: {why}")
    mlx_launch = str(Path(sys.executable).parent / "mlx.launch")
    with start_lab(3) as lab, tempfile.TemporaryDirectory(prefix="launcher-cpu.") as tmp:
        work = Path(tmp)
        prog = work / "prog.py"
        prog.write_text(PROGRAM)
        env = lab.env()
        env.pop("LD_PRELOAD", None)
        launch_args = ["--hosts", ",".join(h.ip for h in lab.hosts), "--backend", "ring",
                       "--python", lab.python, "--", str(prog), str(args.steps)]
        ways = {"plain mlx.launch": [mlx_launch, *launch_args],
                "quiet_launch": quiet_launch.command(mlx_launch, launch_args)}
        got: dict[str, dict[str, list[float]]] = {w: {"cpu": [], "step": [], "wall": []} for w in ways}
        load_before = os.getloadavg()
        for r in range(args.rounds):
            for name, argv in (ways.items() if r % 2 == 0 else reversed(ways.items())):
                cpu, step, wall = timed(argv, env, work)
                got[name]["cpu"].append(cpu)
                got[name]["step"].append(step)
                got[name]["wall"].append(wall)
            print(f"round {r + 1}: " + ", ".join(
                f"{n}: launcher {g['cpu'][-1]:.2f} CPU-s in {g['wall'][-1]:.2f} s, "
                f"step {g['step'][-1]:.1f} ms" for n, g in got.items()), flush=True)
        load_after = os.getloadavg()

    print(f"\nload average before {load_before[0]:.1f}, after {load_after[0]:.1f}; "
          f"{args.rounds} rounds, {args.steps} steps per run, 3 lab hosts, ring\n")
    print("| launcher | launcher CPU-s per s of job (median) | rank 0 median step ms (median) "
          "| wall s (median) |")
    print("|---|---:|---:|---:|")
    for name, g in got.items():
        per_s = statistics.median(c / w for c, w in zip(g["cpu"], g["wall"], strict=True))
        print(f"| {name} | {per_s:.2f} | {statistics.median(g['step']):.1f} "
              f"| {statistics.median(g['wall']):.2f} |")
    plain, quiet = got["plain mlx.launch"], got["quiet_launch"]
    ratios = [q / p for q, p in zip(quiet["step"], plain["step"], strict=True)]
    print(f"\nstep time quiet / plain, paired per round: median {statistics.median(ratios):.2f} "
          f"({', '.join(f'{x:.2f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
