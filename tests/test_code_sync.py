"""What ranks import of this project, sent to the hosts (mlxcluster.launch.code):
the files and their version, what a host is sent and what not, the PYTHONPATH
the ranks get. The hosts here are folders on this machine, each with its own
HOME, reached through the real host-side script (transfer/agent.py) instead of ssh;
the lab test (tests/lab/test_code_sync_lab.py) sends to real hosts that have
no copy of the project."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlxcluster.jobs.events import Note, Sending
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.jobs.job import RANK_WRAPPER_FILES, Job, package_root, rank_env
from mlxcluster.jobs.plan import launcher_argv
from mlxcluster.launch import code, sync
from mlxcluster.launch.code import (
    CACHE_ROOT,
    SERVE_RANK_FILES,
    code_files,
    code_manifest,
    sync_code,
)
from mlxcluster.transfer.link import TransferError
from tests.fakes import FakeSsh

MAC1 = RankHost(name="mac1", ssh="10.0.0.1", ips=("10.0.0.1",), python=sys.executable)
MAC2 = RankHost(name="mac2", ssh="10.0.0.2", ips=("10.0.0.2",), python=sys.executable)
HERE = RankHost(name="local", ssh="127.0.0.1", ips=("127.0.0.1",), python=sys.executable)


def job_on(*hosts: RankHost, **more) -> Job:
    return Job(hosts=hosts, backend="ring", python=sys.executable, **more)


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of what ranks import, to change without touching the checkout."""
    root = tmp_path / "tree"
    for name in code_files():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(package_root() / name, root / name)
    return root


@pytest.fixture
def hosts(tmp_path, hosts_run_by) -> dict[str, Path]:
    """Each remote host a HOME of its own here (the tests' one fake host,
    tests/fakes.py): its commands and streams run by sh with that HOME (what
    ssh would run there); rsync is not used (no ssh). By ssh address."""
    homes = {h.ssh: tmp_path / f"home-{h.name}" for h in (MAC1, MAC2)}
    hosts_run_by(FakeSsh.at({h.name: homes[h.ssh] for h in (MAC1, MAC2)}))
    return homes


def sync_recorded(job: Job) -> tuple[Job, list[object]]:
    events: list[object] = []
    return sync_code(job, dict(os.environ), events.append), events


def sent_to(events: list[object]) -> list[str]:
    return [e.host for e in events if isinstance(e, Sending)]


def notes(events: list[object]) -> list[str]:
    return [e.text for e in events if isinstance(e, Note)]


def test_the_files_are_the_rank_wrapper_and_reference_train_without_caches():
    names = code_files()
    assert set(RANK_WRAPPER_FILES) <= set(names)
    assert {"reference_train/__init__.py", "reference_train/train.py",
            "reference_train/configs/tiny.yaml"} <= set(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in names if n.startswith("mlxcluster/")
                and n not in RANK_WRAPPER_FILES + SERVE_RANK_FILES]  # the rest of mlxcluster stays here
    assert names == sorted(names)


def test_the_version_is_stable_and_changes_with_any_file(tree):
    first = code_manifest(tree)
    assert code_manifest(tree) == first  # the same files: the same version, twice
    assert code_manifest(package_root()).folder == first.folder  # a copy: the same version
    version = first.folder.rsplit("/", 1)[1]
    assert first.folder == f"{CACHE_ROOT}/{version}" and len(version) == 64
    assert first.source == str(tree)
    train = tree / "reference_train" / "train.py"
    train.write_text(train.read_text() + "# one line more\n")
    changed = code_manifest(tree)
    assert changed.folder != first.folder
    assert [f.name for f in changed.files if f not in first.files] == ["reference_train/train.py"]
    (tree / "reference_train" / "extra.py").write_text("")
    assert code_manifest(tree).folder not in (first.folder, changed.folder)
    (tree / "reference_train" / "__pycache__").mkdir(exist_ok=True)
    (tree / "reference_train" / "__pycache__" / "x.pyc").write_bytes(b"x")
    (tree / "reference_train" / ".hidden").write_text("x")
    assert code_manifest(tree).folder == code_manifest(tree).folder  # caches do not count
    assert "reference_train/.hidden" not in code_files(tree)


def test_a_job_on_this_machine_only_is_sent_nothing_and_imports_from_the_checkout(hosts):
    job = job_on(HERE, HERE)
    synced, events = sync_recorded(job)
    assert synced is job and events == []
    assert rank_env(synced)["PYTHONPATH"] == str(package_root())


def test_hosts_without_the_code_are_sent_it_once_and_the_ranks_import_it_there(hosts, tmp_path):
    job = job_on(MAC1, MAC2, env={"PYTHONPATH": "/srv/lib"})
    synced, events = sync_recorded(job)
    version = code_manifest().folder.rsplit("/", 1)[1]
    folders = {name: home / ".cache" / "mlxcluster" / "code" / version
               for name, home in hosts.items()}
    assert sent_to(events) == ["mac1", "mac2"]
    count = len(code_files())
    assert sum(f"sending {count} file(s)" in n for n in notes(events)) == 2, notes(events)
    for folder in folders.values():  # every file, byte for byte, in its version's folder
        assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                      if p.is_file()) == code_files()
        assert (folder / "reference_train/train.py").read_bytes() == \
            (package_root() / "reference_train/train.py").read_bytes()
    # Each host's own folder first on the ranks' PYTHONPATH (as the host names it), not this
    # checkout, then the job's own entries.
    assert synced.code_paths == (str(folders["10.0.0.1"]), str(folders["10.0.0.2"]))
    assert rank_env(synced)["PYTHONPATH"] == os.pathsep.join(
        [str(folders["10.0.0.1"]), str(folders["10.0.0.2"]), "/srv/lib"])
    argv = launcher_argv(synced, tmp_path / "hosts.json", ["-m", "x"])
    assert f"--env=PYTHONPATH={rank_env(synced)['PYTHONPATH']}" in argv
    # What a rank does there: the wrapper and the trainer (and its configs) import from that
    # folder, ahead of this venv's own install of the checkout.
    probe = ("import mlxcluster.jobs.rank_wrapper as w, reference_train.config as c; "
             "print(w.__file__); print(c.__file__); print((c.CONFIG_DIR / 'tiny.yaml').is_file())")
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={"PYTHONPATH": str(folders["10.0.0.2"])}, cwd=tmp_path, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [str(folders["10.0.0.2"] / "mlxcluster/jobs/rank_wrapper.py"),
                                  str(folders["10.0.0.2"] / "reference_train/config.py"), "True"]

    # The second launch: every host has this version, nothing is sent.
    again, events = sync_recorded(job)
    assert sent_to(events) == []
    assert [n for n in notes(events) if "sending" in n] == []
    assert sum(" has ~/.cache/mlxcluster/code/" in n for n in notes(events)) == 2, notes(events)
    assert again.code_paths == synced.code_paths


def test_a_changed_file_on_a_host_is_sent_alone(hosts):
    job = job_on(MAC1)
    synced, _ = sync_recorded(job)
    [folder] = synced.code_paths
    (Path(folder) / "reference_train/model.py").write_text("# damaged\n")
    _, events = sync_recorded(job)
    assert sent_to(events) == ["mac1"]
    assert [n for n in notes(events) if "sending" in n] == [
        f"code: mac1: {code_manifest().folder} reference_train/model.py size: sending 1 file(s), "
        f"{sync.human_bytes((package_root() / 'reference_train/model.py').stat().st_size)}"]
    assert (Path(folder) / "reference_train/model.py").read_bytes() == \
        (package_root() / "reference_train/model.py").read_bytes()


def test_a_job_with_ranks_here_and_on_hosts_imports_from_both(hosts, monkeypatch):
    job = job_on(HERE, MAC1)
    synced, events = sync_recorded(job)
    assert sent_to(events) == ["mac1"]  # this machine has the checkout
    assert synced.code_paths[-1] == str(package_root())
    assert synced.code_paths[0].startswith(str(hosts["10.0.0.1"]))
    assert code.code_paths(job, ["/a", "/a", "/b"]) == ("/a", "/b", str(package_root()))


def test_a_host_that_cannot_keep_the_code_is_named_with_no_way_round(hosts):
    hosts["10.0.0.1"].rmdir()
    hosts["10.0.0.1"].write_text("a file where the home should be")  # nothing can be made there
    with pytest.raises(TransferError) as failed:
        sync_recorded(job_on(MAC1))
    folder = code_manifest().folder.replace("~", str(hosts["10.0.0.1"]))  # as the host names it
    assert failed.value.message.startswith(f"sending {folder} to mac1 failed: ")
    assert failed.value.message.endswith("Not a directory: " f"'{hosts['10.0.0.1']}/.cache'")
    assert "check the host's disk and ssh" in failed.value.hint
    assert "--no-sync" not in failed.value.hint  # the ranks cannot go without it


def test_the_code_is_sent_before_the_preflight_unless_no_sync_code(monkeypatch):
    from mlxcluster.cli.job_launch import EventView
    from mlxcluster.launch import session
    from mlxcluster.launch.job_source import JobSource

    called: list[str] = []
    monkeypatch.setattr(session, "require_job_python", lambda job, env: called.append("python"))
    monkeypatch.setattr(code, "sync_code",
                        lambda job, env, on_event: called.append("code") or
                        Job(**{**job.__dict__, "code_paths": ("/c",)}))
    view = EventView("run")

    def request(send_code: bool) -> session.LaunchRequest:
        flags = session.LaunchFlags(JobSource(), preflight=False, send_code=send_code)
        return session.LaunchRequest(flags, "mlxrun")

    job, _ = session.prepare_job(job_on(MAC1), None, request(True), {}, view)
    assert called == ["python", "code"] and rank_env(job)["PYTHONPATH"] == "/c"
    called.clear()
    job, _ = session.prepare_job(job_on(MAC1), None, request(False), {}, view)
    assert called == ["python"] and rank_env(job)["PYTHONPATH"] == str(package_root())
    called.clear()
    session.prepare_job(job_on(HERE), None, request(True), {}, view)
    assert called == ["python"]  # ranks here only: nothing to send
