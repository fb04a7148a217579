"""Our training step against mlx-lm's, alone, in one process, in turn.

    python bench/step_vs_mlx_lm.py              # ~2 minutes on 2 cores
    python bench/step_vs_mlx_lm.py --rounds 9 --steps 20

bench/vs_mlx_lm.py compares the two trainers whole, each in its own process
(start-up, data, reports and all); their tokens/s differ by a few percent
from run to run on this shared machine. This one takes the noise out of
the step itself: the same Llama folder (bench/vs_mlx_lm.py's), loaded once
by our Trainer (`--init_from`) and once by mlx-lm's `load`, the same batch
of 8 x 128 tokens, float32, AdamW, both in one process; then round after
round, --steps of ours (`Trainer.train_step`, the step it runs when the step
is not logged) and --steps of mlx-lm's (its trainer's compiled step:
value_and_grad of its default loss, average_gradients, optimizer.update,
one mx.compile with the state, evaluated as it does). A third trainer,
ours with `--kernels mlx` (MLX's softmax, silu and loss: the kernels mlx-lm
runs), shows what reference_train/kernels.py is worth. Prints ms per step per
round and the ratios mlx-lm / ours (> 1: ours is faster), with the medians.
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
sys.path.insert(0, str(REPO / "bench"))

from bench_support import mlx_lm_step, rerun_with_openblas  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="steps of each per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    blas = rerun_with_openblas(threads=2)

    import mlx.core as mx
    import numpy as np
    from vs_mlx_lm import CONFIG, build

    from reference_train.config import build_config
    from reference_train.launch_env import init_group
    from reference_train.train import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        folder, tokens, _ = build(Path(tmp), args.block_size)

        def trainer(*extra: str) -> Trainer:
            cfg = build_config(["--init_from", str(folder), "--data", str(tokens), "--out",
                                str(Path(tmp) / "out"), "--global_batch", str(args.batch),
                                "--block_size", str(args.block_size), "--eval_every", "0",
                                "--sample_tokens", "0", "--warmup_steps", "0", "--grad_clip",
                                "0", "--lr", "1e-5", "--steps", str(10 * args.rounds * args.steps),
                                *extra])
            made = Trainer(cfg, init_group(), lambda msg: None)
            # kernels.use() is process-wide and read when the step is traced: trace this
            # trainer's step now, before the next Trainer sets its own --kernels.
            made.train_step()
            return made

        ours, ours_mlx = trainer(), trainer("--kernels", "mlx")
        theirs = mlx_lm_step(folder)
        x, y = ours.train_data.batch(0)
        # mlx-lm's batch is the sequence and its last target; lengths mark every token
        batch = mx.array(np.concatenate([x, y[:, -1:]], axis=1).astype(np.int32))
        lengths = mx.array([[0, args.block_size]] * args.batch)

        def ours_s(which: Trainer = ours) -> float:
            start = time.perf_counter()
            for _ in range(args.steps):
                which.train_step()
            return (time.perf_counter() - start) / args.steps

        def theirs_s() -> float:
            start = time.perf_counter()
            for _ in range(args.steps):
                theirs(batch, lengths)
            return (time.perf_counter() - start) / args.steps

        ours_s(), ours_s(ours_mlx), theirs_s()  # compile, warm the caches
        rounds = [(ours_s(), theirs_s(), ours_s(ours_mlx)) for _ in range(args.rounds)]
    ratios = [t / o for o, t, _ in rounds]
    ratios_mlx = [t / m for _, t, m in rounds]
    print(f"Llama {CONFIG['hidden_size']}x{CONFIG['num_hidden_layers']} layers, vocab "
          f"{CONFIG['vocab_size']}, batch {args.batch} x {args.block_size}, float32, AdamW, one "
          f"process, {args.rounds} rounds of {args.steps} steps each, blas "
          f"{'OpenBLAS' if blas else 'default'}")
    print("  ours ms/step:              " + ", ".join(f"{o * 1000:.1f}" for o, _, _ in rounds))
    print("  ours, --kernels mlx:       " + ", ".join(f"{m * 1000:.1f}" for _, _, m in rounds))
    print("  mlx-lm ms/step:            " + ", ".join(f"{t * 1000:.1f}" for _, t, _ in rounds))
    print(f"  mlx-lm / ours (> 1: ours faster): {', '.join(f'{r:.3f}' for r in ratios)} "
          f"(median {statistics.median(ratios):.3f})")
    print(f"  mlx-lm / ours with --kernels mlx: {', '.join(f'{r:.3f}' for r in ratios_mlx)} "
          f"(median {statistics.median(ratios_mlx):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
