"""Our trainer's LoRA and QLoRA against `python -m mlx_lm lora` on the same model, data and batch.

    python bench/lora_vs_mlx_lm.py                    # ~10 minutes on 2 cores
    python bench/lora_vs_mlx_lm.py --steps 60 --rounds 3   # steadier, longer
    python bench/lora_vs_mlx_lm.py --kinds LoRA --rounds 4   # LoRA alone, ~3 minutes

The model: a random Llama (CONFIG: hidden 256, 4 blocks, grouped-query
attention) built with mlx-lm's own classes, saved twice by mlx-lm: in float32
and quantized to 4 bits in groups of 32 by mlx-lm's own `quantize_model`
(tests/hf_support.py make_llama_folder), with a byte-level BPE tokenizer and
Llama 3's chat template (tests/chat_support.py; nothing downloaded). The
data: chat rows (`{"messages": [user, assistant]}`, random words) whose
rendered length is 100-125 tokens, as train.jsonl / valid.jsonl; mlx-lm
reads them with `--mask-prompt`, our trainer after `prepare --jsonl DIR
--tokenizer FOLDER --mask_prompt`. With every row at most --block-size
tokens and longer than 96, both trainers run batches of the same shape:
ours pads each row to --block-size (128), mlx-lm pads a batch to 1 + the
next multiple of 32 capped at --max-seq-length (129): 128 inputs too.

Four configurations, one process each, in turn for --rounds rounds (the
order of the two trainers flips every round): LoRA on the float folder and
QLoRA on the 4-bit folder, ours and mlx-lm's. The same LoRA on both sides:
rank 8, scale 20, dropout 0, on every block (`--lora_layers N` /
`--num-layers N`), on the seven linear layers of a block (named on both
sides: ours `--lora_keys`, mlx-lm's `lora_parameters` in a YAML `-c`
config with rank, scale and dropout), AdamW at lr 1e-5, the same batch, float32 adapters, no
gradient clipping, OpenBLAS preloaded where Linux has it.

Tokens/s counts the trained targets only, the same on both sides:

  ours:   metrics.jsonl's tokens_per_s: the targets whose mask is 1 (with
          --mask_prompt: the tokens of the last assistant turn, its
          end-of-turn token included, reference_train/data.py RowSplit),
          over the time of the steps since the last report.
  mlx-lm: its report's tokens_per_second is n_tokens / train_time where
          n_tokens sums default_loss's mask (mlx_lm/tuner/trainer.py):
          target positions with offset <= p + 1 <= length, which is the
          same completion tokens plus one more per row: the target after
          the row's last token (a pad, id 0; every row here is shorter than
          the batch's 129 columns, so every row has it). The bench removes
          it: per report, (trained_tokens delta - steps x batch) / (delta /
          tokens_per_second). Its uncorrected figure is printed as well.

Each side's figure is the median of its reports after the first
(compilation, warm-up), one report every 10 steps. Peak: MLX's peak memory
(mx.get_peak_memory since the process started, model loading included), as
both report it. Ratios ours / mlx-lm are per round.

Then the bytes all-reduced per step (issue 29): the trainer averages the
trainable parameters' gradients, in float32 by default (data_parallel.py
DataParallel.reduction(), collectives.average_gradients: --comm_dtype float32;
bfloat16 halves it), so a step all-reduces 4 bytes per trainable parameter: the
adapters with LoRA, every parameter with full fine-tuning. Printed for the
bench's model (the LoRA count checked against the trainer's own log line
"LoRA: ... N trainable parameters" and against the tensors in mlx-lm's
adapters.safetensors; the full count against the folder's weights) and for
Llama-3-8B's shapes with mlx-lm's default LoRA (mlx_lm/lora.py
CONFIG_DEFAULTS: rank 8, num_layers 16; no keys given, so
mlx_lm/tuner/utils.py linear_to_lora_layers adapts every nn.Linear /
QuantizedLinear of a block: for Llama q, k, v, o, gate, up and down).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
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

# mlx-lm's names of a Llama block's linear layers: every one, as mlx-lm adapts them
# when its config names no keys.
from reference_train.lora import KEYS  # noqa: E402

# Llama 3-like: untied head, grouped-query attention; the vocabulary covers the chat
# tokenizer's 400 ids; 256 and 768 are multiples of the 4-bit folder's group of 32.
CONFIG = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
          "intermediate_size": 768, "num_attention_heads": 4, "num_key_value_heads": 2,
          "rms_norm_eps": 1e-5, "vocab_size": 400, "rope_theta": 500000.0,
          "max_position_embeddings": 1024, "tie_word_embeddings": False}
# Meta-Llama-3-8B's config.json
LLAMA3_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "tie_word_embeddings": False}
RANK, SCALE, DROPOUT = 8, 20.0, 0.0
WORDS = ("apple river stone cloud tiger lamp ocean seven purple window garden silver candle "
         "mountain pencil rocket forest bottle dragon violin").split()


# ---------------------------------------------------------------- parameter counts


def linear_shapes(c: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer of a Llama block, by mlx-lm's key."""
    h, i = c["hidden_size"], c["intermediate_size"]
    head = h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * head, c["num_key_value_heads"] * head
    return {"self_attn.q_proj": (h, q), "self_attn.k_proj": (h, kv), "self_attn.v_proj": (h, kv),
            "self_attn.o_proj": (q, h), "mlp.gate_proj": (h, i), "mlp.down_proj": (i, h),
            "mlp.up_proj": (h, i)}


def lora_parameters(c: dict, rank: int, layers: int, keys=KEYS) -> int:
    """lora_a (in, r) + lora_b (r, out) for each key of the last `layers` blocks."""
    shapes = linear_shapes(c)
    return layers * sum(rank * (shapes[k][0] + shapes[k][1]) for k in keys)


def all_parameters(c: dict) -> int:
    """Every parameter of the Llama: embeddings, head (untied), blocks, norms."""
    h, v = c["hidden_size"], c["vocab_size"]
    block = sum(a * b for a, b in linear_shapes(c).values()) + 2 * h  # two RMSNorms
    return v * h * (1 if c["tie_word_embeddings"] else 2) + c["num_hidden_layers"] * block + h


def reduced_bytes(name: str, c: dict, rank: int, layers: int) -> tuple[int, int]:
    lora_n, full_n = lora_parameters(c, rank, layers), all_parameters(c)
    print(f"  {name}: LoRA rank {rank} on {layers} of {c['num_hidden_layers']} blocks' 7 "
          f"linear layers: {lora_n:,} trainable parameters -> {4 * lora_n / 2**20:,.2f} MiB "
          f"a step; full fine-tune: {full_n:,} -> {4 * full_n / 2**20:,.1f} MiB a step "
          f"(x{full_n / lora_n:,.0f})")
    return lora_n, full_n


# ---------------------------------------------------------------- model and data


def build(tmp: Path, rows: int, block: int) -> tuple[Path, Path, Path, Path]:
    """(float folder, 4-bit folder, our token folder, mlx-lm's jsonl folder)."""
    import random

    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from reference_train import prepare
    from tests.chat_support import make_chat_folder
    from tests.hf_support import make_llama_folder

    tokenizer_dir = make_chat_folder(tmp / "tokenizer", "llama3")
    folders = []
    for name, quantize in (("float", False), ("q4", True)):
        shutil.copytree(tokenizer_dir, tmp / name)
        folders.append(make_llama_folder(tmp / name, CONFIG, seed=0, quantize=quantize))
    tokenizer = load_tokenizer(tokenizer_dir)
    rng, kept = random.Random(0), []
    for _ in range(20 * rows):  # a word is ~4.4 tokens of this 400-id BPE, a row ~21 more
        if len(kept) == rows:
            break
        messages = [{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 7)))},
                    {"role": "assistant",
                     "content": " ".join(rng.choices(WORDS, k=rng.randint(13, 16)))}]
        n = len(tokenizer.apply_chat_template(messages))
        if 100 <= n <= block - 3:  # every row under the batch's 128 targets: one pad target each
            kept.append({"messages": messages})
    if len(kept) < rows:
        raise SystemExit(f"only {len(kept)} of {rows} rows of 100-{block - 3} tokens drawn")
    jsonl = tmp / "jsonl"
    jsonl.mkdir()
    valid = max(8, rows // 20)
    for name, part in (("train", kept[valid:]), ("valid", kept[:valid])):
        (jsonl / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    tokens = tmp / "tokens"
    assert prepare.main(["--out", str(tokens), "--jsonl", str(jsonl), "--tokenizer",
                         str(folders[0]), "--mask_prompt"]) == 0
    return folders[0], folders[1], tokens, jsonl


# ---------------------------------------------------------------- the two trainers


def ours(folder: Path, tokens: Path, out: Path, args, env) -> tuple[float, float, int]:
    """(tokens/s, peak MiB, trainable parameters from the log line)."""
    records, log = run_ours(out, env, "--init_from", str(folder), "--data", str(tokens),
                            "--steps", str(args.steps), "--global_batch", str(args.batch),
                            "--block_size", str(args.block_size), "--eval_every", "0",
                            "--sample_tokens", "0", "--log_every", "10", "--warmup_steps", "0",
                            "--grad_clip", "0", "--lr", "1e-5", "--fine_tune", "lora",
                            "--lora_rank", str(RANK), "--lora_scale", str(SCALE),
                            "--lora_dropout", str(DROPOUT), "--lora_layers",
                            str(CONFIG["num_hidden_layers"]), "--lora_keys", ",".join(KEYS))
    if " 0 train and 0 val rows longer than" not in log:
        raise SystemExit(f"rows were cut: the trainers would not see the same data\n{log}")
    found = re.search(r"LoRA: .*?: ([\d,]+) trainable parameters", log)
    if not found:
        raise SystemExit(f"no 'LoRA: ... trainable parameters' line in the log:\n{log}")
    return (*ours_speed_and_peak(records), int(found.group(1).replace(",", "")))


def mlx_lm(folder: Path, jsonl: Path, out: Path, config: Path, args,
           env) -> tuple[float, float, int, float, float]:
    """(trained-target tokens/s, peak MiB, adapter parameters in its adapters.safetensors,
    its own tokens/s, its targets per row)."""
    import mlx.core as mx

    reports = run_mlx_lm(env, "-c", str(config), "--model", str(folder), "--train", "--data",
                         str(jsonl), "--fine-tune-type", "lora", "--optimizer", "adamw",
                         "--batch-size", str(args.batch), "--iters", str(args.steps),
                         "--max-seq-length", str(args.block_size + 1), "--mask-prompt",
                         "--steps-per-report", "10", "--steps-per-eval", str(args.steps * 10),
                         "--save-every", str(args.steps * 10), "--val-batches", "1",
                         "--num-layers", str(CONFIG["num_hidden_layers"]), "--learning-rate",
                         "1e-5", "--adapter-path", str(out))
    corrected, reported, last_it, last_tokens = [], [], 0, 0
    for r in reports:
        steps, n = r["iteration"] - last_it, r["trained_tokens"] - last_tokens
        seconds = n / r["tokens_per_second"]
        corrected.append((n - steps * args.batch) / seconds)  # one pad target a row removed
        reported.append(r["tokens_per_second"])
        last_it, last_tokens = r["iteration"], r["trained_tokens"]
    adapters = mx.load(str(out / "adapters.safetensors"))
    per_row = reports[-1]["trained_tokens"] / (reports[-1]["iteration"] * args.batch)
    return (statistics.median(corrected[1:]), mlx_lm_peak_mib(reports),
            sum(a.size for a in adapters.values()), statistics.median(reported[1:]), per_row)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--kinds", default="LoRA,QLoRA", help="LoRA, QLoRA or both (comma-separated)")
    args = p.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",")]
    import mlx.core as mx

    env = trainer_env(2)
    cases = [f"{kind} {who}" for kind in kinds for who in ("ours", "mlx-lm")]
    results: dict[str, list[tuple]] = {c: [] for c in cases}
    counts: dict[str, set[int]] = {"ours": set(), "mlx-lm": set()}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = args.steps * args.batch * 21 // 20 + 8
        floating, q4, tokens, jsonl = build(tmp, rows, args.block_size)
        meta = json.loads((tokens / "meta.json").read_text())["splits"]["train"]
        config = tmp / "lora.yaml"  # JSON is YAML
        config.write_text(json.dumps({"lora_parameters": {"rank": RANK, "scale": SCALE,
                                                          "dropout": DROPOUT,
                                                          "keys": list(KEYS)}}))
        full_weights = sum(a.size for a in mx.load(str(floating / "model.safetensors")).values())
        for r in range(args.rounds):
            for kind, folder in [(k, {"LoRA": floating, "QLoRA": q4}[k]) for k in kinds]:
                order = ("ours", "mlx-lm") if r % 2 == 0 else ("mlx-lm", "ours")
                for who in order:
                    out = tmp / f"{kind}-{who}-{r}"
                    if who == "ours":
                        speed, peak, n = ours(folder, tokens, out, args, env)
                        results[f"{kind} ours"].append((speed, peak))
                    else:
                        speed, peak, n, own, per_row = mlx_lm(folder, jsonl, out, config, args,
                                                              env)
                        results[f"{kind} mlx-lm"].append((speed, peak, own, per_row))
                    counts[who].add(n)
                    print(f"  round {r + 1} {kind:5s} {who:6s} {speed:8,.0f} tok/s  peak "
                          f"{peak:7.1f} MiB", flush=True)

    c = CONFIG
    print(f"\nLlama {c['hidden_size']}x{c['num_hidden_layers']} blocks (GQA {c['num_attention_heads']}"
          f"/{c['num_key_value_heads']} heads, MLP {c['intermediate_size']}, vocab "
          f"{c['vocab_size']}), float32 and 4-bit (group 32) folders, LoRA rank {RANK} scale "
          f"{SCALE} on all {c['num_hidden_layers']} blocks' 7 linear layers, batch {args.batch} "
          f"x {args.block_size}, {args.steps} steps, AdamW, --mask_prompt, one process, "
          f"{args.rounds} rounds")
    print(f"  trained targets per row: ours {meta['trained_tokens'] / meta['rows']:.2f} (prepare's "
          f"meta.json, all train rows); mlx-lm {statistics.median(x[3] for x in results[f'{kinds[0]} mlx-lm']):.2f} "
          "(its trained_tokens per row trained, one pad target each included)")
    for name, got in results.items():
        line = (f"  {name:13s} {statistics.median(x[0] for x in got):8,.0f} tok/s  peak MLX "
                f"memory {statistics.median(x[1] for x in got):7.1f} MiB")
        if "mlx-lm" in name:
            line += f"  (its own figure, pad targets counted: {statistics.median(x[2] for x in got):,.0f} tok/s)"
        print(line)
    for kind in kinds:
        a, b = results[f"{kind} ours"], results[f"{kind} mlx-lm"]
        speed = [x[0] / y[0] for x, y in zip(a, b, strict=True)]
        memory = [x[1] / y[1] for x, y in zip(a, b, strict=True)]
        print(f"  {kind:5s} ours / mlx-lm tokens/s: {', '.join(f'{x:.2f}' for x in speed)} "
              f"(median {statistics.median(speed):.2f}); peak memory: "
              f"{', '.join(f'{x:.2f}' for x in memory)} (median {statistics.median(memory):.2f})")

    print("\nBytes all-reduced per step (float32 gradients of the trainable parameters; "
          "--comm_dtype bfloat16 halves them; a ring sends and receives ~2(N-1)/N of it per rank):")
    lora_n, full_n = reduced_bytes(f"this bench's Llama {c['hidden_size']}x{c['num_hidden_layers']}",
                                   CONFIG, RANK, c["num_hidden_layers"])
    print(f"    checked: our log line says {', '.join(f'{n:,}' for n in sorted(counts['ours']))}, "
          f"mlx-lm's adapters.safetensors holds {', '.join(f'{n:,}' for n in sorted(counts['mlx-lm']))}; "
          f"the float folder's weights hold {full_weights:,}")
    if counts["ours"] != {lora_n} or counts["mlx-lm"] != {lora_n} or full_weights != full_n:
        raise SystemExit("the parameter counts disagree")
    reduced_bytes("Llama-3-8B shapes, mlx-lm's default LoRA", LLAMA3_8B, 8, 16)
    return 0


if __name__ == "__main__":
    sys.exit(main())
