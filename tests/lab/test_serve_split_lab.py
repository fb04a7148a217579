"""serve --pipeline over two lab hosts on their own disks, their memory facts
stood in as a 16 GB and a 32 GB Mac (tests/lab/memory_standin_serve.py: the
probe runs on each host for real, then its memory is judged as such a Mac's):
the layers go 1:2 by bytes, said in a line; each host is sent only the
weight files of its stage (a 4-shard model as mlx-lm writes one, its index
naming which file holds which layer); each rank says what it loaded, measured
on the loaded model, and that is what the split plans; the answer is one
process's greedy answer. A model too big for both is refused before anything
is sent, naming the hosts or the quantization that would fit."""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main as cli
from mlxcluster.fit.model_folder import read_model_folder
from mlxcluster.fit.split import PIPELINE, layer_bytes, rank_bytes
from mlxcluster.jobs.plan import free_port_block
from mlxcluster.serve import serving
from tests.hf_support import QWEN2_CONFIG, make_llama_folder, train_tokenizer
from tests.lab.jobs import assert_nothing_left, training_setup
from tests.lab.memory_standin_serve import stood_in
from tests.serve_support import CHAT_TEMPLATE, Serving, chat_text, generated_alone
from tests.waits import SERVE_UP_S

pytestmark = pytest.mark.lab

LAYERS = 12
CONFIG = {**QWEN2_CONFIG, "num_hidden_layers": LAYERS, "max_window_layers": LAYERS}  # qwen2 has pipeline()
SHARDS = ("model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
          "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors")


def four_shards(weights: dict, max_file_size_gb: int = 0) -> list[dict]:
    """mlx-lm's make_shards, 4 files: what no layer holds (embeddings, norm), then the layers in thirds."""
    def part(name: str) -> int:
        found = re.search(r"layers\.(\d+)\.", name)
        return 0 if found is None else 1 + int(found.group(1)) * 3 // LAYERS
    shards = [{} for _ in range(4)]
    for name, value in weights.items():
        shards[part(name)][name] = value
    return shards


def four_shard_model(folder: Path) -> Path:
    import mlx_lm.utils as mu

    whole = mu.make_shards
    mu.make_shards = four_shards
    try:
        make_llama_folder(folder, CONFIG, tokenizer=train_tokenizer())
    finally:
        mu.make_shards = whole
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": CHAT_TEMPLATE}))
    assert sorted(p.name for p in folder.glob("model-*.safetensors")) == list(SHARDS)
    return folder


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_serve_pipeline_splits_by_memory_and_sends_each_host_its_stage(lab3, tmp_path):
    started = time.monotonic()
    lab = lab3
    two = lab.hosts[:2]
    model = four_shard_model(lab.disk / f"four-shards-{uuid.uuid4().hex[:8]}")  # here only
    inventory, env = training_setup(lab, tmp_path, hosts=list(two))
    env["STANDIN_MEMORY_GB"] = f"{two[0].name}=16,{two[1].name}=32"
    port = free_port_block(1)
    serving = Serving(["-i", str(inventory), "--backend", "ring", "--no-preflight", "--pipeline",
                       "--port", str(port), "--max-restarts", "0", str(model)],
                      env=env, cwd=tmp_path, module="tests.lab.memory_standin_serve")
    run_id = None
    try:
        up = serving.wait_for(r"serving (\S+) at (http://\S+) \((\d) ranks, (\w+)\)$", SERVE_UP_S)
        assert up.groups() == (model.name, f"http://127.0.0.1:{port}/v1", "2", "pipeline")
        run_id = re.search(r"run (mlxserve-[0-9a-f]+)", serving.output()).group(1)
        out = serving.output()
        # 16 GB and 32 GB: rank 0 (the last layers) on the 16 GB host takes a third.
        assert (f"layers placed by each host's memory: rank 0 on {two[0].name}: layers 8-11 (4, "
                in out), out
        assert f"rank 1 on {two[1].name}: layers 0-7 (8, " in out
        assert "mlx-lm's even split (6, 6 layers) would fit too" in out
        # Each host got only its stage's shards (and the plan said so), whole.
        assert f"{two[0].name} gets only what its stage loads (--pipeline): 2 of 4 weight files" in out
        assert f"{two[1].name} gets only what its stage loads (--pipeline): 3 of 4 weight files" in out
        # What both stages load (the embedding's shard, the config, tokenizer and index) crossed
        # this machine's link once: the second host took it from the first, and only its own
        # two shards came from here.
        assert re.search(rf"model: plan: {two[1].name} takes the \d+ file\(s\) {two[0].name} holds too "
                         rf"\(.*\) from {two[0].name} over {two[0].ip}, not from here again", out), out[-4000:]
        assert re.search(rf"model: {two[1].name}: took .* sha256 verified there", out), out[-4000:]
        assert re.search(rf"model: {two[1].name}: .*: sending 2 file\(s\)", out), out[-4000:]
        wanted = [(two[0], {SHARDS[0], SHARDS[3]}), (two[1], {SHARDS[0], SHARDS[1], SHARDS[2]})]
        for host, shards in wanted:
            there = lab.host_disk(host) / model.relative_to(lab.disk)
            assert {p.name for p in there.glob("model-*.safetensors")} == shards
            assert all(sha256(there / s) == sha256(model / s) for s in shards)
            assert (there / "config.json").is_file() and (there / "tokenizer.json").is_file()
            assert (there / "model.safetensors.index.json").is_file()
        # The answer is one process's.
        alone = generated_alone(model)
        assert alone and chat_text(port) == alone
        # Each rank measured what it loaded: what the split plans, its layers' bytes 1:2.
        loaded = {int(m.group(1)): (int(m.group(2)), int(m.group(3)), int(m.group(4))) for m in re.finditer(
            r"pipeline rank (\d) of 2: layers (\d+)-(\d+) of 12, (\d+) bytes of weights loaded", out)}
        assert loaded.keys() == {0, 1}, out[-4000:]
        folder = read_model_folder(model)
        planned = rank_bytes(folder, 2, PIPELINE, (4, 8))
        assert [loaded[r][2] for r in (0, 1)] == planned
        assert loaded[0][:2] == (8, 11) and loaded[1][:2] == (0, 7)
        whole, _ = layer_bytes(folder)
        assert (planned[1] - whole) == 2 * (planned[0] - whole)
    finally:
        code = serving.stop()
    assert code == 0, serving.output()[-4000:]
    if run_id:
        assert_nothing_left(lab, {"run_id": run_id, "cleanup_problems": []})
    said = [line for line in serving.lines if "split: " in line or "plan: " in line or "pipeline rank" in line]
    print("\n" + "\n".join(said))
    print(f"serve --pipeline by memory over 2 lab hosts: {time.monotonic() - started:.1f} s")


def test_a_model_no_split_fits_is_refused_naming_what_would(lab3, tmp_path, monkeypatch):
    lab = lab3
    two = lab.hosts[:2]
    model = four_shard_model(lab.disk / f"too-big-{uuid.uuid4().hex[:8]}")  # here only
    inventory, env = training_setup(lab, tmp_path, hosts=list(two))
    # 286 KB and 1.4 MB of GPU memory: one layer of 124 KB on the first, 9 on the second, of 12.
    probe = serving.probe_facts
    memory = {two[0].name: 0.0004, two[1].name: 0.002}
    monkeypatch.setattr(serving, "probe_facts", lambda job, env=None, **kw: stood_in(probe(job, env, **kw), memory))
    refused = CliRunner().invoke(cli, ["serve", "-i", str(inventory), "--backend", "ring", "--no-preflight",
                                       "--pipeline", "--port", str(free_port_block(1)), str(model)], env=env)
    assert refused.exit_code == 2, refused.output
    assert f"{two[0].name} needs " in refused.output
    assert f"ways out: 2 hosts: {two[1].name} and 1 more like {two[1].name} (" in refused.output
    assert "the model quantized to 8 bits" in refused.output
    for h in two:  # nothing sent
        assert not lab.host_exists(h, model / "config.json")
