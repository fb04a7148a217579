"""The logic of `train --data DIR` sync apart from the hosts (the lab test,
tests/lab/test_data_sync_lab.py, sends real copies): this machine's copy read
and refused when damaged, every host's state said, room checked with the
figures, rsync's progress read, and the host-side script run for real on a
local folder (check, receive from a stream, a bad stream refused)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from mlxcluster.errors import InputError
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.launch.sync import check_space, read_manifest
from mlxcluster.transfer.manifest import DataFile, Manifest
from mlxcluster.transfer.rsync import progress_pieces
from mlxcluster.transfer.send import AGENT_SOURCE, HostCopy
from reference_train.prepare import prepare_offline

HOST = RankHost(name="mac2", ssh="mac2", ips=("10.0.0.2",), python="python3")


@pytest.fixture
def data(tmp_path):
    prepare_offline(tmp_path / "data", n_stories=40)
    return tmp_path / "data"


def remote(what: str, spec: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-S", "-c", AGENT_SOURCE(), what, spec],
                          input=stdin, capture_output=True, timeout=60)


def test_the_manifest_is_this_machines_copy_hashed_and_a_damaged_one_is_refused(data):
    manifest = read_manifest(data)
    assert [f.name for f in manifest.files] == ["train.bin", "val.bin", "meta.json"]
    meta = json.loads((data / "meta.json").read_text())
    assert manifest.files[0].sha256 == meta["splits"]["train"]["sha256"]
    assert manifest.total_bytes == sum((data / f.name).stat().st_size for f in manifest.files)
    raw = bytearray((data / "val.bin").read_bytes())
    raw[0] ^= 1
    (data / "val.bin").write_bytes(bytes(raw))
    with pytest.raises(InputError, match="val.bin here does not match its meta.json"):
        read_manifest(data)


def test_the_host_script_checks_receives_verifies_and_refuses_a_bad_stream(data, tmp_path):
    manifest = read_manifest(data)
    there = tmp_path / "there" / "data"
    spec = json.dumps({"dir": str(there), "files": [f.spec() for f in manifest.files]})
    checked = json.loads(remote("check", spec).stdout)
    assert set(checked["files"].values()) == {"missing"} and checked["free"] > 0
    stream = b"".join((data / f.name).read_bytes() for f in manifest.files)
    got = remote("receive", spec, stream)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["installed"] == ["train.bin", "val.bin", "meta.json"]
    assert json.loads(remote("check", spec).stdout)["files"] == {f.name: "ok" for f in manifest.files}
    # One byte changed in flight: refused, nothing installed, no leftovers.
    (there / "train.bin").write_bytes(b"")
    bad = bytearray(stream)
    bad[5] ^= 1
    got = remote("receive", spec, bytes(bad))
    assert got.returncode == 1 and b"train.bin arrived with sha256" in got.stderr
    assert json.loads(remote("check", spec).stdout)["files"]["train.bin"] == "size"
    got = remote("receive", spec, stream[:100])  # cut off
    assert got.returncode == 1 and b"the stream ended" in got.stderr
    assert sorted(p.name for p in there.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_room_is_checked_for_what_each_host_lacks_with_the_figures():
    manifest = Manifest("/data/t", (DataFile("train.bin", 2_000_000, "a"),
                                    DataFile("val.bin", 100_000, "b"), DataFile("meta.json", 500, "c")))
    whole = HostCopy(HOST, {"train.bin": "ok", "val.bin": "ok", "meta.json": "ok"}, 0, True)
    check_space(manifest, [whole])  # lacks nothing: no room needed
    half = HostCopy(HOST, {"train.bin": "different", "val.bin": "ok", "meta.json": "ok"}, 2_050_000,
                    True)
    assert half.summary(manifest) == "train.bin different"
    with pytest.raises(InputError) as refused:
        check_space(manifest, [half])  # 2 MB + 5% headroom does not fit in 2.05 MB
    assert str(refused.value) == ("not enough free space for the data: mac2 needs 2.0 MB for "
                                  "/data/t and has 2.0 MB free (nothing was sent)")
    check_space(manifest, [HostCopy(HOST, half.status, 2_100_000, True)])
    assert HostCopy(HOST, {}, 0, False).summary(manifest) == "missing"


def test_a_copy_lacking_many_files_is_summed_up_not_listed():
    """A model's host copy with its config but none of 11 shards: two named, then a count."""
    shards = [DataFile(f"model-{i:05d}-of-00011.safetensors", 10, str(i)) for i in range(1, 12)]
    manifest = Manifest("/m", (DataFile("config.json", 5, "c"), *shards))
    copy = HostCopy(HOST, {"config.json": "ok", shards[0].name: "different"}, 0, True)
    assert copy.summary(manifest) == ("model-00001-of-00011.safetensors different, model-00002-of-00011"
                                      ".safetensors missing and 9 more of 12 files lacking")
    three = Manifest("/m", manifest.files[:4])
    assert copy.summary(three) == ("model-00001-of-00011.safetensors different, model-00002-of-00011"
                                   ".safetensors missing, model-00003-of-00011.safetensors missing")


def test_rsync_progress_is_read_across_carriage_returns():
    out = io.BufferedReader(io.BytesIO(
        b"train.bin\n\r     32,768  40%   31.25MB/s    0:00:00\r     81,410 100%   12.00MB/s"
        b"    0:00:00 (xfer#1, to-check=1/2)\nval.bin\n\r      3,898 100%    3.72MB/s"))
    assert list(progress_pieces(out)) == [
        b"train.bin", b"", b"     32,768  40%   31.25MB/s    0:00:00",
        b"     81,410 100%   12.00MB/s    0:00:00 (xfer#1, to-check=1/2)", b"val.bin", b"",
        b"      3,898 100%    3.72MB/s"]


def test_the_tokenizer_kept_with_the_data_goes_with_it(data, tmp_path):
    """prepare --tokenizer DIR keeps the tokenizer's files in DATA/tokenizer/
    (an exported model needs them on every host): in the manifest, and
    installed in that subfolder by the host's script."""
    (data / "tokenizer").mkdir()
    (data / "tokenizer" / "tokenizer.json").write_text('{"model": {}}')
    manifest = read_manifest(data)
    assert [f.name for f in manifest.files] == ["train.bin", "val.bin", "tokenizer/tokenizer.json",
                                                "meta.json"]
    there = tmp_path / "there"
    spec = json.dumps({"dir": str(there), "files": [f.spec() for f in manifest.files]})
    stream = b"".join((data / f.name).read_bytes() for f in manifest.files)
    assert remote("receive", spec, stream).returncode == 0
    assert (there / "tokenizer" / "tokenizer.json").read_text() == '{"model": {}}'
    assert json.loads(remote("check", spec).stdout)["files"]["tokenizer/tokenizer.json"] == "ok"


def test_the_send_bar_shows_only_to_a_person_at_a_terminal(monkeypatch):
    """In a log (stderr not a terminal) a progress bar is only its label alone on a line:
    nothing is drawn; at a terminal the bar is drawn and ended."""
    from mlxcluster.cli.job_launch import EventView
    from mlxcluster.jobs.events import SendEnded, Sending, SendProgress

    class Terminal(io.StringIO):
        def __init__(self, tty: bool):
            super().__init__()
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    for tty in (False, True):
        err = Terminal(tty)
        monkeypatch.setattr(sys, "stderr", err)
        view = EventView("train")
        for event in (Sending("labhost1", 100), SendProgress("labhost1", 50),
                      SendProgress("labhost1", 100), SendEnded("labhost1")):
            view(event)
        assert ("to labhost1" in err.getvalue()) is tty, (tty, err.getvalue())
