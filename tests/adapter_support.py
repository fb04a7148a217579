"""Helpers for the LoRA and DoRA tests: a fine-tuning run on the tiny `llama`
folder, our model with OUT/adapters in place, and the real mlx-lm commands
(`mlx_lm generate --adapter-path`, `mlx_lm fuse`) run on those adapters."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx

from reference_train import lora
from reference_train.hf_io import load_folder, model_from_weights
from reference_train.model import generate
from reference_train.tokenizer import FolderTokenizer
from tests import waits

from .hf_support import LLAMA3_CONFIG, make_llama_folder, mlx_lm_logits
from .train_support import PYTHON, run_trainer, trainer_env

COMMON = ["--config", "tiny", "--block_size", "32", "--eval_every", "0", "--sample_tokens", "0",
          "--steps", "4", "--fine_tune", "lora", "--lora_rank", "4", "--lora_layers", "-1"]
PROMPT = "Once upon a time"


def train(folder: Path, data: Path, out: Path, *extra: str, ranks: int = 1):
    """A fine-tuning run of COMMON (LoRA, unless ``extra`` says --fine_tune dora) on ``folder``."""
    proc = run_trainer([*COMMON, "--init_from", str(folder), "--data", str(data), "--out",
                        str(out), *extra], ranks=ranks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def quantized_llama(path: Path, llama: Path) -> Path:
    """A folder of `llama`'s shape quantized by mlx-lm (4 bits), with `llama`'s
    tokenizer (the data's)."""
    folder = make_llama_folder(path, LLAMA3_CONFIG, quantize=True)
    for f in llama.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, folder / f.name)
    return folder


def our_adapted_model(folder: Path, adapters: Path):
    """Our model of ``folder`` (quantized as it is) with the adapters of ``adapters``
    (OUT/adapters: LoRA or DoRA, as its adapter_config.json says) in place."""
    args, weights, config = load_folder(folder)
    model = model_from_weights(args, weights, config, folder)
    saved, adapter_config = lora.read_adapters(adapters)
    lora.apply_saved(model, adapter_config)
    model.load_weights(list(saved.items()), strict=False)
    model.eval()
    return model


def prompt_ids(tokenizer_folder: Path) -> mx.array:
    return mx.array([FolderTokenizer(tokenizer_folder).encode(PROMPT)])


def mlx_lm_generates_ours(folder: Path, adapters: Path, cwd: Path) -> str:
    """`mlx_lm generate --adapter-path`, the real command, greedy: the text our model
    with the same adapters continues the prompt with (asserted); returns it."""
    gen = waits.run([PYTHON, "-m", "mlx_lm", "generate", "--model", str(folder),
                          "--adapter-path", str(adapters), "--prompt", PROMPT,
                          "--max-tokens", "6", "--temp", "0"],
                         cwd=cwd, env=trainer_env())
    assert gen.returncode == 0, gen.stderr[-3000:]
    text = gen.stdout.split("==========\n")[1].rsplit("\n", 1)[0]
    tok = FolderTokenizer(folder)
    greedy = generate(our_adapted_model(folder, adapters), tok.encode(PROMPT), 6,
                      mx.random.key(0), temperature=0)
    if tok.eos_id in greedy:
        greedy = greedy[:greedy.index(tok.eos_id)]
    assert text == tok.tok.decode(greedy), (text, greedy)
    return text


def mlx_lm_fuses_ours(folder: Path, adapters: Path, fused: Path, ours: mx.array, ids: mx.array,
                      *extra: str) -> None:
    """`mlx_lm fuse`, the real command (``extra``: --dequantize...): the fused
    folder computes our logits ``ours`` for ``ids``."""
    done = waits.run([PYTHON, "-m", "mlx_lm", "fuse", "--model", str(folder), *extra,
                           "--adapter-path", str(adapters), "--save-path", str(fused)],
                          cwd=fused.parent, env=trainer_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert mx.abs(mlx_lm_logits(fused, ids) - ours).max().item() < 1e-4
