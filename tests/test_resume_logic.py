"""Which rank writes for its host, and which checkpoint on a disk counts as whole."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim

from reference_train.checkpoint import save_checkpoint
from reference_train.resume import HostLayout, checkpoint_root, newest_whole


def test_the_lowest_rank_of_each_host_writes():
    layout = ["mac1", "mac2", "mac1", "mac3", "mac2"]
    writers = [r for r in range(5) if HostLayout(layout, r).writes]
    assert writers == [0, 1, 3]
    assert [r for r in range(3) if HostLayout(["here"] * 3, r).writes] == [0]


def saved(root, step):
    model = nn.Linear(4, 4)
    opt = optim.AdamW(learning_rate=1e-3)
    opt.init(model.trainable_parameters())
    mx.eval(model.parameters(), opt.state)
    return save_checkpoint(root, step, model, opt, {"world_size": 1}, keep=0)


def test_a_damaged_newest_checkpoint_is_passed_over_for_the_previous(tmp_path):
    root = tmp_path / "checkpoints"
    saved(root, 2)
    newest = saved(root, 4)
    holding, path = newest_whole(root)
    assert (holding.step, path, holding.notes) == (4, newest, [])
    state = json.loads((newest / "state.json").read_text())
    assert state["format"] == 2 and set(state["hashes"]) == {"model.safetensors",
                                                             "optimizer.safetensors"}
    data = bytearray((newest / "optimizer.safetensors").read_bytes())
    data[-1] ^= 1
    (newest / "optimizer.safetensors").write_bytes(bytes(data))
    holding, path = newest_whole(root)
    assert holding.step == 2 and path == root / "step_000002"
    assert "optimizer.safetensors does not match its hash" in holding.notes[0]
    (root / "step_000002" / "model.safetensors").unlink()
    holding, path = newest_whole(root)
    assert holding.step == -1 and path is None and len(holding.notes) == 2


def test_resume_paths_name_the_checkpoint_folder_on_each_host(tmp_path):
    out = tmp_path / "run"
    assert checkpoint_root("auto", out) == (out / "checkpoints", None)
    assert checkpoint_root(str(out / "checkpoints" / "step_000010"), out) == (
        out / "checkpoints", 10)
    assert checkpoint_root(str(out), out) == (out / "checkpoints", None)  # nothing there yet
    assert checkpoint_root(str(out / "checkpoints"), out) == (out / "checkpoints", None)


def test_a_bound_passes_over_the_checkpoints_at_and_after_it(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (8, 16, 24):
        saved(root, step)
    assert newest_whole(root, before=24)[0].step == 16
    assert newest_whole(root, before=25)[0].step == 24
    assert newest_whole(root, before=8)[0].step == -1  # none before: start from step 0
    assert newest_whole(root, before=0)[0].step == 24  # 0: no bound
