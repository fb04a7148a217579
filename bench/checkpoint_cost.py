"""What a checkpoint costs each host, against the time of a training step.

    python bench/checkpoint_cost.py                 # demo config, ~2 minutes on 2 cores
    python bench/checkpoint_cost.py --config tiny --rounds 9

Every host writes its own copy of each checkpoint (one writer per host,
issue 21), so each host pays this cost itself. In one process (OpenBLAS
preloaded where Linux has it, as `mlxcluster train` runs ranks), after a
warm-up, rounds alternate `--steps` training steps with one checkpoint
(model + AdamW state in safetensors, their sha256 in state.json, written
atomically), so both see the same load. Prints the medians, the checkpoint's
size, the checkpoint / step ratio, and what `train --max-restarts`'s rule
(a checkpoint every steps/20 when none is set) adds to the run at the
config's own step count.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_support import rerun_with_openblas  # noqa: E402

from mlxcluster.launch.trainer import restart_checkpoint_every  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="demo")
    p.add_argument("--steps", type=int, default=10, help="training steps per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    blas = rerun_with_openblas(threads=1)

    import mlx.core as mx

    from reference_train.checkpoint import checkpoint_name
    from reference_train.config import build_config
    from reference_train.launch_env import init_group
    from reference_train.train import Trainer

    with tempfile.TemporaryDirectory(prefix="ckpt-bench.") as out:
        cfg = build_config(["--config", args.config, "--out", out, "--sample_tokens", "0"])
        trainer = Trainer(cfg, init_group(), lambda msg: None)
        for _ in range(args.warmup):
            mx.eval(trainer.train_step())
        trainer.checkpoint()  # the first one also makes the folders
        step_s, ckpt_s = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(args.steps):
                mx.eval(trainer.train_step())
            step_s.append((time.perf_counter() - start) / args.steps)
            start = time.perf_counter()
            trainer.checkpoint()
            ckpt_s.append(time.perf_counter() - start)
        folder = Path(out) / "checkpoints" / checkpoint_name(trainer.step)
        size = sum(f.stat().st_size for f in folder.iterdir())
    step, ckpt = statistics.median(step_s), statistics.median(ckpt_s)
    every = restart_checkpoint_every(cfg.steps)
    print(f"config {args.config}: {cfg.steps} steps, global batch {cfg.global_batch}, "
          f"blas {'OpenBLAS' if blas else 'default'}, {args.rounds} rounds of {args.steps} steps")
    print(f"training step        {step * 1000:8.1f} ms (median; min {min(step_s) * 1000:.1f}, "
          f"max {max(step_s) * 1000:.1f})")
    print(f"checkpoint           {ckpt * 1000:8.1f} ms (median; min {min(ckpt_s) * 1000:.1f}, "
          f"max {max(ckpt_s) * 1000:.1f}), {size / 1e6:.1f} MB per host")
    print(f"checkpoint / step    {ckpt / step:8.2f}")
    print(f"--max-restarts rule: a checkpoint every {every} steps (steps/20) adds "
          f"{100 * ckpt / (every * step):.1f}% to the training time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
