"""--pipeline's model sync (launch/sync.sync_model with left_out): a later stage's
hosts take the files an earlier stage's host holds too from it (take_held), and
each file is read (sha256) once on each host in a run, not once by the take's
check and again by the send's. Logic only: the checks, takes and sends are
recorded fakes here; tests/lab/test_pipeline_lab.py and test_serve_split_lab.py
run the real ones over the lab's hosts."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from mlxcluster.jobs.events import Note
from mlxcluster.jobs.hosts import RankHost, host_link
from mlxcluster.jobs.job import Job
from mlxcluster.launch import sync
from mlxcluster.transfer.send import HostCopy

HOSTS = tuple(RankHost(name=f"mac{i}", ssh=f"10.0.0.{i}", ips=(f"10.0.0.{i}",),
                       python=sys.executable) for i in (1, 2))
# mac1 runs stage 1 (a and the shared shard), mac2 stage 2 (b and the shared shard)
LEFT_OUT = {"mac1": frozenset({"b.safetensors"}), "mac2": frozenset({"a.safetensors"})}


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    for name, size in [("config.json", 900), ("a.safetensors", 3000), ("b.safetensors", 5000),
                       ("shared.safetensors", 7000)]:
        (folder / name).write_bytes(bytes([len(name)]) * size)
    return folder


def synced(monkeypatch, model, whole_on=None, takes_fail=False):
    """(the files each check read on each host, what each host was sent from here, the
    notes) of one sync_model, every host lacking everything but `whole_on`
    (host -> file names whole there)."""
    whole_on = whole_on or {}
    read, sent_here = Counter(), {}

    def check_copy(manifest, host, env=None, **asked):
        for f in manifest.files:
            read[(host.name, f.name)] += 1
        status = {f.name: "ok" if f.name in whole_on.get(host.name, ()) else "missing"
                  for f in manifest.files}
        return HostCopy(host_link(host, env), status, free=1 << 40, rsync=True)

    def take_from(manifest, source, ip, takers, what, shown, on_event, then=""):
        return list(takers) if takes_fail else []

    def send_from_here(manifest, copy, what, shown, on_event):
        sent_here[copy.host.name] = sorted(f.name for f in copy.lacking(manifest))

    monkeypatch.setattr(sync, "check_copy", check_copy)
    monkeypatch.setattr(sync, "mark_host", lambda *a, **k: False)  # no shared storage here
    monkeypatch.setattr(sync, "take_from", take_from)
    monkeypatch.setattr(sync, "send_from_here", send_from_here)
    events = []
    sync.sync_model(Job(hosts=HOSTS, backend="ring", python=sys.executable), str(model), {},
                    events.append, left_out=LEFT_OUT)
    return read, sent_here, [e.text for e in events if isinstance(e, Note)]


def test_a_file_a_later_stage_takes_from_an_earlier_host_is_read_once_there(monkeypatch, model):
    read, sent_here, notes = synced(monkeypatch, model)
    assert sent_here == {"mac1": ["a.safetensors", "config.json", "shared.safetensors"],
                         "mac2": ["b.safetensors"]}  # the shared two came from mac1
    assert any("mac2 takes the 2 file(s) mac1 holds too (7.9 KB) from mac1 over 10.0.0.1"
               in n for n in notes), notes
    assert max(read.values()) == 1, read  # each file read once on each host
    assert set(read) == {("mac1", "a.safetensors"), ("mac1", "config.json"),
                         ("mac1", "shared.safetensors"), ("mac2", "config.json"),
                         ("mac2", "shared.safetensors"), ("mac2", "b.safetensors")}


def test_the_plan_counts_only_what_the_taking_host_lacks(monkeypatch, model):
    _, sent_here, notes = synced(monkeypatch, model, whole_on={"mac2": {"config.json"}})
    assert any("mac2 takes the 1 file(s) mac1 holds too (7.0 KB)" in n for n in notes), notes
    assert sent_here["mac2"] == ["b.safetensors"]


def test_files_a_take_failed_to_bring_are_checked_again_and_sent_from_here(monkeypatch, model):
    read, sent_here, _ = synced(monkeypatch, model, takes_fail=True)
    assert sent_here["mac2"] == ["b.safetensors", "config.json", "shared.safetensors"]
    assert read[("mac2", "shared.safetensors")] == 2  # what arrived of it is looked at again
