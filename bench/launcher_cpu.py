"""mlx.launch's busy loop: what it costs, and what removing it does to a job.

    python bench/launcher_cpu.py                            # 3-host lab, ring (root, Linux)
    python bench/launcher_cpu.py --rounds 4 --steps 200 --work allsum
    python bench/launcher_cpu.py --local 2 --rounds 6 --steps 60     # this machine, no lab

mlx.launch (mlx 0.32) reads each rank's output in a thread that calls
``select(outputs, [the rank's stdin pipe], [], 1.0)``: a pipe nobody writes
to is always writable, so the select returns at once and the thread loops
without rest for the whole job (its main loop does the same on a stdin at
its end, /dev/null). This bench builds its own 3-host lab (tests/lab) and
runs the same small data-parallel loop (per step: a 384x384 matmul chain,
then an all_sum of 1 MiB; or one of the two, ``--work``) two ways,
alternating in rounds so that each sees the same load:

1. plain: `mlx.launch --hosts IP,IP,IP --backend ring --python PY -- prog.py`,
   stdin closed, as the jobs layer starts it;
2. patient: the same mlx.launch with ``select`` in its module replaced
   (``PATIENT_LAUNCH`` below, run with ``python -c``): no writability asked
   for, no wait longer than 50 ms.

With ``--local N`` the N ranks run on this machine (``mlx.launch -n N``, what
``--local`` jobs and the test suite start), and a third way starts them
with no launcher at all:

3. by hand: each rank started here with the environment mlx.launch would
   give it (``MLX_RANK``, ``MLX_HOSTFILE`` naming the ring's ports).

Reports, per way: the launcher's CPU seconds (user + system, sampled every
0.1 s until it ends) per second of the job, rank 0's median step time and
wall time. Every run's ranks must all print their result. The figures and
why mlxcluster keeps the plain launcher: docs/performance-runs.md, "mlx.launch's
busy loop".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cpu_support import cpu_seconds_until_exit  # noqa: E402
from tests.lab import lab_unavailable_reason, start_lab  # noqa: E402

# mlx.launch with a select that waits for output only (at most 50 ms), run as
# `python -c PATIENT_LAUNCH MLX_LAUNCH ARGS...` with the python of mlx.launch.
PATIENT_LAUNCH = """
import select, sys
import mlx._distributed_utils.launch as launch

def patient_select(rlist, wlist, xlist, timeout=None):
    limit = 0.05 if timeout is None else min(timeout, 0.05)
    readable, _, exceptional = select.select(rlist, [], xlist, limit)
    return readable, [], exceptional

assert launch.select is select.select, "this mlx.launch is not the one this bench patches"
launch.select = patient_select
read_end, write_end = __import__("os").pipe()  # a stdin that never has data: no loop at its end
__import__("os").dup2(read_end, 0)
sys.argv = sys.argv[1:]
sys.exit(launch.main())
"""

PROGRAM = """
import sys, time, statistics
import mlx.core as mx
steps, work = int(sys.argv[1]), sys.argv[2]
g = mx.distributed.init(strict=True, backend="any")
a = mx.random.normal((384, 384))
grad = mx.ones((256 * 1024,))
times = []
for _ in range(steps):
    t = time.perf_counter()
    b = a
    for _ in range(4 if work != "allsum" else 0):
        b = (b @ a) / 384.0
    total = mx.distributed.all_sum(grad) if work != "matmul" else grad * g.size()
    mx.eval(b, total)
    times.append(time.perf_counter() - t)
# One write per line: ranks started by hand share one pipe.
sys.stdout.write(f"RESULT rank {g.rank()} median_step_ms {statistics.median(times) * 1000:.2f} "
                 f"sum {total[0].item():.0f}\\n")
sys.stdout.flush()
"""


BY_HAND = "by hand"


def started(argv: list[str] | str, env: dict[str, str], cwd: Path, ranks: int) -> subprocess.Popen:
    """The launcher, or (``BY_HAND``) a shell that starts the ranks itself as
    mlx.launch would (its MLX_HOSTFILE: one ring port per rank) and waits."""
    if argv != BY_HAND:
        return subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    hostfile = cwd / "ring.json"
    base = 5000 + (os.getpid() % 200) * 20
    hostfile.write_text(json.dumps([[f"127.0.0.1:{base + r}"] for r in range(ranks)]))
    prog = env["BENCH_PROG"]
    script = " ".join(f"MLX_RANK={r} MLX_HOSTFILE={hostfile} {sys.executable} {prog} &"
                      for r in range(ranks)) + " wait"
    return subprocess.Popen(["sh", "-c", script], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def timed(argv: list[str] | str, env: dict[str, str], cwd: Path,
          ranks: int = 3) -> tuple[float, float, float]:
    """(launcher CPU seconds, rank 0's median step ms, wall seconds); raises
    when a rank's result is missing."""
    start = time.monotonic()
    proc = started(argv, env, cwd, ranks)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    cpu = cpu_seconds_until_exit(proc)
    proc.wait()
    reader.join(timeout=10)
    wall = time.monotonic() - start
    results = [ln.split() for ln in lines if ln.startswith("RESULT ")]
    if len(results) != ranks or any(r[-1] != str(ranks) for r in results):
        raise SystemExit(f"{argv[:3]}... exited {proc.returncode}:\n{''.join(lines[-30:])}")
    rank0 = next(float(r[4]) for r in results if r[2] == "0")
    return cpu, rank0, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--work", choices=("both", "allsum", "matmul"), default="both",
                        help="per step: the matmul chain and the all_sum (both), or one of them")
    parser.add_argument("--local", type=int, metavar="N",
                        help="N ranks on this machine (no lab), and a third way: by hand")
    args = parser.parse_args()
    if not args.local:
        why = lab_unavailable_reason()
        if why:
            raise SystemExit(f"no lab here: {why}")
    mlx_launch = str(Path(sys.executable).parent / "mlx.launch")
    with (contextlib.nullcontext() if args.local else start_lab(3)) as lab, \
            tempfile.TemporaryDirectory(prefix="launcher-cpu.") as tmp:
        work = Path(tmp)
        prog = work / "prog.py"
        prog.write_text(PROGRAM)
        ranks = args.local or 3
        if lab is None:
            env = {**os.environ, "BENCH_PROG": f"{prog} {args.steps} {args.work}"}
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
            hosts = ["-n", str(ranks)]
            python = sys.executable
        else:
            env = lab.env()
            env.pop("LD_PRELOAD", None)
            hosts = ["--hosts", ",".join(h.ip for h in lab.hosts)]
            python = lab.python
        launch_args = [*hosts, "--backend", "ring", "--python", python, "--", str(prog),
                       str(args.steps), args.work]
        ways: dict[str, list[str] | str] = {
            "plain mlx.launch": [mlx_launch, *launch_args],
            "patient mlx.launch": [sys.executable, "-c", PATIENT_LAUNCH, mlx_launch, *launch_args]}
        if lab is None:
            ways[BY_HAND] = BY_HAND
        got: dict[str, dict[str, list[float]]] = {w: {"cpu": [], "step": [], "wall": []} for w in ways}
        load_before = os.getloadavg()
        for r in range(args.rounds):
            for name, argv in (ways.items() if r % 2 == 0 else reversed(ways.items())):
                cpu, step, wall = timed(argv, env, work, ranks)
                got[name]["cpu"].append(cpu)
                got[name]["step"].append(step)
                got[name]["wall"].append(wall)
            print(f"round {r + 1}: " + ", ".join(
                f"{n}: launcher {g['cpu'][-1]:.2f} CPU-s in {g['wall'][-1]:.2f} s, "
                f"step {g['step'][-1]:.1f} ms" for n, g in got.items()), flush=True)
        load_after = os.getloadavg()

    where = f"{ranks} ranks on this machine" if args.local else "3 lab hosts"
    print(f"\nload average before {load_before[0]:.1f}, after {load_after[0]:.1f}; "
          f"{args.rounds} rounds, {args.steps} steps per run ({args.work}), {where}, ring\n")
    print("| launcher | launcher CPU-s per s of job (median) | rank 0 median step ms (median) "
          "| wall s (median) |")
    print("|---|---:|---:|---:|")
    for name, g in got.items():
        per_s = statistics.median(c / w for c, w in zip(g["cpu"], g["wall"], strict=True))
        print(f"| {name} | {per_s:.2f} | {statistics.median(g['step']):.1f} "
              f"| {statistics.median(g['wall']):.2f} |")
    plain = got["plain mlx.launch"]
    for name, g in got.items():
        if g is plain:
            continue
        ratios = [q / p for q, p in zip(g["step"], plain["step"], strict=True)]
        print(f"\nstep time {name} / plain, paired per round: median "
              f"{statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
