"""Our trainer against mlx-lm's own full fine-tune on the same model, data and batch.

    python bench/vs_mlx_lm.py                    # ~3 minutes on 2 cores
    python bench/vs_mlx_lm.py --steps 60 --rounds 3

A small Llama folder is built with mlx-lm's own classes and a BPE tokenizer
trained here (tests/hf_support.py: nothing downloaded). The bundled corpus
is cut into texts of at least --block-size + 1 tokens: mlx-lm reads them as
train.jsonl (truncated to --max-seq-length = block + 1, so every sequence
is full and none is padded); our trainer reads the same texts tokenized by
`prepare --tokenizer FOLDER`. Both run in one process, AdamW, the same
batch of sequences of the same length, float32, OpenBLAS preloaded where
Linux has it, one after the other for --rounds rounds:

  ours:    python -m reference_train.train --init_from FOLDER --data DIR ...
  ours/mlx: the same with --kernels mlx (MLX's softmax, silu and loss, as
           mlx-lm runs them; the default builds them from multiply-adds on
           Linux's CPU, reference_train/kernels.py)
  mlx-lm:  python -m mlx_lm lora --fine-tune-type full --optimizer adamw ...
  mlx-lm*: the same with --clear-cache-threshold 2**40 (its default, 0, empties
           MLX's buffer cache after every step; our trainer keeps it; measured:
           no difference on a quiet machine)

Tokens/s: ours from metrics.jsonl, mlx-lm's from its training reports (its
own main run with a callback that prints them), each the median of the
reports after the first (compilation, warm-up); the peak: MLX's peak
memory, as both report it. Prints the medians over the
rounds and the per-round ratio ours / mlx-lm (goal, issue 22: >= 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_support import (  # noqa: E402
    mlx_lm_peak_mib,
    ours_speed_and_peak,
    run_mlx_lm,
    run_ours,
    trainer_env,
)

CONFIG = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
          "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4,
          "rms_norm_eps": 1e-5, "vocab_size": 320, "rope_theta": 10000.0,
          "max_position_embeddings": 1024, "tie_word_embeddings": False}


def build(tmp: Path, block: int) -> tuple[Path, Path, Path]:
    """(the model folder, our token folder, mlx-lm's jsonl folder)."""
    from reference_train import prepare
    from reference_train.corpus import offline_corpus
    from tests.hf_support import make_llama_folder, train_tokenizer

    tokenizer = train_tokenizer(CONFIG["vocab_size"])
    model = make_llama_folder(tmp / "model", CONFIG, tokenizer=tokenizer)
    texts, current = [], ""
    for doc in offline_corpus(2000, 0):
        current = f"{current} {doc}".strip()
        if len(tokenizer.encode(current)) > block + 1:
            texts.append(current)
            current = ""
    jsonl = tmp / "jsonl"
    jsonl.mkdir()
    for name, part in (("train", texts[:-20]), ("valid", texts[-20:])):
        (jsonl / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    (tmp / "texts.txt").write_text("<|endoftext|>".join(texts[:-20]))
    tokens = tmp / "tokens"
    assert prepare.main(["--out", str(tokens), "--text", str(tmp / "texts.txt"),
                         "--tokenizer", str(model), "--val-every", "50"]) == 0
    return model, tokens, jsonl


def ours(model, tokens, out, steps, batch, block, env, *extra: str) -> tuple[float, float]:
    records, _ = run_ours(out, env, "--init_from", str(model), "--data", str(tokens), "--steps",
                          str(steps), "--global_batch", str(batch), "--block_size", str(block),
                          "--eval_every", "0", "--sample_tokens", "0", "--log_every", "10",
                          "--warmup_steps", "0", "--grad_clip", "0", "--lr", "1e-5", *extra)
    return ours_speed_and_peak(records)


def mlx_lm(model, jsonl, out, steps, batch, block, env, *extra: str) -> tuple[float, float]:
    reports = run_mlx_lm(env, *extra, "--model", str(model), "--train", "--data", str(jsonl),
                         "--fine-tune-type", "full", "--optimizer", "adamw", "--batch-size",
                         str(batch), "--iters", str(steps), "--max-seq-length", str(block + 1),
                         "--steps-per-report", "10", "--steps-per-eval", str(steps * 10),
                         "--val-batches", "1", "--num-layers", "-1", "--learning-rate", "1e-5",
                         "--adapter-path", str(out))
    speeds = [r["tokens_per_second"] for r in reports][1:]
    return statistics.median(speeds), mlx_lm_peak_mib(reports)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    env = trainer_env(2)
    results: dict[str, list[tuple[float, float]]] = {"ours": [], "ours/mlx": [], "mlx-lm": [],
                                                     "mlx-lm*": []}
    with tempfile.TemporaryDirectory() as tmp:
        model, tokens, jsonl = build(Path(tmp), args.block_size)
        for r in range(args.rounds):
            results["ours"].append(ours(model, tokens, Path(tmp) / f"ours{r}", args.steps,
                                        args.batch, args.block_size, env))
            results["ours/mlx"].append(ours(model, tokens, Path(tmp) / f"oursm{r}", args.steps,
                                            args.batch, args.block_size, env, "--kernels", "mlx"))
            results["mlx-lm"].append(mlx_lm(model, jsonl, Path(tmp) / f"lm{r}", args.steps,
                                            args.batch, args.block_size, env))
            # mlx-lm's default --clear-cache-threshold 0 empties MLX's buffer cache after
            # every step; * keeps it, as our trainer does.
            results["mlx-lm*"].append(mlx_lm(model, jsonl, Path(tmp) / f"lmk{r}", args.steps,
                                             args.batch, args.block_size, env,
                                             "--clear-cache-threshold", str(2**40)))
    ratios = [a[0] / b[0] for a, b in zip(results["ours"], results["mlx-lm"], strict=True)]
    print(f"Llama {CONFIG['hidden_size']}x{CONFIG['num_hidden_layers']} layers, vocab "
          f"{CONFIG['vocab_size']}, batch {args.batch} x {args.block_size} tokens, {args.steps} "
          f"steps, float32, AdamW, one process, {args.rounds} rounds")
    for name, got in results.items():
        print(f"  {name:8s} {statistics.median(s for s, _ in got):9,.0f} tok/s  peak MLX memory "
              f"{statistics.median(m for _, m in got):7.1f} MiB")
    print(f"  ours / mlx-lm tokens/s: {', '.join(f'{x:.2f}' for x in ratios)} "
          f"(median {statistics.median(ratios):.2f})")
    mlx_kernels = [a[0] / b[0] for a, b in zip(results["ours/mlx"], results["mlx-lm"], strict=True)]
    print(f"  ours --kernels mlx / mlx-lm tokens/s: {', '.join(f'{x:.2f}' for x in mlx_kernels)} "
          f"(median {statistics.median(mlx_kernels):.2f})")
    kept = [a[0] / b[0] for a, b in zip(results["ours"], results["mlx-lm*"], strict=True)]
    print(f"  ours / mlx-lm with its buffer cache kept (*): {', '.join(f'{x:.2f}' for x in kept)} "
          f"(median {statistics.median(kept):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
