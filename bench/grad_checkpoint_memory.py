"""Peak MLX memory and step time of training steps with and without --grad_checkpoint.

    python bench/grad_checkpoint_memory.py --steps 1 --rounds 2   # block 1024, minutes
    python bench/grad_checkpoint_memory.py --block_size 2048 --dim 256 --global_batch 2

Each case starts the real trainer's ``Trainer`` in its own process (one rank,
the bundled offline corpus), runs one step (tracing, compiling), resets MLX's
peak memory (mx.reset_peak_memory), then times ``--steps`` more steps and
reports mx.get_peak_memory(). The default model (12 blocks of width 128, one
sequence of 1024 tokens) is small enough for a loaded 2-core CPU, with enough
blocks that the activations kept for the backward pass dominate the peak. The
two cases alternate ``--rounds`` times; the figures are per case medians and
their ratios (checkpointed / plain), which survive a noisy machine better than
the absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CASE_SCRIPT = """
import json, sys, time
import mlx.core as mx
from reference_train.launch_env import init_group
from reference_train.config import build_config
from reference_train.train import Trainer
steps = int(sys.argv[1])
group = init_group()
cfg = build_config(sys.argv[2:])
trainer = Trainer(cfg, group, lambda m: None)
mx.eval(trainer.train_step())  # trace and compile
mx.synchronize()
mx.reset_peak_memory()
start = time.perf_counter()
for _ in range(steps):
    mx.eval(trainer.train_step())
mx.synchronize()
seconds = (time.perf_counter() - start) / steps
print("RESULT " + json.dumps({"peak": mx.get_peak_memory(), "step_s": seconds,
                              "active": mx.get_active_memory()}), flush=True)
"""


def run_case(model_args: list[str], checkpoint: bool, steps: int, tmp: Path) -> dict:
    script = tmp / "case.py"
    script.write_text(CASE_SCRIPT)
    argv = [sys.executable, str(script), str(steps), *model_args, "--out", str(tmp / "out"),
            "--grad_checkpoint", "true" if checkpoint else "false"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    rows = [json.loads(line.split("RESULT ", 1)[1]) for line in out.stdout.splitlines()
            if "RESULT " in line]
    assert len(rows) == 1, out.stdout[-2000:] + out.stderr[-2000:]
    return rows[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--block_size", type=int, default=1024)
    p.add_argument("--global_batch", type=int, default=1)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--n_layers", type=int, default=12)
    p.add_argument("--n_heads", type=int, default=4)
    p.add_argument("--hidden_dim", type=int, default=384)
    p.add_argument("--steps", type=int, default=3, help="timed steps per case")
    p.add_argument("--rounds", type=int, default=2, help="plain / checkpointed pairs")
    p.add_argument("extra", nargs="*", help="more trainer flags, after --")
    args = p.parse_args()
    model_args = ["--config", "demo", "--block_size", str(args.block_size),
                  "--global_batch", str(args.global_batch), "--dim", str(args.dim),
                  "--n_layers", str(args.n_layers), "--n_heads", str(args.n_heads),
                  "--hidden_dim", str(args.hidden_dim), "--steps", "100",
                  "--sample_tokens", "0", "--eval_every", "0", *args.extra]
    print(f"{' '.join(model_args)}: {args.steps} timed steps per case, {args.rounds} rounds")
    cases: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for checkpoint in (False, True):
                row = run_case(model_args, checkpoint, args.steps, Path(tmp))
                cases[checkpoint].append(row)
                print(f"  round {r + 1} grad_checkpoint {str(checkpoint).lower():5}: "
                      f"peak {row['peak'] / 2**20:8.1f} MiB  step {row['step_s']:6.2f} s",
                      flush=True)
    peak = {c: statistics.median(row["peak"] for row in rows) for c, rows in cases.items()}
    step = {c: statistics.median(row["step_s"] for row in rows) for c, rows in cases.items()}
    print(f"peak MLX memory: {peak[False] / 2**20:.1f} -> {peak[True] / 2**20:.1f} MiB "
          f"(x{peak[True] / peak[False]:.3f}); step time {step[False]:.2f} -> {step[True]:.2f} s "
          f"(x{step[True] / step[False]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
