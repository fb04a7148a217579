"""AdamW state per rank with and without --shard_optimizer, at 1, 2 and 4 ranks.

    python bench/optimizer_memory.py                    # demo config, ~1 minute
    python bench/optimizer_memory.py --config blog --ranks 1,2,4,8

Each case starts the real trainer's ``Trainer`` on N local ranks (mlx.launch,
ring), runs 3 steps, and every rank reports the bytes of the optimizer state
it holds (the arrays of ``optimizer.state``) and its MLX peak memory. Prints,
per case, the largest rank's state and its ratio to the unsharded state
(goal, issue 22: 1/N plus little).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RANK_SCRIPT = """
import json, sys
import mlx.core as mx
from mlx.utils import tree_flatten
from reference_train.launch_env import init_group  # noqa: E402
from reference_train.config import build_config
from reference_train.train import Trainer
group = init_group()
cfg = build_config(sys.argv[1:])
trainer = Trainer(cfg, group, lambda m: None)
for _ in range(3):
    mx.eval(trainer.train_step())
state = sum(v.nbytes for _, v in tree_flatten(trainer.optimizer.state) if isinstance(v, mx.array))
params = sum(v.nbytes for _, v in tree_flatten(trainer.model.parameters()))
print("RESULT " + json.dumps({"rank": group.rank(), "state": state, "params": params,
                              "peak": mx.get_peak_memory()}), flush=True)
"""


def run_case(config: str, ranks: int, shard: bool, tmp: Path) -> list[dict]:
    script = tmp / "rank.py"
    script.write_text(RANK_SCRIPT)
    args = ["--config", config, "--sample_tokens", "0", "--out", str(tmp / "out"),
            "--global_batch", str(16 if 16 % ranks == 0 else ranks * 4),
            "--shard_optimizer", "true" if shard else "false"]
    launch = Path(sys.executable).parent / "mlx.launch"
    argv = [str(launch), "-n", str(ranks), "--backend", "ring", "--python", sys.executable,
            "--env", f"PYTHONPATH={REPO}", "--", str(script), *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if ranks == 1:
        argv = [sys.executable, str(script), *args]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    rows = [json.loads(line.split("RESULT ", 1)[1]) for line in out.stdout.splitlines()
            if "RESULT " in line]
    assert len(rows) == ranks, out.stdout[-2000:] + out.stderr[-2000:]
    return sorted(rows, key=lambda r: r["rank"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="demo")
    p.add_argument("--ranks", default="1,2,4")
    args = p.parse_args()
    print(f"config {args.config}: AdamW state per rank (MiB), largest rank; ratio to unsharded")
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(r) for r in args.ranks.split(",")]:
            plain = run_case(args.config, n, False, Path(tmp))
            sharded = run_case(args.config, n, True, Path(tmp))
            full = max(r["state"] for r in plain)
            most = max(r["state"] for r in sharded)
            shares = " / ".join(f"{r['state'] / 2**20:.2f}" for r in sharded)
            print(f"  {n} rank(s): unsharded {full / 2**20:7.2f}  sharded {shares}  "
                  f"largest x{most / full:.3f} (1/N = {1 / n:.3f}); "
                  f"MLX peak per rank {max(r['peak'] for r in plain) / 2**20:.1f} -> "
                  f"{max(r['peak'] for r in sharded) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
