"""A Llama folder trained over three lab hosts by `mlxcluster train`, in
bfloat16 on float32 master weights with the optimizer state sharded: every
host writes its own OUT/model (float32), which mlx-lm opens.

Each host has its own disk at ``lab.disk`` (as Macs have). The model folder
and the token data (tokenized with the model's tokenizer) are on this
machine's disk only: `train` sends both to every host, checked by sha256.
"""

from __future__ import annotations

import re
import sys
import uuid

import mlx.core as mx
import pytest

from reference_train import prepare
from tests import waits
from tests.hf_support import LLAMA3_CONFIG, make_llama_folder, mlx_lm_logits, train_tokenizer
from tests.lab.jobs import on_host, training_setup

pytestmark = pytest.mark.lab


def test_every_host_writes_its_own_out_model(lab3, tmp_path):
    here = lab3.disk / f"hf-{uuid.uuid4().hex[:8]}"  # this machine's own disk
    llama = make_llama_folder(here / "tiny-llama", LLAMA3_CONFIG, tokenizer=train_tokenizer())
    data = here / "data"
    assert prepare.main(["--out", str(data), "--tokenizer", str(llama), "--stories", "100"]) == 0
    out = lab3.disk / f"hf-out-{uuid.uuid4().hex[:8]}"
    inventory, env = training_setup(lab3, tmp_path)
    proc = waits.run(
        [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--no-preflight",
         "--config", "tiny", "--stall-timeout", "60s", "--", "--steps", "2", "--global_batch", "6",
         "--block_size", "32", "--eval_every", "0", "--sample_tokens", "0",
         "--dtype", "bfloat16", "--shard_optimizer", "true", "--init_from",
         str(llama), "--data", str(data), "--out", str(out)],
        env=env, cwd=tmp_path)
    for h in lab3.hosts:  # both folders sent to every host, checked there
        # the first host sent from here, the others taking it from that host (fanout.py)
        assert re.search(rf"model: {h.name}: {re.escape(str(llama))} missing: (sending|taking)", proc.stdout), proc.stdout[-3000:]
        assert f"data: {h.name}: {data} missing: sending" in proc.stdout
        assert lab3.host_exists(h, data / "tokenizer" / "tokenizer.json")
    assert "compute bfloat16 on float32 master weights, gradients all-reduced in float32, " \
           "optimizer state sharded (each rank keeps its share: ring has no sum_scatter)" \
           in proc.stdout, proc.stdout[-3000:]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("model for mlx-lm: ") == 1  # said once, by rank 0
    assert not (out / "model").exists()  # this machine ran no rank (it keeps the record)
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
