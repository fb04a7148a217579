"""The commands as people type them: no -i, the default inventory is found
(-i, $MLXCLUSTER_INVENTORY, ./cluster.yaml, the user config folder), named in
the output, and its absence explained with the places looked at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.doctor.request import DoctorRequest, request_inventory
from mlxcluster.errors import InputError
from mlxcluster.inventory.inventory_search import find_inventory, user_config_inventory

INVENTORY = """cluster: {name}
python: /opt/venv/bin/python
hosts:
  - name: a
    ssh: 192.0.2.1
    ips: [192.0.2.1]
  - name: b
    ssh: 192.0.2.2
    ips: [192.0.2.2]
"""


def write(path: Path, name: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(INVENTORY.format(name=name))
    return path


@pytest.fixture
def places(tmp_path, monkeypatch):
    """A working folder and a user config folder, both empty."""
    work = tmp_path / "work"
    work.mkdir()
    config = tmp_path / "config"
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    return work, config / "mlxcluster" / "cluster.yaml"


def test_search_order(places, monkeypatch, tmp_path):
    work, user = places
    write(user, "from-user")
    assert find_inventory(None).source == "user config folder"
    write(work / "cluster.yaml", "from-cwd")
    choice = find_inventory(None)
    assert (choice.source, choice.path) == ("current directory", Path("cluster.yaml"))
    assert choice.describe() == "inventory: ./cluster.yaml (current directory)"
    env_file = write(tmp_path / "elsewhere" / "inv.yaml", "from-env")
    monkeypatch.setenv("MLXCLUSTER_INVENTORY", str(env_file))
    assert find_inventory(None).path == env_file
    assert find_inventory("given.yaml").source == "-i"  # -i wins even when it does not exist


def test_doctor_chooses_and_loads_its_inventory_in_the_library(places, tmp_path):
    """doctor's CLI only shows the note; which inventory a request runs on is
    mlxcluster/doctor/request.py's ``request_inventory``."""
    work, user = places
    write(user, "from-user")
    notes = []
    assert request_inventory(DoctorRequest(), notes.append).cluster == "from-user"
    assert notes == [f"inventory: {user} (user config folder)"]
    given = write(tmp_path / "given.yaml", "given")
    assert request_inventory(DoctorRequest(inventory_path=str(given)), notes.append).cluster == "given"
    assert request_inventory(DoctorRequest(shared_path="/nas"), notes.append).cluster == "from-user"
    for nothing in (DoctorRequest(local=True), DoctorRequest(from_dir="captures"),
                    DoctorRequest(undo_path="journal.json")):
        assert request_inventory(nothing, notes.append) is None
    assert request_inventory(DoctorRequest(from_dir="captures", inventory_path=str(given)),
                             notes.append).cluster == "given"
    assert len(notes) == 2  # the default one named each time it was used, -i never
    user.unlink()
    with pytest.raises(InputError, match="no inventory") as none:
        request_inventory(DoctorRequest(), notes.append)
    assert "--from DIR to replay captures, or --local" in none.value.hint


def test_env_naming_a_missing_file_is_an_error_not_a_fallthrough(places, monkeypatch):
    work, _ = places
    write(work / "cluster.yaml", "from-cwd")
    monkeypatch.setenv("MLXCLUSTER_INVENTORY", "/nonexistent/inv.yaml")
    with pytest.raises(InputError) as err:
        find_inventory(None)
    assert "MLXCLUSTER_INVENTORY names /nonexistent/inv.yaml" in err.value.message


def test_none_found_lists_every_place_and_the_command_that_writes_one(places):
    _, user = places
    with pytest.raises(InputError) as err:
        find_inventory(None)
    assert "./cluster.yaml" in err.value.message and str(user) in err.value.message
    assert "$MLXCLUSTER_INVENTORY (not set)" in err.value.message
    assert "mlxcluster discover --write cluster.yaml" in err.value.hint


def test_user_config_folder_follows_xdg_then_home():
    assert user_config_inventory({"XDG_CONFIG_HOME": "/x/cfg", "HOME": "/h"}) == Path(
        "/x/cfg/mlxcluster/cluster.yaml")
    # A relative XDG_CONFIG_HOME is invalid by the spec and ignored.
    assert user_config_inventory({"XDG_CONFIG_HOME": "rel", "HOME": "/h"}) == Path(
        "/h/.config/mlxcluster/cluster.yaml")
    assert user_config_inventory({"HOME": "/h"}) == Path("/h/.config/mlxcluster/cluster.yaml")


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("command", [
    ("doctor",), ("topology",), ("hostfile", "generate", "--backend", "ring"),
    ("smoke", "--backend", "ring"), ("train", "--config", "tiny"),
])
def test_every_command_explains_a_missing_inventory(places, command):
    result = run(*command)
    assert result.exit_code == 2, result.output
    assert "no inventory: none given and none found" in result.output
    assert "mlxcluster discover --write cluster.yaml" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", [
    ("doctor",), ("topology",), ("hostfile", "generate", "--backend", "ring"),
    ("smoke", "--backend", "ring"), ("train", "--config", "tiny"),
])
def test_every_command_reads_the_default_inventory(places, command):
    """An invalid ./cluster.yaml is reported by every command: each loaded it.
    (The commands that reach hosts are run on the lab: tests/lab/test_default_inventory_lab.py.)"""
    work, _ = places
    (work / "cluster.yaml").write_text("cluster: c\npython: relative/python\nhosts: []\n")
    result = run(*command)
    assert result.exit_code == 2, result.output
    assert "inventory: ./cluster.yaml (current directory)" in result.output
    assert "inventory cluster.yaml is invalid" in result.output


def test_hostfile_generate_writes_a_default_name_and_never_overwrites(places, monkeypatch):
    work, user = places
    write(user, "from-user")
    result = run("hostfile", "generate", "--backend", "ring")
    assert result.exit_code == 0, result.output
    assert "inventory: " + str(user) + " (user config folder)" in result.output
    assert "wrote hostfile-ring.json (2 hosts, backend ring)" in result.output
    written = json.loads((work / "hostfile-ring.json").read_text())
    assert [h["ips"] for h in written["hosts"]] == [["192.0.2.1"], ["192.0.2.2"]]

    (work / "hostfile-ring.json").write_text("mine")
    again = run("hostfile", "generate", "--backend", "ring")
    assert again.exit_code == 2 and "hostfile-ring.json already exists" in again.output
    assert "--force" in again.output
    assert (work / "hostfile-ring.json").read_text() == "mine"  # nothing lost
    forced = run("hostfile", "generate", "--backend", "ring", "--force")
    assert forced.exit_code == 0 and json.loads((work / "hostfile-ring.json").read_text())["hosts"]


def test_hostfile_generate_mpi_default_names_and_stdout(places):
    work, user = places
    write(user, "from-user")
    result = run("hostfile", "generate", "--backend", "mpi", "--mpi-libname", "/v/lib/libmpi.so")
    assert result.exit_code == 0, result.output
    assert "wrote hostfile-mpi.txt and hostfile-mpi.txt.args" in result.output
    assert (work / "hostfile-mpi.txt").read_text().splitlines() == ["192.0.2.1 slots=1", "192.0.2.2 slots=1"]
    assert "btl_tcp_links" in (work / "hostfile-mpi.txt.args").read_text()
    printed = run("hostfile", "generate", "--backend", "ring", "-o", "-")
    assert printed.exit_code == 0
    assert json.loads(printed.stdout)["backend"] == "ring"
    assert not (work / "hostfile-ring.json").exists()


def test_an_explicit_inventory_is_not_announced(places, tmp_path):
    inv = write(tmp_path / "mine.yaml", "mine")
    result = run("hostfile", "generate", "-i", str(inv), "--backend", "ring", "-o", "-")
    assert result.exit_code == 0
    assert "inventory:" not in result.output  # the user typed it; stdout is the file alone
