"""The LoRA proof's task (issue 29): chat rows whose user turn is random words and whose
assistant turn is always the same sentence, tokenized by prepare for a chat tokenizer, and
the tiny Llama that learns it. Shared by tests/test_chat_data.py, tests/test_lora_learning.py
and the lab's tests/lab/test_lora_lab.py."""

from __future__ import annotations

import random
from pathlib import Path

from reference_train.prepare import main as prepare_main
from tests.chat_support import write_jsonl

WORDS = ("apple river stone cloud tiger lamp ocean seven purple window garden silver "
         "candle mountain pencil rocket forest bottle dragon violin").split()
ANSWER = "I like that very much."
N_WORDS = 4

# Tiny and untied; the vocabulary covers the chat tokenizer's 400 ids.
MODEL_CONFIG = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5, "vocab_size": 400, "rope_theta": 10000.0,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}


def chat_rows(n: int) -> list[dict]:
    """``n`` such rows, as mlx-lm's chat JSONL holds them (the same every call)."""
    rng = random.Random(0)
    return [{"messages": [{"role": "user", "content": " ".join(rng.choices(WORDS, k=N_WORDS))},
                          {"role": "assistant", "content": ANSWER}]} for _ in range(n)]


def learning_data(folder: Path, out: Path, mask: bool, n: int = 192) -> Path:
    """``n`` such rows tokenized with ``folder``'s tokenizer into ``out`` (every 8th row
    for validation); ``mask``: --mask_prompt, so only the answer trains."""
    rows = chat_rows(n)
    src = write_jsonl(out.parent / f"{out.name}.jsonl", rows)
    args = ["--out", str(out), "--jsonl", str(src), "--tokenizer", str(folder), "--val-every", "8"]
    assert prepare_main(args + (["--mask_prompt"] if mask else [])) == 0
    return out
