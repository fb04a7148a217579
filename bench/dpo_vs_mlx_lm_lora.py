"""Our DPO training step against mlx-lm-lora's, alone, in one process, in turn.

    python bench/dpo_vs_mlx_lm_lora.py                        # LoRA and full, ~5 minutes
    python bench/dpo_vs_mlx_lm_lora.py --kinds LoRA --rounds 5 --steps 3

The model and pairs: bench/lora_vs_mlx_lm.py's Llama (256 wide, 4 blocks, float32,
saved by mlx-lm, a Llama 3 chat tokenizer), preference pairs of random words (a prompt
of 5-7, each answer of 13-16), one batch of 8 pairs (both trainers step on the same
pairs), every sequence at most --block-size tokens, both padded to the batch's longest. LoRA:
rank 8, scale 20, dropout 0 on the 7 linear layers of every block; full: every weight.
AdamW lr 1e-5, beta 0.1, sigmoid loss.

Ours is `Trainer.train_step` (`--objective dpo`, the step it runs when the step is not
logged); its reference model is the same model with the adapters off (LoRA) or a frozen
copy of the starting weights (full). mlx-lm-lora's is its train_dpo's compiled step
(mlx_lm_lora/trainer/dpo_trainer.py: value_and_grad of its loss_wrapper over
get_token_scores, compute_score and dpo_loss; average_gradients; optimizer.update; one
mx.compile with the state), on mlx-lm's model of the folder (LoRA: frozen and adapted by
linear_to_lora_layers, as mlx_lm_lora.train does) and a second model loaded from the
folder as its reference (load_reference_model), fed one batch of its own
iterate_dpo_batches over its DPODataset of the same pairs.

Round after round, --steps of each, in turn. Printed: ms per step, the ratios theirs /
ours (> 1: ours faster) with their median, trained tokens (both answers) per second, and
memory: what each trainer holds between steps (MLX's active memory after it was built
and stepped once, over the memory before: the model, the reference, the optimizer state)
and the most a step adds on top. Before any step the two losses on the same pairs are
printed (log 2 = 0.693147: the policy is the reference).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_support import rerun_with_openblas  # noqa: E402
from lora_step_vs_mlx_lm import held  # noqa: E402
from lora_vs_mlx_lm import CONFIG, KEYS, RANK, SCALE, WORDS  # noqa: E402

MIB = 2**20
BETA = 0.1


def build(tmp: Path, pairs: int, block: int) -> tuple[Path, Path, list[dict]]:
    """(the float32 model folder, our prepared pairs, the rows)."""
    import shutil

    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from reference_train import prepare
    from tests.chat_support import make_chat_folder
    from tests.hf_support import make_llama_folder

    tokenizer_dir = make_chat_folder(tmp / "tokenizer", "llama3")
    shutil.copytree(tokenizer_dir, tmp / "float")
    folder = make_llama_folder(tmp / "float", CONFIG, seed=0)
    tokenizer = load_tokenizer(tokenizer_dir)
    rng, rows = random.Random(0), []
    while len(rows) < pairs:
        prompt = " ".join(rng.choices(WORDS, k=rng.randint(5, 7)))
        answers = [" ".join(rng.choices(WORDS, k=rng.randint(13, 16))) for _ in range(2)]
        longest = max(len(tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}, {"role": "assistant", "content": a}]))
            for a in answers)
        if longest <= block:
            rows.append({"prompt": prompt, "chosen": answers[0], "rejected": answers[1]})
    src = tmp / "pairs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = tmp / "pairs"
    assert prepare.main(["--out", str(data), "--jsonl", str(src), "--tokenizer", str(folder),
                         "--val-every", "0"]) == 0
    return folder, data, rows


def their_step(folder: Path, kind: str, rows: list[dict], batch: int, block: int):
    """mlx-lm-lora's compiled DPO step (module docstring) as ``run() -> loss``, with its
    batch, its first loss and its trained tokens."""
    from functools import partial

    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.nn.utils import average_gradients
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm_lora.trainer.datasets import DPODataset
    from mlx_lm_lora.trainer.dpo_trainer import (
        compute_score,
        dpo_loss,
        get_token_scores,
        iterate_dpo_batches,
    )

    model, tokenizer = load(str(folder))
    if kind == "LoRA":
        model.freeze()
        linear_to_lora_layers(model, CONFIG["num_hidden_layers"],
                              {"rank": RANK, "scale": SCALE, "dropout": 0.0, "keys": list(KEYS)})
    reference = load(str(folder))[0].freeze()
    model.train()
    optimizer = optim.AdamW(learning_rate=1e-5)
    state = [model.state, optimizer.state, mx.random.state]

    def loss_wrapper(chosen, rejected, chosen_masks, rejected_masks):  # train_dpo's, sigmoid
        pc = compute_score(get_token_scores(model, chosen, chosen_masks), chosen_masks, "sigmoid")
        pr = compute_score(get_token_scores(model, rejected, rejected_masks), rejected_masks,
                           "sigmoid")
        rc = compute_score(mx.stop_gradient(get_token_scores(reference, chosen, chosen_masks)),
                           chosen_masks, "sigmoid")
        rr = compute_score(mx.stop_gradient(get_token_scores(reference, rejected,
                                                             rejected_masks)),
                           rejected_masks, "sigmoid")
        return dpo_loss(pc, pr, rc, rr, chosen_masks, rejected_masks, beta=BETA, delta=50.0,
                        loss_type="sigmoid")

    loss_value_and_grad = nn.value_and_grad(model, loss_wrapper)

    @partial(mx.compile, inputs=state, outputs=state)
    def step(batch):
        (loss, reward, toks, metrics), grad = loss_value_and_grad(*batch)
        optimizer.update(model, average_gradients(grad))
        return loss, toks

    data = DPODataset(rows[:batch], tokenizer)
    one = next(iterate_dpo_batches(data, batch, block + 1))

    def run():
        loss, toks = step(one)
        mx.eval(state, loss, toks)
        return loss

    run.first_loss = loss_wrapper(*one)[0].item()
    run.tokens = int(sum(m[:, 1:].sum().item() for m in one[2:]))
    run()  # compiled, and the optimizer's state made, as ours is by its first step
    return run


def compare(kind: str, folder: Path, data: Path, rows: list[dict], tmp: Path, args,
            blas) -> None:
    import gc

    import mlx.core as mx

    from reference_train.data import load_meta

    # both pad to the longest sequence of the batch (mlx-lm-lora's dynamic padding)
    block = load_meta(data)["splits"]["train"]["max_length"] - 1
    from reference_train.config import build_config
    from reference_train.launch_env import init_group
    from reference_train.train import Trainer

    def ours_made() -> Trainer:
        tune = ["--fine_tune", "lora", "--lora_rank", str(RANK), "--lora_scale", str(SCALE),
                "--lora_dropout", "0", "--lora_layers", str(CONFIG["num_hidden_layers"]),
                "--lora_keys", ",".join(KEYS)] if kind == "LoRA" else ["--fine_tune", "full"]
        cfg = build_config(["--init_from", str(folder), "--data", str(data), "--out",
                            str(tmp / "out"), "--global_batch", str(args.batch),
                            "--block_size", str(block), "--eval_every", "0",
                            "--sample_tokens", "0", "--warmup_steps", "0", "--grad_clip", "0",
                            "--lr", "1e-5", "--min_lr", "1e-5", "--weight_decay", "0.01",
                            "--beta1", "0.9", "--beta2", "0.999", "--steps", "1000",
                            "--objective", "dpo", "--beta", str(BETA), "--kernels",
                            args.kernels, *tune])
        made = Trainer(cfg, init_group(), lambda msg: None)
        made.model.train()
        batch = [mx.array(a) for a in made.train_data.batch(0)]
        made.first_loss = made.step_fn.objective.loss(made.model, *batch)[0].item()
        made.tokens = made.train_data.trained_tokens(0)
        made.train_step()
        return made

    ours, ours_held = held(ours_made)
    theirs, theirs_held = held(lambda: their_step(folder, kind, rows, args.batch, block))
    gc.collect()
    runners = {"ours": lambda: ours.train_step(), "mlx-lm-lora": theirs}
    names = list(runners)

    def timed(name: str) -> tuple[float, float]:
        gc.collect()
        base = mx.get_active_memory()
        mx.reset_peak_memory()
        start = time.perf_counter()
        for _ in range(args.steps):
            runners[name]()
        return (time.perf_counter() - start) / args.steps, (mx.get_peak_memory() - base) / MIB

    for name in names:  # warm the caches
        timed(name)
    rounds = []
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        rounds.append({name: timed(name) for name in order})
        print(f"  {kind} round {r + 1}: " + ", ".join(
            f"{n} {rounds[-1][n][0] * 1000:,.0f} ms" for n in names)
            + f"  (load {open('/proc/loadavg').read().split()[0]})", flush=True)
    print(f"\n{kind} DPO (ours --kernels {args.kernels}): Llama {CONFIG['hidden_size']}x{CONFIG['num_hidden_layers']} blocks "
          f"float32, batch {args.batch} pairs under {args.block_size} tokens, one process, "
          f"{args.rounds} rounds of {args.steps} steps, blas {'OpenBLAS' if blas else 'default'}")
    print(f"  loss before any step: ours {ours.first_loss:.6f}, mlx-lm-lora "
          f"{theirs.first_loss:.6f}; trained tokens a step: ours {ours.tokens}, mlx-lm-lora "
          f"{theirs.tokens}")
    held_mib = {"ours": ours_held, "mlx-lm-lora": theirs_held}
    for name in names:
        ms = [x[name][0] * 1000 for x in rounds]
        tok_s = theirs.tokens / (statistics.median(ms) / 1000)
        extra = statistics.median(x[name][1] for x in rounds)
        print(f"  {name:12s} ms/step: {', '.join(f'{m:,.0f}' for m in ms)} ({tok_s:,.0f} "
              f"trained tokens/s at the median); holds {held_mib[name]:.1f} MiB, a step adds "
              f"{extra:.1f} MiB at most")
    ratios = [x["mlx-lm-lora"][0] / x["ours"][0] for x in rounds]
    print(f"  mlx-lm-lora / ours (> 1: ours faster): {', '.join(f'{r:.3f}' for r in ratios)} "
          f"(median {statistics.median(ratios):.3f})")
    print(f"  load average at the end: {open('/proc/loadavg').read().strip()}\n", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", default="LoRA,full", help="LoRA, full or both (comma-separated)")
    p.add_argument("--steps", type=int, default=3, help="steps of each per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--kernels", default="auto", help="our --kernels: auto (kernels.py on "
                   "Linux's CPU) or mlx (MLX's own, as mlx-lm-lora runs)")
    args = p.parse_args()
    blas = rerun_with_openblas(threads=2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder, data, rows = build(tmp, args.batch, args.block_size)
        for kind in args.kinds.split(","):
            compare(kind.strip(), folder, data, rows, tmp, args, blas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
