"""JSONL data in mlx-lm's formats (issue 29, item 1): the same token ids and first trained
token as mlx-lm's own dataset classes (mlx_lm.tuner.datasets, on tokenizers with real
chat templates), masks that count nowhere, malformed rows refused, and a model that
learns only what the mask trains."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from reference_train.data import ShardedBatches, load_meta, open_split, validation_batches
from reference_train.prepare import main as prepare_main

from .chat_support import make_chat_folder, write_jsonl
from .conftest import require
from .learning_support import N_WORDS, WORDS, learning_data
from .train_support import MLX_LAUNCH, FakeGroup, read_metrics, run_trainer

STYLES = ("qwen25", "qwen3", "qwen3-nothink", "llama3")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]

ROWS = {
    "text": [{"text": "Once upon a time a fox ran."}, {"text": "héllo wörld, ünïcode"},
             {"text": "a small story"}, {"text": "the end"}],
    "completions": [{"prompt": "What is 2+2?", "completion": "4"},
                    {"prompt": "Say hi in French", "completion": "Bonjour, ça va ?"},
                    {"prompt": "Name a colour", "completion": "Blue", "tools": TOOLS},
                    {"prompt": "One word", "completion": "word"}],
    "chat": [
        {"messages": [{"role": "user", "content": "hello"},
                      {"role": "assistant", "content": "Hi there!"}]},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "What is a fox?"},
                      {"role": "assistant", "content": "An animal."},
                      {"role": "user", "content": "And a cat?"},
                      {"role": "assistant", "content": "Another one.",
                       "reasoning_content": "cats are animals"}]},
        {"messages": [{"role": "user", "content": "Weather in Paris?"},
                      {"role": "assistant", "content": "",
                       "tool_calls": [{"type": "function", "function": {
                           "name": "get_weather", "arguments": {"city": "Paris"}}}]},
                      {"role": "tool", "content": "sunny"},
                      {"role": "assistant", "content": "It is sunny.", "name": None}],
         "tools": TOOLS},
        {"messages": [{"role": "user", "content": "Only a question, no answer yet"},
                      {"role": "user", "content": "still asking"}]},
    ],
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    return {style: make_chat_folder(root / style, style) for style in STYLES}


def mlx_lm_rows(folder: Path, rows: list, mask_prompt: bool) -> list[tuple[list[int], int]]:
    """(ids, offset) of each row by mlx-lm's own dataset classes."""
    from mlx_lm.tokenizer_utils import load
    from mlx_lm.tuner.datasets import create_dataset

    ds = create_dataset(rows, load(folder), SimpleNamespace(mask_prompt=mask_prompt))
    return [tuple(ds.process(ds[i])) for i in range(len(ds))]


def our_rows(data: Path, split: str) -> list[tuple[list[int], int]]:
    s = open_split(data, split, block_size=4096)
    return [(s.tokens[a: a + n].tolist(), int(off)) for a, n, off in s.index]


@pytest.mark.parametrize("style", STYLES)
def test_same_ids_and_first_trained_token_as_mlx_lm(folders, style, tmp_path):
    folder = folders[style]
    for fmt, rows in ROWS.items():
        src = tmp_path / fmt
        src.mkdir()
        write_jsonl(src / "train.jsonl", rows)
        write_jsonl(src / "valid.jsonl", rows[:2])
        for mask in (False, True):
            if fmt == "text" and mask:
                continue
            out = tmp_path / f"{fmt}-{mask}"
            args = ["--out", str(out), "--jsonl", str(src), "--tokenizer", str(folder)]
            assert prepare_main(args + (["--mask_prompt"] if mask else [])) == 0
            theirs = mlx_lm_rows(folder, rows, mask)
            assert our_rows(out, "train") == theirs, (style, fmt, mask)
            assert our_rows(out, "val") == theirs[:2]
            if mask and fmt == "completions":
                # Qwen 3's template without <think> in the vocabulary: the generation prompt
                # adds an empty think block the full row lacks, so mlx-lm's offset covers
                # the whole row and nothing trains (as here: the same offsets)
                nothing = style == "qwen3-nothink"
                assert all((off >= len(ids)) if nothing else (0 < off < len(ids))
                           for ids, off in theirs)
                assert (load_meta(out)["splits"]["train"]["untrained_rows"] == 4) == nothing
    # the template was rendered as mlx-lm renders it: <think> decides enable_thinking
    meta = load_meta(tmp_path / "chat-True")
    assert meta["format"] == "reference_train.rows/1" and meta["mask_prompt"] is True


def test_masks_weights_cut_and_ranks(folders, tmp_path):
    """Trained targets are offset <= j < length after the cut; the weights make every rank's
    mean the global batch's mean over trained targets; ranks together = one process."""
    src = write_jsonl(tmp_path / "all.jsonl", [
        {"prompt": " ".join(["word"] * (i % 7 + 1)), "completion": "ok " * (i % 5 + 1)}
        for i in range(40)])
    out = tmp_path / "d"
    assert prepare_main(["--out", str(out), "--jsonl", str(src), "--tokenizer",
                         str(folders["qwen25"]), "--mask_prompt", "--val-every", "5"]) == 0
    meta = load_meta(out)
    assert meta["splits"]["train"]["rows"] == 32 and meta["splits"]["val"]["rows"] == 8
    L = 100  # the shortest rows fit, the longest are cut
    split = open_split(out, "train", L)
    assert 0 < split.cut < 32
    full = open_split(out, "train", 4096)
    assert full.cut == 0
    x, y, mask = split.read(range(32))
    for r in range(32):
        start, length, offset = (int(v) for v in split.index[r])
        ids = split.tokens[start: start + length].tolist()[: L + 1]
        n = len(ids)
        assert x[r, : n - 1].tolist() == ids[:-1] and y[r, : n - 1].tolist() == ids[1:]
        trained = [p for p in range(L) if mask[r, p]]
        assert trained == list(range(offset - 1, n - 1))  # targets ids[offset:n]
        assert int(split.trained[r]) == len(trained)
    one = ShardedBatches(split, 8, FakeGroup(0, 1), seed=1)
    for step in (0, 3, 5):
        x1, y1, w1 = one.batch(step)
        n_trained = one.trained_tokens(step)
        assert n_trained == int((w1 > 0).sum())
        assert np.allclose(w1.sum(), 8 * L)  # mean(w * ce) = mean over trained targets
        parts = [ShardedBatches(split, 8, FakeGroup(r, 4), seed=1).batch(step) for r in range(4)]
        for i in range(3):
            assert np.array_equal(np.concatenate([p[i] for p in parts]), (x1, y1, w1)[i])
    val = list(validation_batches(open_split(out, "val", L), 4, FakeGroup(0, 1), 5))
    assert len(val) == 2 and all(np.allclose(w.sum(), 4 * L) for _, _, w in val)


@pytest.mark.parametrize("mode", ["auto", "mlx"])
def test_loss_counts_only_trained_targets(mode):
    from reference_train import kernels
    from reference_train.model import Llama, ModelArgs, loss_fn

    kernels.use(mode)  # the multiply-add loss (Linux's CPU) and MLX's
    try:
        check_weighted_loss(loss_fn, Llama, ModelArgs)
    finally:
        kernels.use("auto")


def check_weighted_loss(loss_fn, Llama, ModelArgs):
    mx.random.seed(0)
    model = Llama(ModelArgs(vocab_size=50, dim=32, n_layers=1, n_heads=2, hidden_dim=48))
    x = mx.random.randint(0, 50, (2, 6))
    y = mx.random.randint(0, 50, (2, 6))
    mask = np.zeros((2, 6), np.float32)
    mask[0, 2:5], mask[1, 4:] = 1, 1
    w = mx.array(mask * (12 / mask.sum()))
    logits = model(x)
    per = mx.logsumexp(logits, axis=-1) - mx.take_along_axis(logits, y[..., None], -1)[..., 0]
    expected = float((per * mx.array(mask)).sum() / mask.sum())
    assert abs(loss_fn(model, x, y, w).item() - expected) < 1e-5
    y2 = mx.where(mx.array(mask) > 0, y, (y + 7) % 50)  # other targets where nothing trains
    assert abs(loss_fn(model, x, y2, w).item() - expected) < 1e-5
    assert abs(loss_fn(model, x, y).item() - float(per.mean())) < 1e-5  # text data: unchanged


BAD = [
    ('{"text": "fine"}\n{"text": "a"\n', "2: not valid JSON"),
    ('{"text": "fine"}\n[1, 2]\n', "2: a row must be a JSON object"),
    ('{"prompt": "p", "completion": "c"}\n{"question": "q"}\n', "2: no 'text' field"),
    ('{"prompt": "p", "completion": "c"}\n{"messages": [{"role": "user", "content": "x"}]}\n',
     "2: a chat row in a file of completions rows"),
    ('{"prompt": "p", "completion": "c"}\n\n{"prompt": 3, "completion": "c"}\n',
     "3: 'prompt' must be a string"),
    ('{"messages": []}\n', "1: 'messages' must be a non-empty list"),
    ('{"messages": [{"content": "no role"}]}\n', "1: message 0 must be an object with a 'role'"),
    ('{"messages": [{"role": "user", "content": "x"}], "tools": "no"}\n', "1: 'tools' must be"),
    ('{"text": "a"}\n', "1: --mask_prompt needs prompt/completion or chat rows"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]}\n',
     "1: the chat template failed"),
]


@pytest.mark.parametrize("content,message", BAD)
def test_a_malformed_row_is_named_and_nothing_is_written(folders, tmp_path, capsys,
                                                         content, message):
    src = tmp_path / "rows.jsonl"
    src.write_text(content)
    out = tmp_path / "out"
    assert prepare_main(["--out", str(out), "--jsonl", str(src), "--tokenizer",
                         str(folders["qwen25"]), "--mask_prompt"]) == 2
    err = capsys.readouterr().err
    assert f"{src}:{message}" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_folder_layout_and_its_errors(folders, tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    out = tmp_path / "out"
    assert prepare_main(["--out", str(out), "--jsonl", str(src)]) == 2
    assert "no train.jsonl" in capsys.readouterr().err
    write_jsonl(src / "train.jsonl", ROWS["chat"])
    write_jsonl(src / "test.jsonl", ROWS["chat"][:1])
    assert prepare_main(["--out", str(out), "--jsonl", str(src)]) == 2  # byte: no template
    assert "chat rows need the model's chat template" in capsys.readouterr().err
    assert prepare_main(["--out", str(out), "--jsonl", str(src), "--tokenizer",
                         str(folders["llama3"])]) == 0
    meta = load_meta(out)
    assert {s: i["rows"] for s, i in meta["splits"].items()} == {"train": 4, "val": 0, "test": 1}
    assert (out / "tokenizer" / "tokenizer_config.json").is_file()
    # `mlxcluster train --data` sends and checks it like token data: one file per split
    from mlxcluster.launch.sync import read_manifest

    sent = {f.name for f in read_manifest(out).files}
    assert {"train.bin", "val.bin", "test.bin", "meta.json",
            "tokenizer/tokenizer_config.json"} <= sent
    # a template mlx-lm renders in Python (mlx_lm/chat_templates): refused, not guessed
    other = tmp_path / "python-template"
    other.mkdir()
    for f in folders["llama3"].iterdir():
        other.joinpath(f.name).write_bytes(f.read_bytes())
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template_type": "x"}))
    assert prepare_main(["--out", str(tmp_path / "o2"), "--jsonl", str(src), "--tokenizer",
                         str(other)]) == 2
    assert "chat_template_type 'x'" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()


def test_a_masked_chat_learns_the_answer_and_an_unmasked_one_cannot(folders, tmp_path):
    """User turns of random words, the assistant always the same sentence: with --mask_prompt
    the loss (trained targets only) falls near zero; without it, it cannot fall below the
    random words' entropy spread over the row's targets."""
    def run(mask: bool) -> tuple[list[dict], str, dict]:
        data = learning_data(folders["llama3"], tmp_path / f"data-{mask}", mask)
        out = tmp_path / f"run-{mask}"
        proc = run_trainer(["--config", "tiny", "--data", str(data), "--out", str(out),
                            "--block_size", "64", "--dim", "64", "--n_layers", "2",
                            "--n_heads", "4", "--hidden_dim", "128", "--steps", "100",
                            "--global_batch", "8", "--lr", "3e-3", "--min_lr", "3e-4",
                            "--warmup_steps", "10", "--log_every", "50", "--eval_every", "100",
                            "--eval_batches", "3", "--sample_tokens", "0"])
        assert proc.returncode == 0, proc.stderr[-2000:]
        return read_metrics(out), proc.stdout, load_meta(data)

    masked, log, _ = run(True)
    assert "0 train and 0 val rows longer than 65 tokens cut" in log
    assert [r["val_loss"] for r in masked if "val_loss" in r][-1] < 0.05, masked
    unmasked, _, meta = run(False)
    # the words are uniform draws: N_WORDS * log(len(WORDS)) nats a row that no model can
    # predict, spread over the row's trained targets
    val = meta["splits"]["val"]
    floor = val["rows"] * N_WORDS * math.log(len(WORDS)) / val["trained_tokens"]
    assert floor > 0.2
    assert [r["val_loss"] for r in unmasked if "val_loss" in r][-1] > 0.9 * floor, unmasked
    # tokens/s counts trained targets only: the masked run trains few of each row's
    assert all(r["tokens_per_s"] > 0 for r in masked if "tokens_per_s" in r)


def test_rows_train_the_same_on_1_and_2_ranks_and_with_accumulation(folders, tmp_path):
    """The weights make every rank's loss add up to the global batch's mean over its trained
    targets: rows of very different trained lengths give the same losses on 1 rank, 2
    ranks and 1 rank with 2 micro-batches."""
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    rng = random.Random(1)
    rows = [{"prompt": " ".join(rng.choices(WORDS, k=rng.randint(1, 6))),
             "completion": " ".join(rng.choices(WORDS, k=rng.randint(1, 8)))} for _ in range(64)]
    src = write_jsonl(tmp_path / "rows.jsonl", rows)
    data = tmp_path / "data"
    assert prepare_main(["--out", str(data), "--jsonl", str(src), "--tokenizer",
                         str(folders["llama3"]), "--mask_prompt", "--val-every", "4"]) == 0
    common = ["--config", "tiny", "--data", str(data), "--block_size", "48", "--steps", "4",
              "--global_batch", "8", "--log_every", "1", "--eval_every", "4",
              "--sample_tokens", "0"]
    losses = {}
    for name, ranks, extra in (("one", 1, []), ("two", 2, []), ("accum", 1, ["--grad_accum", "2"])):
        out = tmp_path / name
        proc = run_trainer([*common, "--out", str(out), *extra], ranks=ranks)
        assert proc.returncode == 0, proc.stderr[-2000:]
        records = read_metrics(out)
        losses[name] = [r.get("loss", r.get("val_loss")) for r in records
                        if "loss" in r or "val_loss" in r]
    assert len(losses["one"]) == 5
    for name in ("two", "accum"):
        assert np.allclose(losses[name], losses["one"], rtol=0, atol=1e-4), losses
