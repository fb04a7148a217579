"""Preference pairs (issue 49, item 1): `prepare --jsonl` of {"prompt", "chosen", "rejected"}
rows (and "system", and answers as lists of messages) gives the token ids and prompt
lengths mlx-lm-lora's own DPODataset and ORPODataset give, on tokenizers with real chat
templates; a batch holds both sequences of each pair, the answers alone trained; a bad
row is named by file:line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from reference_train.data import ShardedBatches, load_meta, open_split
from reference_train.prepare import main as prepare_main

from .chat_support import make_chat_folder, write_jsonl
from .train_support import FakeGroup

STYLES = ("qwen25", "qwen3", "llama3")

PAIRS = [
    {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
    {"prompt": "Say hi in French", "chosen": "Bonjour, ça va ?", "rejected": "no"},
    {"prompt": "Name a colour", "chosen": "Blue", "rejected": "A dog", "system": "Be brief."},
    {"prompt": "One word", "system": "Short.",
     "chosen": [{"role": "assistant", "content": "word"}],
     "rejected": {"messages": [{"role": "assistant", "content": "two words"}]}},
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    return {style: make_chat_folder(root / style, style) for style in STYLES}


def our_pairs(data: Path, split: str) -> list[tuple[list[int], int]]:
    rows = open_split(data, split, block_size=4096).rows
    return [(rows.tokens[a: a + n].tolist(), int(off)) for a, n, off in rows.index]


def their_pairs(dataset) -> list[tuple[list[int], int]]:
    out = []
    for i in range(len(dataset)):
        item = dataset[i]
        out += [(list(item["chosen"]), item["chosen_prompt_length"]),
                (list(item["rejected"]), item["rejected_prompt_length"])]
    return out


@pytest.mark.parametrize("style", STYLES)
def test_same_ids_and_prompt_lengths_as_mlx_lm_lora(folders, style, tmp_path):
    from mlx_lm.tokenizer_utils import load
    from mlx_lm_lora.trainer.datasets import DPODataset, ORPODataset

    folder = folders[style]
    tokenizer = load(folder)
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "train.jsonl", PAIRS)
    write_jsonl(src / "valid.jsonl", PAIRS[:2])
    for objective in ("dpo", "orpo"):
        out = tmp_path / objective
        assert prepare_main(["--out", str(out), "--jsonl", str(src), "--tokenizer", str(folder),
                             "--preference_for", objective]) == 0
        if objective == "dpo":  # its DPODataset takes answers as strings only
            theirs = their_pairs(DPODataset(PAIRS[:3], tokenizer))
            assert our_pairs(out, "train")[:6] == theirs, style
        else:  # mlx-lm-lora's train.py hands ORPODataset the "system" key
            theirs = their_pairs(ORPODataset(PAIRS, tokenizer, system_key="system"))
            assert our_pairs(out, "train") == theirs, style
        assert our_pairs(out, "val") == theirs[:4]
        meta = load_meta(out)
        assert meta["preference"] is True and meta["preference_for"] == objective
        assert meta["splits"]["train"]["rows"] == 2 * len(PAIRS)
    # the two renderings differ only where the vocabulary has thinking tokens
    assert (our_pairs(tmp_path / "dpo", "train") == our_pairs(tmp_path / "orpo", "train")) \
        == (style != "qwen3")


def test_a_batch_holds_each_pair_with_its_answers_alone_trained(folders, tmp_path):
    src = write_jsonl(tmp_path / "pairs.jsonl", PAIRS * 4)
    data = tmp_path / "data"
    assert prepare_main(["--out", str(data), "--jsonl", str(src), "--tokenizer",
                         str(folders["llama3"]), "--val-every", "0"]) == 0
    split = open_split(data, "train", block_size=64)
    assert split.n_sequences == 16
    ids = our_pairs(data, "train")
    batches = ShardedBatches(split, 4, FakeGroup(0, 1), seed=0)
    xc, yc, mc, xr, yr, mr = batches.batch(0)
    for r, pair in enumerate(batches.indices(0)):
        for (x, y, m), (row, offset) in (((xc, yc, mc), ids[2 * pair]),
                                         ((xr, yr, mr), ids[2 * pair + 1])):
            n = len(row)
            assert x[r, :n - 1].tolist() == row[:-1] and y[r, :n - 1].tolist() == row[1:]
            # position p predicts row[p + 1]: trained from the first answer token on
            assert np.flatnonzero(m[r]).tolist() == list(range(offset - 1, n - 1))
    trained = sum(len(ids[2 * p][0]) - ids[2 * p][1] + len(ids[2 * p + 1][0]) - ids[2 * p + 1][1]
                  for p in batches.indices(0))
    assert batches.trained_tokens(0) == trained
    # two ranks read the two halves of the same global batch
    halves = [ShardedBatches(split, 4, FakeGroup(r, 2), seed=0).batch(0) for r in range(2)]
    for i in range(6):
        assert np.array_equal(np.concatenate([halves[0][i], halves[1][i]]), (xc, yc, mc, xr, yr, mr)[i])


BAD = [
    ('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": 3, "chosen": "b", '
     '"rejected": "c"}\n', "2: a preference row needs a 'prompt' string"),
    ('{"prompt": "a", "chosen": "b", "rejected": 4}\n', "1: 'rejected' must be a non-empty list"),
    ('{"prompt": "a", "chosen": [{"role": "assistant"}], "rejected": "c"}\n',
     "1: 'chosen''s message 0 must have a 'content' string"),
    ('{"prompt": "a", "chosen": "b", "rejected": "c", "system": 1}\n', "1: 'system' must be"),
    ('{"prompt": "a", "chosen": "b", "rejected": "c", "preference_score": 0.5}\n',
     "1: 'preference_score' 0.5 is not supported"),
    ('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "completion": "b"}\n',
     "2: a completions row in a file of preference rows"),
]


@pytest.mark.parametrize("content,message", BAD)
def test_a_bad_row_is_named_and_nothing_is_written(folders, tmp_path, capsys, content, message):
    src = tmp_path / "rows.jsonl"
    src.write_text(content)
    out = tmp_path / "out"
    assert prepare_main(["--out", str(out), "--jsonl", str(src), "--tokenizer",
                         str(folders["qwen25"])]) == 2
    err = capsys.readouterr().err
    assert f"{src}:{message}" in err, err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_preference_and_supervised_rows_are_not_mixed(folders, tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "train.jsonl", PAIRS)
    write_jsonl(src / "valid.jsonl", [{"prompt": "a", "completion": "b"}])
    assert prepare_main(["--out", str(tmp_path / "out"), "--jsonl", str(src), "--tokenizer",
                         str(folders["qwen25"])]) == 2
    assert "preference rows (chosen, rejected) and completions rows" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
