"""The preference tests' pieces (issue 49): a tiny Llama saved by mlx-lm with a Llama 3
chat tokenizer, and preference pairs it learns, prepared by `reference_train.prepare`."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from reference_train.prepare import main as prepare_main

from .chat_support import make_chat_folder, write_jsonl
from .hf_support import make_llama_folder
from .learning_support import MODEL_CONFIG, WORDS

PAIRS = 16  # the proof's global batch: every step trains on all of them
CHOSEN = "I like that very much."


def pairs(n: int = PAIRS) -> list[dict]:
    """Random-word prompts; the chosen answer one fixed sentence, the rejected random words;
    every fourth row with a system prompt."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        row = {"prompt": " ".join(rng.choices(WORDS, k=rng.randint(2, 5))),
               "chosen": CHOSEN,
               "rejected": " ".join(rng.choices(WORDS, k=rng.randint(1, 6)))}
        if i % 4 == 0:
            row["system"] = "Answer kindly."
        rows.append(row)
    return rows


def preference_folder(root: Path, quantize: bool = False, blocks: int = 0) -> Path:
    """The tiny Llama saved by mlx-lm under `root` (`quantize`: by mlx-lm, 4 bits in groups
    of 32, for QLoRA; `blocks`: another number of blocks than MODEL_CONFIG's), with a
    Llama 3 chat tokenizer."""
    tokenizer = make_chat_folder(root / "tokenizer", "llama3")
    config = {**MODEL_CONFIG, "num_hidden_layers": blocks} if blocks else MODEL_CONFIG
    model = make_llama_folder(root / "model", config, seed=3, quantize=quantize)
    for f in tokenizer.iterdir():
        shutil.copy(f, model / f.name)
    return model


def prepared(folder: Path, tmp_path: Path, objective: str, n: int = PAIRS,
             val_every: int = 0) -> Path:
    """`n` pairs prepared for `objective` (dpo or orpo) in tmp_path/data, all for training
    (`val_every` k: every k-th to validation)."""
    src = write_jsonl(tmp_path / "pairs.jsonl", pairs(n))
    data = tmp_path / "data"
    assert prepare_main(["--out", str(data), "--jsonl", str(src), "--tokenizer", str(folder),
                         "--val-every", str(val_every), "--preference_for", objective]) == 0
    return data
