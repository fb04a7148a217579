"""`serve ID --download-on HOST` and `train --download-on HOST -- --init_from ID` on
two lab hosts, each on its own disk (issue 48): the id is only in labhost1's own
Hugging Face cache (HF_HUB_OFFLINE=1: the real cache layout, links to blobs); labhost1
resolves it, labhost2 takes it from labhost1 over the hosts' link, and this machine
reads a view of it (its config and tokenizer, its weight files' headers, their tails
sparse). The server answers as one process of the model does; a --pipeline 2 LoRA run
trains one process's losses. Nothing of the weights crossed this machine's link, and
this machine holds none of their bytes, not even while the view exists."""

from __future__ import annotations

import re
import struct
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from mlxcluster.jobs.plan import free_port_block
from tests import waits
from tests.chat_support import make_chat_folder
from tests.hf_support import QWEN2_CONFIG, make_llama_folder
from tests.hub_cache_support import cache_model
from tests.lab.jobs import MPI_ENV, REPO, records
from tests.learning_support import MODEL_CONFIG, learning_data
from tests.serve_support import Serving, chat_text, generated_alone
from tests.train_support import read_metrics, run_trainer
from tests.waits import SERVE_UP_S

pytestmark = pytest.mark.lab

MODEL_ID = "mlx-community/Tiny-chat"
# mlx-lm's llama has no pipeline(); its qwen2 has (tests/lab/test_serve_split_lab.py).
QWEN_ID = "mlx-community/Tiny-qwen-chat"
QWEN = {**QWEN2_CONFIG, "vocab_size": 400, "num_hidden_layers": 4, "max_window_layers": 4}
# Wide enough that its weights (15 MB, float32) dwarf what this machine sends anyway
# (the ssh calls, the agent's source, the code the ranks import, the requests).
WIDE = {**MODEL_CONFIG, "hidden_size": 256, "intermediate_size": 2048}
STEPS = 3


def sent_from_here(lab) -> int:
    return int(Path(f"/sys/class/net/{lab.bridge}/statistics/tx_bytes").read_text())


def header_bytes(path: Path) -> int:
    with path.open("rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def trainer_flags(model: str, data: Path) -> list[str]:
    return ["--config", "tiny", "--init_from", model, "--data", str(data), "--fine_tune", "lora",
            "--lora_layers", "-1", "--lora_rank", "8", "--block_size", "64", "--global_batch", "8",
            "--steps", str(STEPS), "--lr", "1e-2", "--log_every", "1", "--eval_every", "0",
            "--sample_tokens", "0", "--compile", "false", "--kernels", "mlx"]


@dataclass(frozen=True)
class OnlyOnFirst:
    """A model folder made here, put only in the first lab host's own Hugging Face
    cache as ``model_id``: its files, the cache's path (the same on every host),
    the snapshot there, an inventory of the first two hosts naming that cache,
    and serve's and train's environment (offline)."""

    files: dict[str, bytes]
    cache: Path
    snapshot: Path
    inventory: Path
    env: dict[str, str]


def only_on_first(lab, tmp_path: Path, model: Path, model_id: str) -> OnlyOnFirst:
    first, second = lab.hosts[:2]
    files = {p.relative_to(model).as_posix(): p.read_bytes() for p in model.rglob("*") if p.is_file()}
    cache = lab.disk / f"hub-{uuid.uuid4().hex[:8]}"
    on_first = cache_model(lab.host_disk(first) / cache.relative_to(lab.disk), model_id, files)
    inventory = lab.write_inventory(tmp_path / "two.yaml", hosts=[first, second],
                                    env={**MPI_ENV, "HF_HUB_CACHE": str(cache)})
    env = {**lab.env(), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    env.pop("LD_PRELOAD", None)
    return OnlyOnFirst(files, cache, lab.disk / on_first.relative_to(lab.host_disk(first)),
                       inventory, env)


def test_serve_and_train_a_model_only_the_hosts_hold(lab3, tmp_path):
    lab = lab3
    first, second = lab.hosts[:2]
    model = tmp_path / "tiny-chat"  # the test's own copy: one process's answer and losses
    make_chat_folder(model, "llama3")
    make_llama_folder(model, WIDE, seed=3, shard=True)
    held = only_on_first(lab, tmp_path, model, MODEL_ID)
    files, cache, snapshot, inventory, env = (held.files, held.cache, held.snapshot,
                                              held.inventory, held.env)
    weights = sum(len(b) for n, b in files.items() if n.endswith(".safetensors"))

    port = free_port_block(1)
    before = sent_from_here(lab)
    serving = Serving(["-i", str(inventory), "--backend", "ring", "--no-preflight", "--port", str(port),
                       "--download-on", first.name, MODEL_ID], env=env, cwd=tmp_path)
    try:
        serving.wait_for(r"serving \S+ at http://", SERVE_UP_S)
        crossed = sent_from_here(lab) - before
        said = serving.output()
        view = Path(re.search(r"model: this machine reads a view of it: .* at (\S+); the ranks open "
                              + re.escape(str(snapshot)) + " on every host", said).group(1))
        # the view while it serves: every file, each weight file only its header on disk
        shards = sorted(n for n in files if n.endswith(".safetensors"))
        assert len(shards) > 2
        for name in shards:
            held = view / name
            assert held.stat().st_size == len(files[name])
            assert held.stat().st_blocks * 512 <= header_bytes(held) + 4096, name
        assert (view / "tokenizer_config.json").read_bytes() == files["tokenizer_config.json"]
        assert chat_text(port) == generated_alone(model)
    finally:
        code = serving.stop()
    assert code == 0, serving.output()
    assert (f"model: plan: {first.name} -> {second.name} over {first.ip} ({first.name}'s data IP), "
            "at once; nothing through this machine") in said, said
    assert "missing: sending" not in said, said
    assert f"split: {snapshot} over 2 rank(s), tensor: " in said, said  # named, not the view
    print(f"serve --download-on: {crossed} bytes sent from here, weights {weights} bytes")
    assert crossed < 0.15 * weights, (crossed, weights)
    there = lab.host_disk(second) / snapshot.relative_to(lab.disk)
    assert {n: (there / n).read_bytes() for n in files} == files  # taken whole, not from here
    assert not cache.exists() and not view.exists(), "no copy here; the view gone with the run"

    # train --pipeline 2 from the same id: every host holds it (checked, nothing sent),
    # the stages planned from a view here, and one process's losses
    data = learning_data(model, lab.disk / f"data-{uuid.uuid4().hex[:8]}", True, n=48)
    out = lab.disk / f"dl-out-{uuid.uuid4().hex[:8]}"
    before = sent_from_here(lab)
    proc = waits.run([sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory),
                      "--no-preflight", "--stall-timeout", "30s", "--download-on", first.name,
                      "--", *trainer_flags(MODEL_ID, data), "--out", str(out), "--pipeline", "2"],
                     env=env, cwd=tmp_path)
    crossed = sent_from_here(lab) - before  # the data (46 KB) went from here: the model did not
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-4000:]
    print(f"train --download-on: {crossed} bytes sent from here, weights {weights} bytes")
    assert crossed < 0.15 * weights, (crossed, weights)
    assert f"model: {second.name} has {snapshot} (" in said and "sha256 checked)" in said, said
    assert (f"pipeline: every host holds the whole of {snapshot} (--download-on): each stage reads "
            "its own weight files there, nothing sent") in said, said
    for i, h in enumerate((first, second)):
        assert f"pipeline: stage {i + 1} of 2 on {h.name}: " in said, said
    view = Path(re.search(r"model: this machine reads a view of it: .* at (\S+); the ranks open",
                          said).group(1))
    assert not cache.exists() and not view.exists()
    reference = tmp_path / "reference"
    alone = run_trainer([*trainer_flags(str(model), data), "--out", str(reference)])
    assert alone.returncode == 0, alone.stderr[-3000:]
    expected = {r["step"]: r["loss"] for r in read_metrics(reference) if "loss" in r}
    got = {r["step"]: r["loss"] for r in records(out / "metrics.jsonl") if "loss" in r}
    assert sorted(got) == list(range(1, STEPS + 1)), got
    for step, loss in expected.items():
        assert abs(got[step] - loss) <= 1e-5 * abs(loss), (step, got[step], loss)


def test_serve_pipeline_of_a_model_only_the_hosts_hold(lab3, tmp_path):
    """`serve --pipeline --download-on HOST ID`: the layers split from the view
    here (its config and weight headers) while the ranks open the hosts'
    folder; every host holds the whole download, so nothing is sent from
    here; the answer is one process's."""
    lab = lab3
    first, second = lab.hosts[:2]
    model = tmp_path / "tiny-qwen"
    make_chat_folder(model, "qwen25")
    make_llama_folder(model, QWEN, seed=5, shard=True)
    held = only_on_first(lab, tmp_path, model, QWEN_ID)
    files, cache, snapshot, inventory, env = (held.files, held.cache, held.snapshot,
                                              held.inventory, held.env)
    port = free_port_block(1)
    serving = Serving(["-i", str(inventory), "--backend", "ring", "--no-preflight", "--pipeline",
                       "--port", str(port), "--download-on", first.name, QWEN_ID],
                      env=env, cwd=tmp_path)
    try:
        up = serving.wait_for(r"serving (\S+) at (http://\S+) \((\d) ranks, (\w+)\)$", SERVE_UP_S)
        assert up.groups() == (QWEN_ID, f"http://127.0.0.1:{port}/v1", "2", "pipeline")
        assert chat_text(port) == generated_alone(model)
    finally:
        code = serving.stop()
    said = serving.output()
    assert code == 0, said[-4000:]
    assert f"split: {snapshot} over 2 rank(s), pipeline: " in said, said  # named, not the view
    assert "gets only what its stage loads" not in said and "missing: sending" not in said, said
    there = lab.host_disk(second) / snapshot.relative_to(lab.disk)
    assert {n: (there / n).read_bytes() for n in files} == files  # taken whole from labhost1
    assert not cache.exists(), "no copy here"
