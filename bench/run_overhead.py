"""What `mlxcluster run` adds over bare `mlx.launch` for a short job (goal:
within 10% or 0.5 s).

    python bench/run_overhead.py                  # 3-host lab, ring, 7 rounds (root, Linux)
    python bench/run_overhead.py --rounds 9 --backend ring

Builds its own 3-host lab (tests/lab: sshd in network namespaces, one
shared filesystem) and times, start to exit, the same tiny program (init,
one all_sum, a line) three ways, in alternating rounds so that each sees the
same load on a shared machine:

1. bare: `mlx.launch --hosts IP,IP,IP --backend ring --python PY -- prog.py`;
2. `mlxcluster run -i INV --no-preflight -- prog.py`;
3. `mlxcluster run -i INV -- prog.py` (probe, doctor checks, all_sum smoke);
4. with ``--compare-with DIR``: 2. from another checkout (before and after a
   change, in the same rounds).

Reports the median of each and the medians of the differences, and where
run's time goes: each of its output lines is timestamped as it arrives
(probe done, doctor done, smoke done, launching, the ranks' line, finished),
plus the python start-up of the mlxcluster command itself (`mlxcluster
--help`). Every run's exit code is checked.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.lab import lab_unavailable_reason, start_lab  # noqa: E402

PROGRAM = """
import mlx.core as mx
g = mx.distributed.init(strict=True, backend="any")
total = mx.distributed.all_sum(mx.array([1.0])).item()
print(f"rank {g.rank()} of {g.size()}: all_sum {total:.0f}", flush=True)
"""

# Where run's time goes: the first output line that starts with each marker ends a phase.
PHASES = (("probe", "[✓] 3 host(s) run"), ("doctor", "[✓] doctor:"), ("smoke", "[✓] smoke:"),
          ("launching", "launching "), ("first rank line", "["), ("finished", "run finished"))


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, dict[str, float]]:
    """Seconds from start to exit, and when each phase's line arrived (seconds
    from start). Raises when the command fails."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    seen: dict[str, float] = {}
    lines = []
    for line in proc.stdout:
        now = time.monotonic() - start
        lines.append(line)
        for name, marker in PHASES:
            if name in seen:
                continue
            if name == "first rank line":
                if "launching" in seen and line.startswith("[") and "all_sum" in line:
                    seen[name] = now
            elif line.startswith(marker):
                seen[name] = now
    code = proc.wait(timeout=300)
    took = time.monotonic() - start
    if code != 0 or not any("all_sum 3" in ln for ln in lines):
        raise SystemExit(f"{argv[:4]}... exited {code}:\n{''.join(lines[-30:])}")
    return took, seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--backend", default="ring", choices=("ring",))
    parser.add_argument("--compare-with", metavar="DIR", default=None,
                        help="another mlxcluster checkout (e.g. a git worktree of an older "
                             "commit): its `run --no-preflight` runs in the same rounds")
    parser.add_argument("--no-preflight-only", action="store_true",
                        help="leave out `run` with its preflight (shorter rounds)")
    args = parser.parse_args()
    why = lab_unavailable_reason()
    if why:
        raise SystemExit(f"no lab here: {why}")

    with start_lab(3) as lab, tempfile.TemporaryDirectory(prefix="run-overhead.") as tmp:
        work = Path(tmp)
        prog = work / "prog.py"  # the lab's hosts share this machine's files
        prog.write_text(PROGRAM)
        inventory = lab.write_inventory(work / "inventory.yaml")
        env = lab.env()
        env["PYTHONPATH"] = str(REPO)
        env.pop("LD_PRELOAD", None)
        mlx_launch = str(Path(sys.executable).parent / "mlx.launch")
        ours = [sys.executable, "-m", "mlxcluster", "run", "-i", str(inventory),
                "--backend", args.backend, "--logs", str(work / "logs")]
        commands = {
            "bare mlx.launch": [mlx_launch, "--hosts", ",".join(h.ip for h in lab.hosts),
                                "--backend", args.backend, "--python", lab.python, "--", str(prog)],
            "run --no-preflight": [*ours, "--no-preflight", "--", str(prog)],
        }
        if not args.no_preflight_only:
            commands["run (preflight)"] = [*ours, "--", str(prog)]
        envs = {name: env for name in commands}
        if args.compare_with:
            other = f"run --no-preflight ({Path(args.compare_with).name})"
            commands[other] = [*ours, "--no-preflight", "--", str(prog)]
            envs[other] = {**env, "PYTHONPATH": str(Path(args.compare_with).resolve())}
        startup = [sys.executable, "-m", "mlxcluster", "--help"]
        times: dict[str, list[float]] = {name: [] for name in [*commands, "mlxcluster --help"]}
        phases: dict[str, dict[str, list[float]]] = {name: {} for name in commands}
        load_before = os.getloadavg()
        for r in range(args.rounds):
            for name, argv in commands.items():
                took, seen = timed(argv, envs[name], work)
                times[name].append(took)
                for phase, at in seen.items():
                    phases[name].setdefault(phase, []).append(at)
            started = time.monotonic()
            subprocess.run(startup, env=env, capture_output=True, check=True, timeout=120)
            times["mlxcluster --help"].append(time.monotonic() - started)
            print(f"round {r + 1}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()),
                  flush=True)
        load_after = os.getloadavg()

    bare = times["bare mlx.launch"]
    print(f"\n{args.rounds} alternating rounds, 3 lab hosts, {args.backend}; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} cores)")
    print("| command | median s | min-max s | median added over bare (paired) | ratio |")
    print("|---|---|---|---|---|")
    for name, t in times.items():
        added = statistics.median(x - b for x, b in zip(t, bare, strict=True))
        ratio = statistics.median(t) / statistics.median(bare)
        print(f"| {name} | {statistics.median(t):.2f} | {min(t):.2f}-{max(t):.2f} | "
              f"{added:+.2f} | {ratio:.2f}x |")
    for name, seen in phases.items():
        if not seen:
            continue
        marks = ", ".join(f"{phase} at {statistics.median(at):.2f} s"
                          for phase, at in sorted(seen.items(), key=lambda kv: statistics.median(kv[1])))
        print(f"{name}: median {statistics.median(times[name]):.2f} s; {marks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
