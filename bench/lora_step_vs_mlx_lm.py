"""Our LoRA / QLoRA training step against mlx-lm's, alone, in one process, in turn.

    python bench/lora_step_vs_mlx_lm.py                      # QLoRA, ~6 minutes on 2 cores
    python bench/lora_step_vs_mlx_lm.py --kinds LoRA,QLoRA --rounds 5 --steps 3

bench/lora_vs_mlx_lm.py compares the two trainers whole, each in its own
process, two rounds on a machine whose load moves; this one takes the step
alone, as bench/step_vs_mlx_lm.py does for full fine-tuning: the same model
folders (float32, and 4-bit in groups of 32 quantized by mlx-lm), the same
chat rows with --mask_prompt, batch 8 x 128 and LoRA (rank 8, scale 20,
dropout 0, all 4 blocks' 7 linear layers, AdamW lr 1e-5) as that bench. Ours is
`Trainer.train_step` (`--fine_tune lora`, the step it runs when the step is
not logged); mlx-lm's is its trainer's compiled step on the model that
mlx_lm.lora makes (`load`, `freeze`, `linear_to_lora_layers`;
bench_support.mlx_lm_step), fed our batch with `lengths` marking the same
trained targets. A third trainer, ours with `--kernels mlx` (MLX's softmax,
silu, attention and loss, as mlx-lm runs them), shows what kernels.py does here.

Round after round, --steps of each, in turn. Printed: ms per step, the ratios
mlx-lm / ours (> 1: ours faster) with their median, and memory: what each
trainer holds between steps (MLX's active memory after it was built and
stepped once, over the memory before) and the most a step adds on top
(mx.get_peak_memory() over the active memory before the step, after
mx.reset_peak_memory()). Before any step the two trainers' losses on the
same batch are printed: with lora_b zero both are the base model's.
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
from lora_vs_mlx_lm import CONFIG, DROPOUT, KEYS, RANK, SCALE, build  # noqa: E402

MIB = 2**20


def held(make):
    """(what ``make()`` returns, MLX memory it holds afterwards, in MiB)."""
    import gc

    import mlx.core as mx

    gc.collect()
    before = mx.get_active_memory()
    made = make()
    gc.collect()
    return made, (mx.get_active_memory() - before) / MIB


def compare(kind: str, folder: Path, tokens: Path, tmp: Path, args, blas) -> None:
    """Time ``kind`` (LoRA or QLoRA, on ``folder``): ours, mlx-lm's, ours with
    --kernels mlx, in turn; print the rounds, ratios and memory."""
    import mlx.core as mx
    import numpy as np

    from reference_train.config import build_config
    from reference_train.launch_env import init_group
    from reference_train.model import loss_fn
    from reference_train.train import Trainer

    def trainer(*extra: str) -> Trainer:
        cfg = build_config(["--init_from", str(folder), "--data", str(tokens), "--out",
                            str(tmp / "out"), "--global_batch", str(args.batch),
                            "--block_size", str(args.block_size), "--eval_every", "0",
                            "--sample_tokens", "0", "--warmup_steps", "0",
                            "--grad_clip", "0", "--lr", "1e-5", "--steps", "1000",
                            "--fine_tune", "lora", "--lora_rank", str(RANK),
                            "--lora_scale", str(SCALE), "--lora_dropout", str(DROPOUT),
                            "--lora_layers", str(CONFIG["num_hidden_layers"]),
                            "--lora_keys", ",".join(KEYS), *extra])
        made = Trainer(cfg, init_group(), lambda msg: None)
        made.model.train()
        # kernels.use() is process-wide and read when the step is traced: trace
        # this trainer's step now, before the next Trainer sets its own --kernels.
        made.first_loss = loss_fn(made.model, *map(mx.array, made.train_data.batch(0))).item()
        made.train_step()
        return made

    ours, ours_held = held(trainer)
    names = ["ours", "mlx-lm"] + ([] if args.no_kernels_mlx else ["ours --kernels mlx"])
    x, y, w = ours.train_data.batch(0)
    # mlx-lm's batch is a row's ids: the first input, then the targets (a row's
    # last id is a target only); its mask keeps target j (0-based) where
    # lengths[0] <= j + 1 <= lengths[1]: our trained targets
    trained = [np.flatnonzero(row) for row in w]
    assert all(len(t) == t[-1] - t[0] + 1 for t in trained), "trained targets not one run"
    batch = mx.array(np.concatenate([x[:, :1], y], axis=1).astype(np.int32))
    lengths = mx.array([[int(t[0]) + 1, int(t[-1]) + 1] for t in trained])

    def theirs_made():
        from mlx_lm.tuner.trainer import default_loss

        run = mlx_lm_step(folder, {"rank": RANK, "scale": SCALE, "dropout": DROPOUT,
                                   "keys": list(KEYS)}, CONFIG["num_hidden_layers"])
        run.first_loss = default_loss(run.model, batch, lengths)[0].item()
        run(batch, lengths)  # compile
        return run

    theirs, theirs_held = held(theirs_made)
    runners = {"ours": (lambda: ours.train_step()), "mlx-lm": (lambda: theirs(batch, lengths))}
    held_mib = {"ours": ours_held, "mlx-lm": theirs_held}
    if not args.no_kernels_mlx:
        ours_mlx, held_mib["ours --kernels mlx"] = held(lambda: trainer("--kernels", "mlx"))
        runners["ours --kernels mlx"] = lambda: ours_mlx.train_step()

    def timed(name: str) -> tuple[float, float]:
        """(seconds a step, MiB a step adds at most)."""
        import gc
        gc.collect()
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        start = time.perf_counter()
        for _ in range(args.steps):
            runners[name]()
        seconds = (time.perf_counter() - start) / args.steps
        return seconds, (mx.get_peak_memory() - base) / MIB

    for name in names:  # warm the caches
        timed(name)
    rounds = []
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        rounds.append({name: timed(name) for name in order})
        print(f"  {kind} round {r + 1}: " + ", ".join(
            f"{n} {rounds[-1][n][0] * 1000:,.0f} ms" for n in names)
            + f"  (load {open('/proc/loadavg').read().split()[0]})", flush=True)

    print(f"\n{kind}: Llama {CONFIG['hidden_size']}x{CONFIG['num_hidden_layers']} blocks, "
          f"{'4-bit (group 32)' if kind.strip() == 'QLoRA' else 'float32'} base, LoRA rank "
          f"{RANK} scale {SCALE} on 7 linear layers of every block, batch {args.batch} x "
          f"{args.block_size}, --mask_prompt rows, AdamW, one process, {args.rounds} rounds "
          f"of {args.steps} steps each, blas {'OpenBLAS' if blas else 'default'}")
    print(f"  loss before any step, same batch: ours {ours.first_loss:.6f}, mlx-lm "
          f"{theirs.first_loss:.6f}")
    for name in names:
        ms = [x[name][0] * 1000 for x in rounds]
        extra = statistics.median(x[name][1] for x in rounds)
        print(f"  {name:19s} ms/step: {', '.join(f'{m:,.0f}' for m in ms)}; holds "
              f"{held_mib[name]:.1f} MiB, a step adds {extra:.1f} MiB at most")
    for name in [n for n in names if n != "mlx-lm"]:
        ratios = [x["mlx-lm"][0] / x[name][0] for x in rounds]
        print(f"  mlx-lm / {name} (> 1: ours faster): "
              f"{', '.join(f'{r:.3f}' for r in ratios)} (median {statistics.median(ratios):.3f})")
    print(f"  load average at the end: {open('/proc/loadavg').read().strip()}\n", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", default="QLoRA", help="LoRA, QLoRA or both (comma-separated)")
    p.add_argument("--steps", type=int, default=3, help="steps of each per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--no-kernels-mlx", action="store_true",
                   help="leave out our trainer with --kernels mlx")
    args = p.parse_args()
    blas = rerun_with_openblas(threads=2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        floating, q4, tokens, _ = build(tmp, 8 * args.batch, args.block_size)
        for kind in args.kinds.split(","):
            kind = kind.strip()
            compare(kind, {"LoRA": floating, "QLoRA": q4}[kind], tokens, tmp, args, blas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
