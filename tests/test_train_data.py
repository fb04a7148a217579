"""Token files, sharding and checkpoints of reference_train: pure logic and real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from reference_train import checkpoint as ckpt
from reference_train.corpus import offline_corpus
from reference_train.data import (
    EpochPlan,
    ShardedBatches,
    epoch_order,
    open_split,
    rank_indices,
    read_hf_dataset,
    split_batch,
)
from reference_train.errors import DataError
from reference_train.prepare import main as prepare_main
from reference_train.tokenizer import ByteTokenizer

from .train_support import REPO, FakeGroup, trainer_env


@pytest.mark.parametrize("n_sequences", [1, 7, 64, 97, 1000])
@pytest.mark.parametrize("global_batch", [1, 4, 6, 12])
def test_every_sequence_once_per_epoch_across_ranks(n_sequences, global_batch):
    for size in [s for s in (1, 2, 3, 4, 6, 12) if global_batch % s == 0]:
        plan = EpochPlan(n_sequences, global_batch)
        for epoch in (0, 1):
            order = epoch_order(n_sequences, seed=5, epoch=epoch)
            seen = np.concatenate([
                rank_indices(order, step, global_batch, rank, size)
                for step in range(plan.steps_per_epoch) for rank in range(size)
            ]) if plan.steps_per_epoch else np.zeros(0, dtype=np.int64)
            assert len(seen) == len(set(seen.tolist())), "a sequence was used twice"
            assert len(seen) == n_sequences - plan.dropped
            assert plan.dropped == n_sequences % global_batch
            dropped = set(range(n_sequences)) - set(seen.tolist())
            assert dropped == set(order[len(seen):].tolist())


def test_order_depends_on_seed_and_epoch_only():
    a = epoch_order(500, seed=1, epoch=0)
    assert np.array_equal(a, epoch_order(500, seed=1, epoch=0))
    assert not np.array_equal(a, epoch_order(500, seed=1, epoch=1))
    assert not np.array_equal(a, epoch_order(500, seed=2, epoch=0))
    assert sorted(a.tolist()) == list(range(500))


def write_tokens(path: Path, tokens: np.ndarray) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tokens.astype(np.uint16).tofile(path / "train.bin")
    tokens[:50].astype(np.uint16).tofile(path / "val.bin")
    meta = {"format": "reference_train.tokens/1", "dtype": "uint16", "vocab_size": 257,
            "eos_id": 256, "tokenizer": {"kind": "byte"},
            "splits": {"train": {"file": "train.bin", "tokens": len(tokens), "documents": 1},
                       "val": {"file": "val.bin", "tokens": 50, "documents": 1}}}
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def test_ranks_read_their_slices_of_the_global_batch(tmp_path):
    L = 8
    tokens = np.arange(50 * L + 1) % 251  # sequence i starts with token (i * L) % 251
    data = write_tokens(tmp_path / "d", tokens)
    split = open_split(data, "train", L)
    assert split.n_sequences == 50
    whole = ShardedBatches(split, 12, FakeGroup(0, 1), seed=3)
    for step in (0, 3, 4, 9):  # 4 steps per epoch: 9 is in epoch 2
        x1, y1 = whole.batch(step)
        parts = [ShardedBatches(split, 12, FakeGroup(r, 4), seed=3).batch(step) for r in range(4)]
        assert np.array_equal(np.concatenate([p[0] for p in parts]), x1)
        assert np.array_equal(np.concatenate([p[1] for p in parts]), y1)
        assert parts[0][0].shape == (3, L)
        assert np.array_equal(x1[:, 1:], y1[:, :-1])  # targets are inputs shifted by one
        expected = [(int(i) * L + np.arange(L)) % 251 for i in whole.indices(step)]
        assert np.array_equal(x1, np.stack(expected))
    assert whole.position(9) == {"epoch": 2, "step_in_epoch": 1, "seed": 3}


def test_batch_that_does_not_divide_shows_the_arithmetic():
    assert split_batch(16, 4, 2) == 2
    with pytest.raises(ValueError) as err:
        split_batch(12, 4, 2)
    msg = str(err.value)
    assert "global_batch 12" in msg and "ranks 4 x grad_accum 2 = 8" in msg
    assert "12 % 8 = 4" in msg and "multiple of 8" in msg


def test_too_little_data_for_one_batch(tmp_path):
    data = write_tokens(tmp_path / "d", np.arange(33))
    with pytest.raises(DataError, match="fewer than one global batch"):
        ShardedBatches(open_split(data, "train", 8), 8, FakeGroup(0, 1), seed=0)


def test_prepare_text_files(tmp_path):
    (tmp_path / "a.txt").write_text("héllo world<|endoftext|>second story")
    (tmp_path / "b.txt").write_text("third one")
    out = tmp_path / "tok"
    assert prepare_main(["--out", str(out), "--text", str(tmp_path / "a.txt"),
                         str(tmp_path / "b.txt"), "--val-every", "3"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 257 and meta["eos_id"] == 256
    assert meta["splits"]["train"]["documents"] == 2 and meta["splits"]["val"]["documents"] == 1
    train = np.fromfile(out / "train.bin", dtype=np.uint16).tolist()
    tok = ByteTokenizer()
    assert train == tok.encode("héllo world") + [256] + tok.encode("second story") + [256]
    assert np.fromfile(out / "val.bin", dtype=np.uint16).tolist() == tok.encode("third one") + [256]
    assert meta["splits"]["train"]["tokens"] == len(train)
    assert tok.decode(train) == "héllo worldsecond story"


def test_prepare_jsonl(tmp_path, capsys):
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps({"body": f"story {i}"}) + "\n" for i in range(10)))
    out = tmp_path / "tok"
    assert prepare_main(["--out", str(out), "--jsonl", str(src), "--text-field", "body"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"]["train"]["documents"] == 10 and meta["splits"]["val"]["documents"] == 0
    assert (ByteTokenizer().decode(np.fromfile(out / "train.bin", dtype=np.uint16))
            == "".join(f"story {i}" for i in range(10)))
    # a wrong field is a clear error, and nothing half-written is left behind
    assert prepare_main(["--out", str(tmp_path / "bad"), "--jsonl", str(src)]) == 2
    assert "s.jsonl:1: no 'text' field" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


LATIN1 = '{"text": "fine"}\n{"text": "caf\xe9"}\n'.encode("latin-1")  # line 2: byte 0xe9


def test_prepare_refuses_bytes_that_are_not_utf8_naming_file_and_line(tmp_path, capsys):
    """issue 38: `prepare --jsonl` on latin-1 bytes ended in a UnicodeDecodeError
    traceback, exit 1; now exit 2 naming the file and line, as other bad rows."""
    src = tmp_path / "rows.jsonl"
    src.write_bytes(LATIN1)
    out = tmp_path / "out"
    # the command as a user runs it (mlx-lm's rows), in a process of its own: no traceback
    proc = subprocess.run([sys.executable, "-m", "reference_train.prepare", "--out", str(out),
                           "--jsonl", str(src)], cwd=REPO, env=trainer_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"error: {src}:2: not UTF-8 text (byte 0xe9)" in proc.stderr
    assert "hint: save the file as UTF-8" in proc.stderr and "Traceback" not in proc.stderr
    # documents from a field, and text files: the same message, the line counted
    assert prepare_main(["--out", str(out), "--jsonl", str(src), "--text-field", "text"]) == 2
    assert f"{src}:2: not UTF-8 text (byte 0xe9)" in capsys.readouterr().err
    text = tmp_path / "story.txt"
    text.write_bytes(b"line one\nline two\nna\xefve\n")
    assert prepare_main(["--out", str(out), "--text", str(text)]) == 2
    assert f"{text}:3: not UTF-8 text (byte 0xef)" in capsys.readouterr().err
    assert not out.exists()


def test_offline_corpus_is_deterministic_and_small(tmp_path):
    assert offline_corpus(50) == offline_corpus(50)
    assert offline_corpus(50, seed=1) != offline_corpus(50)
    out = tmp_path / "off"
    assert prepare_main(["--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert 100_000 < meta["splits"]["train"]["tokens"] < 2_000_000
    assert (out / "train.bin").read_bytes() == (out / "train.bin").read_bytes()


def test_hf_dataset_without_the_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails like a missing package
    with pytest.raises(DataError) as err:
        list(read_hf_dataset("roneneldan/TinyStories", "train"))
    assert "needs the 'datasets' package" in str(err.value)


class TinyModel:
    def __init__(self):
        self.w = mx.arange(6, dtype=mx.float32).reshape(2, 3)

    def parameters(self):
        return {"w": self.w}


class TinyOptimizer:
    state = {"step": mx.array(3), "w": {"m": mx.ones((2, 3)), "v": mx.zeros((2, 3))}}


def test_checkpoint_is_atomic_and_latest_moves_last(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    ckpt.save_checkpoint(root, 1, TinyModel(), TinyOptimizer(), {"data": {}}, keep=2)
    assert (root / "latest").read_text().strip() == "step_000001"

    real_save = mx.save_safetensors

    def crash_on_optimizer(path, arrays, *a, **k):
        if "optimizer" in str(path):
            raise OSError("disk full")
        return real_save(path, arrays, *a, **k)

    monkeypatch.setattr(ckpt.mx, "save_safetensors", crash_on_optimizer)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(root, 2, TinyModel(), TinyOptimizer(), {"data": {}})
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]
    assert ckpt.resolve_checkpoint(tmp_path) == root / "step_000001"

    monkeypatch.setattr(ckpt.mx, "save_safetensors", real_save)
    for step in (2, 3):
        ckpt.save_checkpoint(root, step, TinyModel(), TinyOptimizer(), {"data": {}}, keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002", "step_000003"]
    assert ckpt.resolve_checkpoint(tmp_path) == root / "step_000003"
    state = json.loads((root / "step_000003" / "state.json").read_text())
    assert state["step"] == 3
    saved = mx.load(str(root / "step_000003" / "optimizer.safetensors"))
    assert sorted(saved) == ["step", "w.m", "w.v"]
