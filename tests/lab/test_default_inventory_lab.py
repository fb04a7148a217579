"""The commands as people type them, on three real hosts: `mlxcluster doctor`,
`mlxcluster hostfile generate --backend ring`, `mlxcluster smoke --backend
ring` with no -i, in a folder holding cluster.yaml (what `discover --write
cluster.yaml` leaves there), and again with $MLXCLUSTER_INVENTORY from
elsewhere. Run as a subprocess, as a shell runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import waits

pytestmark = pytest.mark.lab

MLXCLUSTER = [sys.executable, "-m", "mlxcluster"]


def mlxcluster(*args: str, cwd: Path, env: dict[str, str]):
    return waits.run([*MLXCLUSTER, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture
def folder(lab3, tmp_path):
    """A working folder with the lab's inventory as ./cluster.yaml, and the
    lab's environment with no user config folder inventory."""
    work = tmp_path / "work"
    work.mkdir()
    lab3.write_inventory(work / "cluster.yaml")
    env = lab3.env()
    env.pop("MLXCLUSTER_INVENTORY", None)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "no-config")
    return work, env


def test_doctor_generate_and_smoke_as_typed(lab3, folder):
    work, env = folder
    doctor = mlxcluster("doctor", "--json", cwd=work, env=env)
    assert "inventory: ./cluster.yaml (current directory)" in doctor.stderr
    report = json.loads(doctor.stdout)  # the notice stays off stdout
    checks = {c["id"]: c for c in report["checks"]}
    assert sorted(report["hosts"]) == sorted(h.name for h in lab3.hosts)
    assert checks["ssh-paramiko"]["status"] == "pass", checks["ssh-paramiko"]
    assert sorted(checks["ssh-paramiko"]["hosts"]) == sorted(h.name for h in lab3.hosts)

    generate = mlxcluster("hostfile", "generate", "--backend", "ring", cwd=work, env=env)
    assert generate.returncode == 0, generate.stderr
    assert "wrote hostfile-ring.json (3 hosts, backend ring)" in generate.stdout
    written = json.loads((work / "hostfile-ring.json").read_text())
    assert [h["ips"] for h in written["hosts"]] == [[h.ip] for h in lab3.hosts]
    again = mlxcluster("hostfile", "generate", "--backend", "ring", cwd=work, env=env)
    assert again.returncode == 2 and "already exists" in again.stderr

    smoke = mlxcluster("smoke", "--backend", "ring", "--sizes", "1K:2K", "--dtypes", "float32",
                       "--phase-timeout", "90", cwd=work, env=env)
    assert "inventory: ./cluster.yaml (current directory)" in smoke.stderr
    assert smoke.returncode == 0, smoke.stdout[-2000:] + smoke.stderr[-2000:]
    assert "smoke passed" in smoke.stdout and "3/3" in smoke.stdout


def test_the_environment_variable_names_an_inventory_elsewhere(lab3, folder, tmp_path):
    work, env = folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env["MLXCLUSTER_INVENTORY"] = str(work / "cluster.yaml")
    topology = mlxcluster("topology", "--json", cwd=elsewhere, env=env)
    assert f"inventory: {work / 'cluster.yaml'} ($MLXCLUSTER_INVENTORY)" in topology.stderr
    hosts = json.loads(topology.stdout)
    assert topology.returncode == 0, topology.stderr
    assert hosts  # the live hosts were probed (Linux: no Thunderbolt, but every host listed)
    assert all(h.name in topology.stdout for h in lab3.hosts)

    env.pop("MLXCLUSTER_INVENTORY")
    none = mlxcluster("doctor", cwd=elsewhere, env=env)
    assert none.returncode == 2
    assert "no inventory: none given and none found" in none.stderr
    assert "mlxcluster discover --write cluster.yaml" in none.stderr
    assert "Traceback" not in none.stderr


def test_live_doctor_writes_the_page(lab3, folder):
    """`mlxcluster doctor --html FILE` on live hosts (the default inventory):
    the page names every host and every check the live run made, and refers
    to nothing outside itself."""
    from tests.report_support import external_references

    work, env = folder
    doctor = mlxcluster("doctor", "--html", "doctor.html", "--json", cwd=work, env=env)
    report = json.loads(doctor.stdout)
    page = (work / "doctor.html").read_text()
    for host in lab3.hosts:
        assert host.name in page
    for check in report["checks"]:
        assert check["id"] in page
    assert external_references(page) == []
