"""Folders sent to the hosts (--data, --init_from, the code) and storage several
of them see: a host that sees this machine's folder, or the folder of a host
already sent to, is sent nothing (a token each, written in the folder and
looked for by the others). The hosts here are HOMEs on this machine reached
through the real host-side script (transfer/agent.py) instead of ssh, as in
tests/test_code_sync.py; one filesystem, so an absolute path is one folder for
all, and links under the HOMEs make a NAS two of them share."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlxcluster.jobs.events import Note, Sending
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.jobs.job import Job
from mlxcluster.launch.sync import read_manifest, send_where_needed
from mlxcluster.transfer import agent
from mlxcluster.transfer.manifest import folder_manifest
from reference_train.prepare import prepare_offline
from reference_train.storage import STORAGE_DIR
from tests.fakes import FakeSsh

HOSTS = tuple(RankHost(name=f"mac{i}", ssh=f"10.0.0.{i}", ips=(f"10.0.0.{i}",),
                       python=sys.executable) for i in (1, 2, 3))


@pytest.fixture
def homes(tmp_path, hosts_run_by) -> dict[str, Path]:
    """Each host a HOME of its own here; its commands and streams run by sh with that HOME."""
    homes = {h.name: tmp_path / f"home-{h.name}" for h in HOSTS}
    hosts_run_by(FakeSsh.at(homes))  # the tests' one fake host (tests/fakes.py): no ssh, no rsync
    return homes


def synced(manifest, what: str = "data") -> tuple[list[str], list[str]]:
    """(the hosts sent to, the notes) of one send_where_needed."""
    events: list[object] = []
    send_where_needed(Job(hosts=HOSTS, backend="ring", python=sys.executable), manifest, what,
                      dict(os.environ), events.append)
    return ([e.host for e in events if isinstance(e, Sending)],
            [e.text for e in events if isinstance(e, Note)])


def test_hosts_that_see_this_machines_data_folder_are_sent_nothing(homes, tmp_path):
    data = tmp_path / "nas" / "data"
    prepare_offline(data, n_stories=40)
    before = sorted(p.name for p in data.iterdir())
    sent, notes = synced(read_manifest(data))
    assert sent == []
    assert notes == [f"data: {h.name} sees {data} here, one folder with this machine's (shared "
                     "storage): nothing sent" for h in HOSTS]
    assert sorted(p.name for p in data.iterdir()) == before  # no token left


def test_a_folder_two_hosts_share_is_sent_once_and_checked_once_after(homes, tmp_path):
    here = tmp_path / "here" / "model"
    here.mkdir(parents=True)
    (here / "config.json").write_text('{"model_type": "llama"}\n')
    (here / "model.safetensors").write_bytes(os.urandom(4096))
    nas = tmp_path / "nas"
    nas.mkdir()
    for host in ("mac1", "mac3"):  # their ~/models is one NAS folder; mac2's is its own disk
        (homes[host] / "models").symlink_to(nas)
    manifest = replace(folder_manifest(here), folder="~/models/m", source=str(here))

    sent, notes = synced(manifest, "model")
    assert sent == ["mac1", "mac2"]
    assert ("model: mac3 sees the same ~/models/m as mac1, one folder (shared storage): sent "
            "there, nothing sent again") in notes, notes
    for folder in (nas / "m", homes["mac2"] / "models" / "m"):
        assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
        assert (folder / "model.safetensors").read_bytes() == (here / "model.safetensors").read_bytes()

    sent, notes = synced(manifest, "model")  # again: whole everywhere
    assert sent == []
    assert ("model: mac3 sees the same ~/models/m as mac1, one folder (shared storage): whole "
            "there, nothing sent again") in notes, notes
    assert not (nas / "m" / STORAGE_DIR).exists() and list(here.iterdir()) != []
    assert not (here / STORAGE_DIR).exists()


def test_the_host_script_names_the_token_folder_as_the_trainer_does():
    assert agent.STORAGE_DIR == STORAGE_DIR
