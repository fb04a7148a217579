"""What a slice of the test suite costs this machine: wall seconds, the CPU seconds of
the whole machine (every lab host runs here), and how many times `g++` built an MLX
kernel, for test files run in a pytest process of their own from a cold start.

Cold means what a fresh machine has: a new empty TMPDIR for pytest (so MLX's kernel
cache under it is empty) and new labs (each lab starts its own hosts). The candidates
are variants of the suite's own switches, run in one bench run, alternating, so that
the machine's noise falls on both:

- ``own``: every lab host keeps its own MLX kernel cache and every process builds what
  it misses (MLXCLUSTER_LAB_OWN_KERNELS=1, the suite as it was before issue 50);
- ``shared``: the lab hosts and this machine share one, and tests/kernel_cc/g++ builds
  each kernel source once for the ranks that miss it at the same moment, MLX's preamble
  precompiled once (the suite now);
- ``no-pch``: shared, but every build parses MLX's preamble again
  (MLXCLUSTER_KERNEL_PCH=0, the suite before the precompiled header).

    python bench/suite_cpu.py tests/lab/test_hf_lab.py tests/lab/test_train_lab.py --rounds 1
    python bench/suite_cpu.py tests/test_preference_train.py --only shared no-pch

Machine CPU seconds come from /proc/stat (user + nice + system + irq + softirq, all
cores), so run it with nothing else on the machine; g++ builds are counted by polling
for `cc1plus` processes every 0.1 s (each build lasts a second or more here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
CANDIDATES = {"own": {"MLXCLUSTER_LAB_OWN_KERNELS": "1"}, "shared": {},
              "no-pch": {"MLXCLUSTER_KERNEL_PCH": "0"}}


def machine_cpu_s() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class CompileCounter(threading.Thread):
    """Counts distinct cc1plus processes (one per kernel g++ builds) while it runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[tuple[int, float]] = set()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            for proc in psutil.process_iter(["name", "create_time"]):
                if proc.info["name"] == "cc1plus":
                    self.seen.add((proc.pid, proc.info["create_time"]))
            time.sleep(0.1)


def run_once(files: list[str], name: str, workers: int) -> dict:
    env = {key: value for key, value in os.environ.items()
           if key not in ("MLXCLUSTER_LAB_OWN_KERNELS", "MLXCLUSTER_KERNEL_PCH")}
    env.update(CANDIDATES[name], CI="true")
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as tmp:
        env["TMPDIR"] = tmp
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
        if workers:
            cmd += ["-n", str(workers), "--dist", "loadscope"]
        counter = CompileCounter()
        counter.start()
        cpu0, t0 = machine_cpu_s(), time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        wall, cpu = time.monotonic() - t0, machine_cpu_s() - cpu0
        counter.stopped.set()
        counter.join()
        kernels = len(list(Path(tmp).glob("mlx/*/cpu/*.so")))
    last = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    if proc.returncode != 0:  # what failed, for whoever reads the bench's output
        print(proc.stdout[-6000:], proc.stderr[-2000:], sep="\n", file=sys.stderr, flush=True)
    return {"candidate": name, "wall_s": round(wall, 1), "machine_cpu_s": round(cpu, 1),
            "g++_builds": len(counter.seen), "kernels_in_shared_cache": kernels,
            "pytest": last, "rc": proc.returncode}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0, help="pytest-xdist workers (0: none)")
    parser.add_argument("--only", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES),
                        help="the candidates to run (the first is the others' yardstick)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    for r in range(args.rounds):
        order = args.only if r % 2 == 0 else list(reversed(args.only))
        for name in order:
            row = {"round": r + 1, **run_once(args.files, name, args.workers)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = args.only[0]
    for key in ("wall_s", "machine_cpu_s", "g++_builds"):
        totals = {name: sum(row[key] for row in rows if row["candidate"] == name)
                  for name in args.only}
        ratios = [f"{name}/{base} {total / totals[base]:.2f}" for name, total in totals.items()
                  if name != base and totals[base]]
        print(f"{key}: " + ", ".join([f"{name} {total:.0f}" for name, total in totals.items()]
                                     + ratios))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(row["rc"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
