"""reference_train configuration and model: YAML configs, CLI overrides, the Llama itself."""

from __future__ import annotations

import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from reference_train.config import CONFIG_DIR, TrainConfig, build_config
from reference_train.metrics import plot_metrics
from reference_train.model import Llama, ModelArgs, count_parameters


def test_bundled_configs_load_and_override():
    assert sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")) == ["blog", "demo", "tiny"]
    cfg = build_config(["--config", "tiny", "--steps", "5", "--seed", "3", "--global_batch",
                        "16", "--tie_embeddings", "false", "--lr", "2e-3"])
    assert (cfg.steps, cfg.seed, cfg.global_batch, cfg.tie_embeddings, cfg.lr) == (5, 3, 16, False, 2e-3)
    assert cfg.dim == 32 and cfg.n_kv_heads == 2  # the rest from tiny.yaml
    blog = build_config(["--config", "blog"])
    assert (blog.n_layers, blog.dim, blog.hidden_dim, blog.n_heads, blog.global_batch,
            blog.block_size, blog.lr) == (4, 256, 512, 4, 4, 512, 3e-4)
    assert build_config([]) == TrainConfig()


def test_config_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match=r"no config 'nope'.*\['blog', 'demo', 'tiny'\]"):
        build_config(["--config", "nope"])
    with pytest.raises(ValueError, match="--steps many: not a whole number"):
        build_config(["--steps", "many"])
    with pytest.raises(ValueError, match="compile: expected true or false"):
        build_config(["--compile", "maybe"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("dim: 64\nlayers: 3\n")
    with pytest.raises(ValueError, match=r"unknown fields \['layers'\]"):
        build_config(["--config", str(bad)])


def test_config_file_problems_name_the_file(tmp_path, monkeypatch):
    """A directory, a YAML syntax error or non-text keys were tracebacks
    (IsADirectoryError, yaml errors, TypeError) instead of a ValueError that
    the trainer and `mlxcluster train` report in one line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    with pytest.raises(ValueError, match="config mine is a directory, not a YAML file"):
        build_config(["--config", "mine"])
    (tmp_path / "tiny").mkdir()  # a folder named like a bundled config
    with pytest.raises(ValueError, match=r"--config tiny is ambiguous: .*--config \S+/configs/tiny\.yaml"):
        build_config(["--config", "tiny"])
    cases = {"syntax.yaml": ("steps: [1\n", r"syntax.yaml is not valid YAML: .* at line 2, column 1"),
             "unhashable.yaml": ("{[1]: 2}\n", "not valid YAML: found unhashable key at line 1"),
             "intkey.yaml": ("1: 2\nsteps: 3\n", r"intkey.yaml: field names must be text, got \[1\]"),
             "latin1.yaml": (b"steps: 3 # caf\xe9\n", "latin1.yaml is not UTF-8 text")}
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(ValueError, match=message):
            build_config(["--config", str(path)])


@pytest.mark.parametrize("flag,value,message", [
    ("lr", "nan", "lr nan: must be a finite number"),
    ("lr", "inf", "lr inf: must be a finite number"),
    ("lr", "0", "lr 0.0: must be above 0"),
    ("global_batch", "0", "global_batch 0: must be at least 1"),
    ("steps", "-5", "steps -5: must be at least 1"),
    ("seed", "-1", "seed -1: must be at least 0"),
    ("beta2", "1", "beta2 1.0: must be below 1"),
    ("log_every", "0", "log_every 0: must be at least 1"),
    ("n_heads", "0", "n_heads 0: must be at least 1"),
    ("grad_clip", "-1", "grad_clip -1.0: must be at least 0"),
    ("dim", "30", "dim 30 is not divisible by n_heads 4"),
])
def test_values_out_of_range_are_refused(flag, value, message):
    """--lr nan trained a NaN loss and exited 0; --global_batch 0 and --steps -5
    were found only on the ranks, after launch."""
    with pytest.raises(ValueError, match=message):
        build_config(["--config", "tiny", f"--{flag}", value])


def test_bundled_configs_are_in_range():
    for name in ("tiny", "demo", "blog"):
        build_config(["--config", name])


@pytest.mark.parametrize("kv_heads,tied", [(None, False), (2, True), (1, False)])
def test_model_shapes_gqa_and_tied_embeddings(kv_heads, tied):
    args = ModelArgs(vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=kv_heads,
                     hidden_dim=48, tie_embeddings=tied)
    model = Llama(args)
    logits = model(mx.zeros((3, 7), dtype=mx.int32))
    assert logits.shape == (3, 7, 50)
    assert ("output" in model) == (not tied)
    head_dim, kv = 8, kv_heads or 4
    assert model.layers[0].attention.wk.weight.shape == (kv * head_dim, 32)
    per_layer = 32 * 32 * 2 + 2 * 32 * kv * head_dim + 3 * 32 * 48 + 2 * 32
    assert count_parameters(model) == 50 * 32 * (1 if tied else 2) + 2 * per_layer + 32


def test_attention_is_causal_and_matches_a_plain_implementation():
    mx.random.seed(0)
    args = ModelArgs(vocab_size=40, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, hidden_dim=48)
    model = Llama(args)
    tokens = mx.random.randint(0, 40, (2, 9))
    changed = mx.concatenate([tokens[:, :5], (tokens[:, 5:] + 1) % 40], axis=1)
    a, b = model(tokens), model(changed)
    assert np.allclose(np.array(a[:, :5]), np.array(b[:, :5]), atol=1e-5)  # the past ignores the future
    assert not np.allclose(np.array(a[:, 5:]), np.array(b[:, 5:]), atol=1e-3)

    attn = model.layers[0].attention
    x = mx.random.normal((2, 9, 32))
    B, L, _ = x.shape
    q = attn.rope(attn.wq(x).reshape(B, L, 4, 8).transpose(0, 2, 1, 3))
    k = attn.rope(attn.wk(x).reshape(B, L, 2, 8).transpose(0, 2, 1, 3))
    v = attn.wv(x).reshape(B, L, 2, 8).transpose(0, 2, 1, 3)
    k, v = mx.repeat(k, 2, axis=1), mx.repeat(v, 2, axis=1)
    scores = (q @ k.transpose(0, 1, 3, 2)) * 8**-0.5
    scores = scores + nn.MultiHeadAttention.create_additive_causal_mask(L)
    plain = attn.wo((mx.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(B, L, -1))
    assert np.allclose(np.array(attn(x)), np.array(plain), atol=1e-5)


def test_loss_curve_is_skipped_with_a_note_without_matplotlib(tmp_path, monkeypatch):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 2.0}\n{"step": 1, "val_loss": 2.1}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    note = plot_metrics(metrics, tmp_path / "loss.png")
    assert note.startswith("loss curve skipped: matplotlib is not installed")
    assert not (tmp_path / "loss.png").exists()


def test_rank0_reports_an_unusable_out_in_one_line(tmp_path, capsys):
    """--out naming a file, or a path that cannot be created, was a
    FileExistsError / FileNotFoundError traceback on rank 0."""
    from reference_train.prepare import prepare_offline
    from reference_train.train import main

    data = tmp_path / "data"
    prepare_offline(data, n_stories=300)
    afile = tmp_path / "afile"
    afile.write_text("")
    for out, message in ((afile, f"--out {afile} exists and is not a directory"),
                         (afile / "sub", f"--out {afile / 'sub'} cannot be created"),
                         ("/proc/mlxcluster-nope", "--out /proc/mlxcluster-nope cannot be created")):
        code = main(["--config", "tiny", "--data", str(data), "--out", str(out), "--steps", "1",
                     "--sample_tokens", "0"])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(f"error: {message}"), err
        assert len(err.strip().splitlines()) == 1
