"""Which ranks share an --out (from the tokens each host's writer found), who
writes for them, and checkpoints installed by two writers at once.

The collective that writes and looks for the tokens runs on real hosts in
tests/lab/test_shared_storage_lab.py; here, what is decided from what was seen.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import pytest

from reference_train.checkpoint import (
    checkpoint_problem,
    checkpoint_steps,
    content_hash,
    save_checkpoint,
)
from reference_train.resume import HostLayout
from reference_train.storage import describe_storage, shared_groups, storage_groups


def seen(size: int, *pairs: tuple[int, int]) -> list[list[bool]]:
    """A ranks x ranks matrix: (i, j) means rank i found rank j's token."""
    sees = [[False] * size for _ in range(size)]
    for i, j in pairs:
        sees[i][j] = True
    return sees


def test_hosts_on_their_own_disks_each_write_their_own():
    hosts = ["mac1", "mac2", "mac3"]
    assert storage_groups(hosts, seen(3)) == [0, 1, 2]
    layout = HostLayout(hosts, 0, storage_groups(hosts, seen(3)))
    assert shared_groups(layout) == [] and describe_storage(layout, Path("/o")) is None


def test_hosts_that_see_one_anothers_token_share_one_writer_the_lowest_rank():
    hosts = ["mac1", "mac2", "mac3"]
    everyone = seen(3, (0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1))
    assert storage_groups(hosts, everyone) == [0, 0, 0]
    assert [r for r in range(3) if HostLayout(hosts, r, [0, 0, 0]).writes] == [0]
    # two of three on a NAS, the third on its own disk
    assert storage_groups(hosts, seen(3, (1, 2), (2, 1))) == [0, 1, 1]


def test_one_way_or_through_a_third_host_is_still_one_folder():
    hosts = ["a", "b", "c", "d"]
    # b saw a's token but a did not see b's (its lookup came too early, say): one folder
    assert storage_groups(hosts, seen(4, (1, 0))) == [0, 0, 2, 3]
    # a-b and b-d: a, b and d share; c alone
    assert storage_groups(hosts, seen(4, (0, 1), (3, 1))) == [0, 0, 2, 0]


def test_ranks_on_one_host_follow_their_hosts_writer_and_other_rows_are_ignored():
    # ranks 0, 2 on mac1, ranks 1, 3 on mac2, rank 4 on mac3; only host writers (0, 1, 4) look
    hosts = ["mac1", "mac2", "mac1", "mac2", "mac3"]
    sees = seen(5, (1, 4), (4, 1), (2, 3), (3, 2))  # rows of ranks 2 and 3 count for nothing
    groups = storage_groups(hosts, sees)
    assert groups == [0, 1, 0, 1, 1]
    layout = HostLayout(hosts, 0, groups)
    assert [r for r in range(5) if HostLayout(hosts, r, groups).writes] == [0, 1]
    assert layout.sharing(4) == [1, 3, 4] and layout.sharing(2) == [0, 2]
    assert shared_groups(layout) == [[1, 3, 4]]
    assert describe_storage(layout, Path("/nas/run")) == (
        "shared storage: mac2, mac3 see one --out /nas/run: checkpoints and exports written "
        "once, by rank 1 on mac2")


def test_without_storage_found_out_each_host_writes_as_before():
    hosts = ["mac1", "mac2", "mac1", "mac3", "mac2"]
    assert [r for r in range(5) if HostLayout(hosts, r).writes] == [0, 1, 3]
    assert HostLayout(hosts, 0).sharing(2) == [0, 2]


# ---------------------------------------------------------------- two writers, one folder


def trained(seed: int):
    mx.random.seed(seed)
    model = nn.Linear(8, 8)
    opt = optim.AdamW(learning_rate=1e-3)
    opt.init(model.trainable_parameters())
    mx.eval(model.parameters(), opt.state)
    return model, opt


def save(root: Path, step: int, seed: int = 0, keep: int = 2) -> Path:
    model, opt = trained(seed)
    return save_checkpoint(root, step, model, opt, {"world_size": 2}, keep=keep)


def test_a_whole_identical_checkpoint_already_there_is_kept(tmp_path):
    root = tmp_path / "checkpoints"
    first = save(root, 3)
    inode = (first / "model.safetensors").stat().st_ino
    again = save(root, 3)  # the second writer of one --out, after the first
    assert again == first and (first / "model.safetensors").stat().st_ino == inode
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # no temp dir left
    assert (root / "latest").read_text() == "step_000003\n"


def test_another_or_damaged_checkpoint_of_the_same_step_is_replaced(tmp_path):
    root = tmp_path / "checkpoints"
    old = save(root, 3, seed=1)  # an older run's step 3
    new = save(root, 3, seed=2)
    assert content_hash(new) != content_hash(save(tmp_path / "other", 3, seed=1))
    assert content_hash(new) == content_hash(save(tmp_path / "again", 3, seed=2))
    assert old == new and checkpoint_problem(new) is None
    data = bytearray((new / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (new / "model.safetensors").write_bytes(bytes(data))
    save(root, 3, seed=2)  # the same arrays, but the copy there is damaged: replaced
    assert checkpoint_problem(root / "step_000003") is None
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []


def a_writer(root: str, steps: int, step_together, errors) -> None:
    model, opt = trained(0)
    try:
        for step in range(1, steps + 1):
            step_together.wait(timeout=60)  # as ranks do, between their collectives
            save_checkpoint(Path(root), step, model, opt, {"world_size": 2}, keep=2)
    except BaseException as e:  # noqa: BLE001 - reported to the test
        errors.put(f"{type(e).__name__}: {e}")
        step_together.abort()


STEPS = 150


@pytest.mark.parametrize("writers", [2, 3])
def test_writers_racing_on_one_folder_never_crash(tmp_path, writers):
    """The measured bug: every host's writer saving each step into one --out.
    Processes, as hosts are, each renaming the same checkpoints into place."""
    root = tmp_path / "checkpoints"
    ctx = multiprocessing.get_context("spawn")
    errors, step_together = ctx.Queue(), ctx.Barrier(writers)
    procs = [ctx.Process(target=a_writer, args=(str(root), STEPS, step_together, errors))
             for _ in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    said = []
    while not errors.empty():
        said.append(errors.get())
    assert said == [] and [p.exitcode for p in procs] == [0] * writers
    assert checkpoint_steps(root) == [STEPS - 1, STEPS]
    assert (root / "latest").read_text() == f"step_{STEPS:06d}\n"
    assert checkpoint_problem(root / f"step_{STEPS:06d}") is None
    assert json.loads((root / f"step_{STEPS:06d}" / "state.json").read_text())["step"] == STEPS
