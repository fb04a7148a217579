"""A disk that fills under the trainer: said as a known error (host, folder,
room left, what to do), and the room looked at before each checkpoint.

The failed writes here are real: Linux's /dev/full answers every write with
ENOSPC, so MLX's own writer fails there as on a full disk (reached through a
symlink named *.safetensors: mx.save_safetensors adds that suffix). The lab
test (tests/lab/test_disk_full_lab.py) fills a real file system on one host.
"""

from __future__ import annotations

import errno
import re
import socket
from pathlib import Path

import mlx.core as mx
import pytest

from mlxcluster.doctor.known_errors import diagnose
from reference_train.checkpoint import save_checkpoint
from reference_train.disk_room import (
    MARGIN,
    RoomWatch,
    free_bytes,
    full_disk_error,
    human,
    is_disk_full,
    no_room,
    room_verdict,
    said_when_full,
)
from reference_train.errors import DataError
from tests.conftest import require

HOST = socket.gethostname()
KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture
def full_file(tmp_path) -> Path:
    """A file name whose every write fails with ENOSPC, as on a full disk."""
    require(Path("/dev/full").exists(), "/dev/full (Linux) answers writes with ENOSPC")
    link = tmp_path / "full.safetensors"
    link.symlink_to("/dev/full")
    return link


def mlx_write_error(path: Path) -> RuntimeError:
    with pytest.raises(RuntimeError) as caught:
        mx.save_safetensors(str(path), {"w": mx.zeros((1024,))})
    return caught.value


def test_mlx_s_own_failed_write_is_said_with_host_folder_and_room(full_file, tmp_path):
    raw = mlx_write_error(full_file)
    assert str(raw).startswith("[write] Unable to write ") and is_disk_full(raw)
    folder = tmp_path / "out" / "checkpoints"  # not made yet: the room of its parent's disk
    with pytest.raises(DataError) as caught:
        with said_when_full(folder, "checkpoint step_000004"):
            mx.save_safetensors(str(full_file), {"w": mx.zeros((1024,))})
    said = str(caught.value)
    assert said.startswith(f"{HOST}: no room to write checkpoint step_000004 in {folder}: ")
    free = re.search(r": ([\d.]+ (bytes|KiB|MiB|GiB|TiB)) free there \(mlx: unable to write \d+ "
                     r"bytes to file\)", said)
    assert free, said
    assert f"hint: free room on {HOST} (df -h {folder}) or train with another --out, then run " \
           "again with --resume auto" in said
    # mlx's bracketed words are not repeated: the launcher's known error says them only
    # for programs that did not say it themselves
    assert "[write]" not in said and diagnose([f"error: {said}"]) == []
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_an_oserror_enospc_is_said_the_same_way(full_file, tmp_path):
    with pytest.raises(DataError) as caught:
        with said_when_full(tmp_path, "the exported model"), open(full_file, "w") as f:
            f.write("x" * 10)
    said = str(caught.value)
    assert said.startswith(f"{HOST}: no room to write the exported model in {tmp_path}: ")
    assert "free there (No space left on device)" in said


def test_other_failures_pass_through_as_they_are(tmp_path):
    for error in (RuntimeError("[load] Failed to open file x"), PermissionError(errno.EACCES, "no")):
        with pytest.raises(type(error)) as caught:
            with said_when_full(tmp_path, "x"):
                raise error
        assert caught.value is error
    assert is_disk_full(OSError(errno.EDQUOT, "Disc quota exceeded"))
    assert not is_disk_full(OSError(errno.EIO, "I/O error"))


def test_the_message_names_host_folder_free_and_needed_bytes():
    said = str(no_room("/runs/demo/checkpoints", "checkpoint step_000006", free=12 * KiB + 300,
                       needed=2 * MiB, cause="checked before writing; nothing was written",
                       host="mini2"))
    assert said == ("mini2: no room to write checkpoint step_000006 in /runs/demo/checkpoints: "
                    "12.3 KiB free there, 2.0 MiB needed (checked before writing; nothing was "
                    "written) (hint: free room on mini2 (df -h /runs/demo/checkpoints) or train "
                    "with another --out, then run again with --resume auto: it goes on from the "
                    "newest whole checkpoint)")
    assert "could not be read" in str(no_room("/x", "y", free=None, host="h"))
    assert [human(n) for n in (0, 1023, 1024, 5 * MiB + MiB // 2, 3 << 30)] == [
        "0 bytes", "1023 bytes", "1.0 KiB", "5.5 MiB", "3.0 GiB"]


def test_a_full_disk_under_another_file_names_its_folder(tmp_path):
    error = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl"))
    said = str(full_disk_error(error, "/elsewhere"))
    assert said.startswith(f"{HOST}: no room to write metrics.jsonl in {tmp_path}: ")
    said = str(full_disk_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path))
    assert said.startswith(f"{HOST}: no room to write the run's files in {tmp_path}: ")


def test_free_bytes_of_a_folder_not_made_yet_is_its_parent_s(tmp_path):
    assert free_bytes(tmp_path / "a" / "b") is not None
    assert abs(free_bytes(tmp_path / "a" / "b") - free_bytes(tmp_path)) < 64 * MiB


@pytest.mark.parametrize(("free", "size", "verdict"), [
    (10 * MiB, 1 * MiB, "ok"),
    (2 * MiB + MARGIN, 1 * MiB, "ok"),  # two more fit: no warning yet
    (2 * MiB + MARGIN - 1, 1 * MiB, "low"),
    (1 * MiB + MARGIN, 1 * MiB, "low"),  # one more fits, just
    (1 * MiB + MARGIN - 1, 1 * MiB, "full"),  # it would not: stop before writing
    (0, 1 * MiB, "full"),
    (100 * KiB, 1, "ok"),
])
def test_room_verdict(free, size, verdict):
    assert room_verdict(free, size) == verdict


def test_the_watch_warns_once_and_stops_a_checkpoint_that_cannot_fit(tmp_path):
    watch = RoomWatch()
    assert watch.before(tmp_path, "checkpoint step_000002", free=0) is None  # size not known yet
    watch.size = 300 * KiB
    assert watch.before(tmp_path, "checkpoint step_000004", free=10 * MiB) is None
    warning = watch.before(tmp_path, "checkpoint step_000006", free=600 * KiB)
    assert warning == (f"{HOST}: 600.0 KiB free in {tmp_path}, room for fewer than 2 checkpoints "
                       f"of 300.0 KiB: free room on {HOST} before the disk fills (the run stops, "
                       "with its last checkpoint intact, when one no longer fits)")
    assert watch.before(tmp_path, "checkpoint step_000008", free=600 * KiB) is None  # said once
    with pytest.raises(DataError) as caught:
        watch.before(tmp_path, "checkpoint step_000010", free=200 * KiB)
    said = str(caught.value)
    assert said.startswith(f"{HOST}: no room to write checkpoint step_000010 in {tmp_path}: "
                           "200.0 KiB free there, 364.0 KiB needed (checked before writing; "
                           "nothing was written)")


def test_the_watch_takes_the_size_of_the_checkpoint_written(tmp_path):
    import mlx.nn as nn
    import mlx.optimizers as optim

    model = nn.Linear(64, 64)
    opt = optim.AdamW(learning_rate=1e-3)
    opt.init(model.trainable_parameters())
    path = save_checkpoint(tmp_path / "checkpoints", 2, model, opt, {"data": {}})
    watch = RoomWatch()
    watch.saw(path)
    assert watch.size == sum(p.stat().st_size for p in path.iterdir())
    assert watch.size > 64 * 64 * 4 * 3  # weights, and AdamW's two moments


def test_the_real_mlx_line_is_a_known_error_for_other_programs(full_file):
    raw = str(mlx_write_error(full_file))
    for line in (f"RuntimeError: {raw}", f"error: {raw}"):
        [known] = diagnose([line])
        assert known.error.key == "write-failed"
        assert "disk" in known.text() and "free room on the host" in known.text()


def test_a_received_checkpoint_that_finds_no_room_is_said_and_its_folder_removed(
        full_file, tmp_path, monkeypatch):
    """resume.py's writer of a checkpoint sent from another host: the write
    really fails (its folder's model.safetensors is /dev/full), the message
    names the host, the folder and where it came from, and the folder goes."""
    import tempfile

    import mlx.nn as nn
    import mlx.optimizers as optim

    from reference_train.checkpoint import checkpoint_problem
    from reference_train.resume import HostLayout, send_checkpoint

    root = tmp_path / "checkpoints"
    model = nn.Linear(16, 16)
    opt = optim.AdamW(learning_rate=1e-3)
    opt.init(model.trainable_parameters())
    held = save_checkpoint(root, 2, model, opt, {"world_size": 1})
    receiving = root / ".step_000002.recv.test"

    def mkdtemp(prefix="", dir=None):  # the receiver's folder, with its first file on a full disk
        assert prefix == ".step_000002.recv." and Path(dir) == root
        receiving.mkdir()
        (receiving / "model.safetensors").symlink_to(full_file)
        return str(receiving)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    group = mx.distributed.init()  # a group of 1: it sends to itself
    with pytest.raises(DataError) as caught:
        send_checkpoint(group, HostLayout([HOST], 0), root, 2, source=0, receive=True, keep=2)
    said = str(caught.value)
    assert said.startswith(f"{HOST}: no room to write step_000002 received from {HOST} in {root}: ")
    assert "free there (No space left on device)" in said
    assert not receiving.exists() and checkpoint_problem(held) is None
