"""`mlxcluster pull` to three hosts against the same pull to one, this
machine's link slow and the hosts' links not: the fan-out's promise.

    python bench/pull_fanout.py                    # 256 MB, 200 Mbit/s, 3 rounds
    python bench/pull_fanout.py --mb 64 --rate 100mbit --rounds 1

A 3-host lab (network namespaces; every host its own disk). This machine's
side of the lab's network (its bridge device: what this machine sends, not
what the hosts send each other) is slowed to --rate, as a Mac on Wi-Fi or
1 GbE against Macs linked by Thunderbolt. Each round pulls a new model
folder (4 shards of --mb/4 MB, random bytes) to one host, then another to
all three, in turns (which goes first alternates), and times each whole
`mlxcluster pull` command as a user runs it. Without the fan-out, three
hosts would take about three times one host (every copy through the slow
link); the goal is at most 1.5x. Figures: docs/performance.md, "pull".
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.lab import lab_unavailable_reason, start_lab  # noqa: E402
from tests.lab.jobs import training_setup  # noqa: E402


def model(folder: Path, mb: int) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    for i in range(4):
        (folder / f"model-{i + 1:05d}-of-00004.safetensors").write_bytes(os.urandom(mb * 250_000))
    return folder


def pull(inventory: Path, folder: Path, env: dict[str, str], cwd: Path) -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mlxcluster", "pull", "-i", str(inventory),
                           str(folder)], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=3600)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"pull failed:\n{done.stdout}\n{done.stderr}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reason = lab_unavailable_reason()
    if reason:
        raise SystemExit(f"no lab here: {reason}")
    work = Path(tempfile.mkdtemp(prefix="bench-pull."))
    times: dict[int, list[float]] = {1: [], 3: []}
    with start_lab(3) as lab:
        inventory, env = training_setup(lab, work)  # all three hosts
        one = lab.write_inventory(work / "one.yaml", hosts=lab.hosts[:1])
        subprocess.run(["tc", "qdisc", "replace", "dev", lab.bridge, "root", "tbf", "rate", args.rate,
                        "burst", "32kbit", "latency", "400ms"], check=True)
        try:
            for r in range(args.rounds):
                for hosts in ((1, 3) if r % 2 == 0 else (3, 1)):
                    folder = model(lab.disk / f"pull-{uuid.uuid4().hex[:8]}", args.mb)
                    took = pull(one if hosts == 1 else inventory, folder, env, work)
                    times[hosts].append(took)
                    print(f"round {r + 1}: {hosts} host(s) {took:.1f} s", flush=True)
        finally:
            subprocess.run(["tc", "qdisc", "del", "dev", lab.bridge, "root"], check=False)
    ratios = [three / one for one, three in zip(times[1], times[3], strict=True)]
    print(f"\nbench/pull_fanout.py: {args.mb} MB, this machine's link {args.rate}, "
          f"{args.rounds} round(s)")
    print(f"  one host:    {statistics.median(times[1]):.1f} s (median; {', '.join(f'{t:.1f}' for t in times[1])})")
    print(f"  three hosts: {statistics.median(times[3]):.1f} s (median; {', '.join(f'{t:.1f}' for t in times[3])})")
    print(f"  three / one, per round: {', '.join(f'{x:.2f}' for x in ratios)}; median "
          f"{statistics.median(ratios):.2f} (goal: at most 1.5; every copy from here: ~3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
