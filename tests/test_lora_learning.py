"""The LoRA proof test (issue 29): chat rows whose user turns are random words and whose
assistant turn is always the same sentence. With --mask_prompt, LoRA on a frozen tiny Llama
drives the train loss near zero and the real mlx-lm (mlx_lm.utils.load with our OUT/adapters,
mlx_lm.generate, greedy) answers a new random question, through the chat template, with that
sentence; without --mask_prompt the loss cannot fall below the random words' entropy. A broken
mask, template or adapter file fails it."""

from __future__ import annotations

import math
import random

import mlx.core as mx

from reference_train.data import load_meta

from .chat_support import make_chat_folder
from .hf_support import make_llama_folder
from .learning_support import ANSWER, MODEL_CONFIG, N_WORDS, WORDS, learning_data
from .train_support import read_metrics, run_trainer

HEAD_GAIN = 8.0  # a random frozen head is too flat for the adapters to become confident


def make_model(path):
    make_chat_folder(path, "llama3")
    make_llama_folder(path, MODEL_CONFIG, seed=3)
    weights = mx.load(str(path / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * HEAD_GAIN
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    return path


def train(model, data, out, steps):
    proc = run_trainer(["--config", "tiny", "--init_from", str(model), "--data", str(data),
                        "--out", str(out), "--fine_tune", "lora", "--lora_layers", "-1",
                        "--lora_rank", "8", "--block_size", "64", "--global_batch", "8",
                        "--steps", str(steps), "--lr", "1e-2", "--min_lr", "1e-3",
                        "--warmup_steps", "5", "--log_every", "1", "--eval_every", str(steps),
                        "--eval_batches", "3", "--sample_tokens", "0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_metrics(out)


def test_lora_with_a_masked_chat_answers_the_sentence_in_mlx_lm(tmp_path):
    from mlx_lm import generate
    from mlx_lm.utils import load

    model = make_model(tmp_path / "tiny-llama")
    masked = train(model, learning_data(model, tmp_path / "data-masked", True),
                   tmp_path / "masked", 60)
    losses = [r["loss"] for r in masked if "loss" in r]
    assert losses[0] > 1.0 and min(losses[-5:]) < 0.05, losses

    lm, tokenizer = load(str(model), adapter_path=str(tmp_path / "masked" / "adapters"))
    rng = random.Random(12345)  # a question the training rows did not hold
    question = " ".join(rng.choices(WORDS, k=N_WORDS))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                           add_generation_prompt=True)
    text = generate(lm, tokenizer, prompt=prompt, max_tokens=24)  # greedy by default
    assert text.strip() == ANSWER, (question, text)
    base, tokenizer = load(str(model))  # the frozen base alone does not say it
    assert generate(base, tokenizer, prompt=prompt, max_tokens=24).strip() != ANSWER

    data = learning_data(model, tmp_path / "data-unmasked", False)
    unmasked = train(model, data, tmp_path / "unmasked", 40)
    train_split = load_meta(data)["splits"]["train"]
    floor = train_split["rows"] * N_WORDS * math.log(len(WORDS)) / train_split["trained_tokens"]
    assert floor > 0.2
    losses = [r["loss"] for r in unmasked if "loss" in r]
    assert min(losses) > 0.8 * floor, (floor, losses)
