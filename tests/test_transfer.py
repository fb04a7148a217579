"""mlxcluster.transfer on its own: files sent to a host and fetched from one
(a whole fetch: tests/test_train_record.py, through launch/fetch.py),
checked by sha256 at the other end, through real processes. A "host" here is
a HOME of its own on this machine reached by bash (a ``ProcessLink`` as
jobs.hosts makes for a local rank), running the real agent with this python;
rsync runs for real through a stand-in for ssh that runs its command here.
The doctor's connection is the tests' runner stand-in (tests/fakes.py) run
for real by ``sh``. Real ssh and rsync between hosts: the lab tests
(tests/lab/test_data_sync_lab.py, test_code_sync_lab.py, test_fix_trainer_deps_lab.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlxcluster.ssh.runner import ProcessRunner
from mlxcluster.transfer import link as link_module
from mlxcluster.transfer.fanout import offering, take
from mlxcluster.transfer.fetch import fetch
from mlxcluster.transfer.link import (
    HostUnreachable,
    NoAnswer,
    ProcessLink,
    RunnerLink,
    TransferError,
)
from mlxcluster.transfer.manifest import files_manifest, folder_manifest
from mlxcluster.transfer.send import AGENT_SOURCE, check, send
from tests.conftest import require
from tests.fakes import FakeSsh
from tests.inventory_support import inventory_of


def bash_in(home: Path, pipe: str = ""):
    """The argv that runs a command on the "host" whose HOME is ``home``
    (``pipe``: what its stdout goes through on the way here)."""
    return lambda script: ["env", f"HOME={home}", "bash", "-c", f"( {script} ){pipe}"]


@pytest.fixture
def home(tmp_path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture
def model(tmp_path) -> Path:
    """A folder here: two files, one in a subfolder, and a dot file (not sent)."""
    folder = tmp_path / "here" / "model"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "weights.safetensors").write_bytes(os.urandom(300_000))
    (folder / "tokenizer" / "tokenizer.json").write_text('{"model": {}}')
    (folder / ".cache").write_text("not sent")
    return folder


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_folder_is_sent_as_a_stream_verified_there_and_checked_whole_after(home, model):
    link = ProcessLink("mac1", sys.executable, ProcessRunner(bash_in(home)))
    manifest = folder_manifest(model)
    there = replace(manifest, folder="~/models/m", source=str(model))
    copy = check(link, there)
    assert copy.summary(there) == "missing" and copy.folder == f"{home}/models/m" and copy.free > 0
    seen: list[int] = []
    sent = send(there, copy, seen.append, use_rsync=False)
    assert (sent.host, sent.via, sent.bytes) == ("mac1", "ssh stream", there.total_bytes)
    assert sent.names == ("tokenizer/tokenizer.json", "weights.safetensors")
    assert seen == sorted(seen) and seen[-1] == there.total_bytes  # progress, to the end
    got = home / "models" / "m"
    assert files_under(got) == {k: v for k, v in files_under(model).items() if k != ".cache"}
    assert check(link, there).summary(there) == "whole"
    (got / "weights.safetensors").write_bytes(b"x" * 300_000)  # same size, other bytes
    assert check(link, there).summary(there) == "weights.safetensors different"


def test_rsync_sends_through_the_links_own_ssh_into_a_staging_folder(home, model, tmp_path):
    require(shutil.which("rsync") is not None, "rsync is not installed here")
    # ssh's stand-in: skips ssh's options and the target, runs rsync's own command here.
    ssh = tmp_path / "ssh"
    ssh.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in -o|-p|-F|-l) shift 2;; '
                   '-*) shift;; *) break;; esac; done\nshift\nexec sh -c "$*"\n')
    ssh.chmod(0o755)
    link = ProcessLink("mac1", sys.executable,
                       ProcessRunner(bash_in(home), rsh=(str(ssh), "-o", "BatchMode=yes")), "mac1")
    manifest = folder_manifest(model)
    target = home / "data"
    there = replace(manifest, folder=str(target), source=str(model))
    copy = check(link, there)
    assert copy.rsync
    seen: list[int] = []
    sent = send(there, copy, seen.append)  # rsync: both ends have it, the link is ssh
    assert sent.via == "rsync" and seen[-1] == there.total_bytes
    assert files_under(target) == {k: v for k, v in files_under(model).items() if k != ".cache"}
    assert not list(target.glob(".incoming*"))  # the staging folder installed and removed


def test_files_from_several_folders_go_side_by_side_and_twice_is_once(home, tmp_path):
    """The doctor's wheels: files from two fetch folders into ~/.cache/... there,
    over the doctor's connection (a runner: here its stand-in, run by sh)."""
    wheels = []
    for version in ("1.0", "2.0"):
        (tmp_path / version).mkdir()
        wheels.append(tmp_path / version / f"pkg-{version}-py3-none-any.whl")
        wheels[-1].write_bytes(version.encode() * 5000)
    machines = FakeSsh.local(tmp_path / "hosts", inventory_of(["b"]))
    [address] = machines.names
    link = RunnerLink(address, sys.executable, machines)
    manifest = files_manifest("~/.cache/w", wheels)
    copy = check(link, manifest, timeout=60)
    sent = send(manifest, copy, lambda n: None, use_rsync=False, timeout=60)
    assert sent.names == ("pkg-1.0-py3-none-any.whl", "pkg-2.0-py3-none-any.whl")
    assert sorted(p.name for p in (machines.homes["b"] / ".cache" / "w").iterdir()) == list(sent.names)
    assert check(link, manifest, timeout=60).lacking(manifest) == ()


@pytest.mark.parametrize("pipe, said", [
    # one byte of the first file's content flipped on the way
    (" | {py} -c 'import sys; d = sys.stdin.buffer.read(); i = d.index(b\"\\n\") + 9; "
     "sys.stdout.buffer.write(d[:i] + bytes([d[i] ^ 1]) + d[i + 1:])'",
     "arrived with sha256"),
    (" | head -c 300", "the stream ended"),  # cut off
])
def test_a_fetched_stream_altered_or_cut_leaves_nothing_here(home, tmp_path, pipe, said):
    folder = home / "out"
    folder.mkdir()
    (folder / "a.bin").write_bytes(os.urandom(5000))
    here = tmp_path / "here"
    here.mkdir()
    (here / "a.bin").write_bytes(b"the copy here before")
    link = ProcessLink("mac1", sys.executable, ProcessRunner(bash_in(home, pipe.format(py=sys.executable))))
    with pytest.raises(TransferError, match=said):
        fetch(link, str(folder), here)
    assert files_under(here) == {"a.bin": b"the copy here before"}  # nothing half-written


def test_a_missing_folder_there_is_named_and_nothing_is_made_here(home, tmp_path):
    with pytest.raises(TransferError, match=r"^mac1: send .*/nothing: .*No such file"):
        fetch(ProcessLink("mac1", sys.executable, ProcessRunner(bash_in(home))), str(home / "nothing"),
              tmp_path / "here")
    assert not (tmp_path / "here").exists()


def test_the_agent_refuses_a_name_that_would_leave_its_folder(tmp_path):
    spec = {"dir": str(tmp_path / "d"), "files": [{"name": "../evil", "bytes": 1, "sha256": "0"}]}
    got = subprocess.run([sys.executable, "-S", "-c", AGENT_SOURCE(), "receive", json.dumps(spec)],
                         input=b"x", capture_output=True, timeout=60)
    assert got.returncode == 1 and b"refused the file name '../evil'" in got.stderr
    assert not (tmp_path / "evil").exists()


def test_a_host_that_stops_reading_is_given_up_and_one_that_hangs_is_named(home, model,
                                                                             monkeypatch):
    monkeypatch.setattr(link_module, "STALL_S", 1.0)
    link = ProcessLink("mac1", sys.executable, ProcessRunner(bash_in(home)))
    manifest = folder_manifest(model)
    stuck = ProcessLink("mac1", sys.executable, ProcessRunner(lambda script: ["sleep", "30"]))
    there = replace(manifest, folder=str(home / "m"), source=str(model))
    copy = replace(check(link, there), host=stuck)  # checked, then the host stops reading
    with pytest.raises(TransferError, match=r"sending .* to mac1 failed: no progress for \d+ s: stopped"):
        send(there, copy, lambda n: None, use_rsync=False)
    with pytest.raises(NoAnswer, match="mac1 did not answer within 1 s"):
        stuck.run("true", timeout=1)
    with pytest.raises(TransferError, match=r"mac1 did not answer within 1 s whether it has --data"):
        check(stuck, manifest, what="--data", timeout=1)


def test_an_ssh_failure_is_exit_255_naming_the_host():
    refused = ProcessLink("mac1", sys.executable, ProcessRunner(lambda script: [
        "bash", "-c", "echo 'ssh: connect to host mac1 port 22: Connection refused' >&2; exit 255"]))
    manifest = files_manifest("/x", [])
    with pytest.raises(HostUnreachable) as failed:
        check(refused, manifest)
    assert failed.value.exit_code == 255
    assert failed.value.message == ("the ssh connection to mac1 failed: ssh: connect to host "
                                    "mac1 port 22: Connection refused")


def test_a_stream_cut_off_resumes_at_the_byte_and_only_a_whole_file_is_taken(home, model, tmp_path):
    """The link cut mid-file (here: only the first 200,000 bytes of the stream
    reach the host): what arrived stays on the host, its check says how much,
    and the next send sends the rest only, each file then verified whole."""
    cut = ProcessLink("mac1", sys.executable, ProcessRunner(bash_in(home)))
    there = replace(folder_manifest(model), folder=str(home / "m"), source=str(model))
    order = sorted(there.files, key=lambda f: f.name)  # the stream's order: the tokenizer first
    first = order[0].bytes
    cut_at = first + 200_000

    class CutLink(ProcessLink):  # the bytes past ``cut_at`` never arrive: a link that went down
        def run(self, script, *, stdin=None, timeout):
            if stdin is None:  # the check
                return super().run(script, timeout=timeout)

            class Cut:
                sent = 0

                def read(self, n=-1):
                    if self.sent >= cut_at:
                        return b""
                    data = stdin.read(min(n if n > 0 else 1 << 20, cut_at - self.sent))
                    self.sent += len(data)
                    return data
            return super().run(script, stdin=Cut(), timeout=timeout)

    link = CutLink(cut.name, cut.python, cut.runner)
    with pytest.raises(TransferError, match="the stream ended 100000 bytes before the end of "
                                            "weights.safetensors") as err:
        send(there, check(link, there), lambda n: None, use_rsync=False)
    assert "the next send resumes what arrived" in err.value.hint
    assert not (home / "m" / "weights.safetensors").exists()  # never taken for whole
    copy = check(cut, there)
    assert copy.partial == {"tokenizer/tokenizer.json": first, "weights.safetensors": 200_000}
    assert copy.summary(there) == "missing"
    sent = send(there, copy, lambda n: None, use_rsync=True)  # a part there: the stream all the same
    assert (sent.via, sent.bytes, sent.resumed) == ("ssh stream", 100_000, first + 200_000)
    assert files_under(home / "m") == {k: v for k, v in files_under(model).items() if k != ".cache"}
    assert check(cut, there).summary(there) == "whole" and check(cut, there).partial == {}


def test_a_part_with_wrong_bytes_is_dropped_never_installed(home, model):
    """What a cut send left is hashed with what follows: a part whose bytes
    are not the file's (a disk error, another version) is removed and the
    send fails, naming the file; the next send starts it from its first byte."""
    link = ProcessLink("mac1", sys.executable, ProcessRunner(bash_in(home)))
    there = replace(folder_manifest(model), folder=str(home / "m"), source=str(model))
    weights = next(f for f in there.files if f.name == "weights.safetensors")
    parts = home / "m" / ".mlxcluster-partial"
    parts.mkdir(parents=True)
    (parts / f"{weights.sha256}.cut").write_bytes(b"\0" * 1000)
    copy = check(link, there)
    assert copy.partial == {"weights.safetensors": 1000}
    with pytest.raises(TransferError, match="weights.safetensors arrived with sha256"):
        send(there, copy, lambda n: None, use_rsync=False)
    assert not list(parts.iterdir()) and not (home / "m" / "weights.safetensors").exists()
    copy = check(link, there)
    assert copy.partial == {}
    assert copy.summary(there) == "weights.safetensors missing"  # the tokenizer was whole: in place
    assert send(there, copy, lambda n: None, use_rsync=False).bytes == weights.bytes
    assert check(link, there).summary(there) == "whole"


def test_an_agent_of_the_cut_send_still_writing_does_not_touch_the_resumed_copy(tmp_path):
    """After a link drop the cut send's agent may live on, its connection not
    yet found dead: the next send copies the part's bytes into a part of its
    own and removes the old, so whatever the old agent still writes goes
    nowhere."""
    import hashlib

    agent = tmp_path / "agent.py"
    agent.write_text(AGENT_SOURCE())
    data = os.urandom(5000)
    sha = hashlib.sha256(data).hexdigest()
    folder = tmp_path / "m"
    parts = folder / ".mlxcluster-partial"
    parts.mkdir(parents=True)
    (parts / f"{sha}.111-old").write_bytes(data[:1000])

    def receive(start: int, into: Path) -> subprocess.CompletedProcess:
        spec = {"dir": str(into), "resumable": True,
                "files": [{"name": "w.bin", "bytes": 5000, "sha256": sha, "from": start}]}
        return subprocess.run([sys.executable, "-S", str(agent), "receive", json.dumps(spec)],
                              input=data[start:], capture_output=True, timeout=60)

    with open(parts / f"{sha}.111-old", "ab", buffering=0) as still_writing:
        resumed = receive(1000, folder)
        still_writing.write(b"late bytes of the cut send")
    assert resumed.returncode == 0, resumed.stderr
    assert (folder / "w.bin").read_bytes() == data and not parts.exists()
    gone = receive(1000, folder)  # nothing left to resume from: said, nothing installed
    assert gone.returncode == 1 and b"the 1000 bytes a cut send left are no longer here" in gone.stderr


def test_a_take_from_another_hosts_offer_says_its_progress_and_installs_every_file(home, model, tmp_path):
    """transfer/fanout.py through the real agents: one "host" offers its copy
    on 127.0.0.1, another takes it, its progress told as the taking host
    counts it (the bytes never pass here), rising to the whole."""
    manifest = folder_manifest(model)
    giver_home = tmp_path / "giver"
    giver_home.mkdir()
    giver = ProcessLink("mac1", sys.executable, ProcessRunner(bash_in(giver_home)))
    source = replace(manifest, folder="~/m", source=str(model))
    send(source, check(giver, source), lambda n: None, use_rsync=False)
    taker = ProcessLink("mac2", sys.executable, ProcessRunner(bash_in(home)))
    there = replace(manifest, folder=str(home / "m"), source=str(model))
    lacking = check(taker, there)
    seen: list[int] = []
    with offering(giver, source, check(giver, source), "127.0.0.1") as (at, token):
        got = take(taker, there, lacking, at, token, "mac1", seen.append)
    assert (got.host, got.bytes) == ("mac2", manifest.total_bytes)
    assert seen and seen == sorted(seen) and seen[-1] == manifest.total_bytes
    assert files_under(home / "m") == {k: v for k, v in files_under(model).items() if k != ".cache"}
    assert check(taker, there).summary(there) == "whole"
