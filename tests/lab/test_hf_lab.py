"""A Llama folder trained over three lab hosts: every host writes its own OUT/model.

Each host has its own disk at ``lab.disk`` (as Macs have); the model folder and
the token data are on the shared filesystem (the same files on every host). The
trainer runs under a plain ``mlx.launch --hostfile``.
"""

from __future__ import annotations

import uuid

import mlx.core as mx
import pytest

from reference_train import prepare
from tests.hf_support import LLAMA3_CONFIG, make_llama_folder, mlx_lm_logits, train_tokenizer
from tests.lab.test_resume_lab import launch, on_host

pytestmark = pytest.mark.lab


def test_every_host_writes_its_own_out_model(lab3, tmp_path):
    llama = make_llama_folder(tmp_path / "tiny-llama", LLAMA3_CONFIG, tokenizer=train_tokenizer())
    data = tmp_path / "data"
    assert prepare.main(["--out", str(data), "--tokenizer", str(llama), "--stories", "100"]) == 0
    out = lab3.disk / f"hf-{uuid.uuid4().hex[:8]}"
    proc = launch(lab3, tmp_path, [
        "--config", "tiny", "--steps", "2", "--global_batch", "6", "--block_size", "32",
        "--eval_every", "0", "--sample_tokens", "0", "--init_from", str(llama),
        "--data", str(data), "--out", str(out)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("model for mlx-lm: ") == 1  # said once, by rank 0
    assert not out.exists()  # this machine ran no rank
    copies = [on_host(lab3, i, out / "model") for i in range(3)]
    weights = [(c / "model.safetensors").read_bytes() for c in copies]
    assert weights[0] == weights[1] == weights[2]
    for c in copies:
        assert sorted(p.name for p in c.iterdir()) == [
            "config.json", "model.safetensors", "model.safetensors.index.json",
            "tokenizer.json", "tokenizer_config.json"]
        assert [p.name for p in c.parent.iterdir() if p.name.startswith(".")] == []
    tokens = mx.array([[5, 17, 42, 7]])
    assert mlx_lm_logits(copies[2], tokens).shape == (1, 4, LLAMA3_CONFIG["vocab_size"])
