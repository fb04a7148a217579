"""`mlxcluster topology -i` probes live hosts through the doctor's collector."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main

pytestmark = pytest.mark.lab


def test_live_topology_of_linux_hosts_has_no_thunderbolt(lab3, tmp_path):
    inv = lab3.write_inventory(tmp_path / "inv.yaml")
    result = CliRunner().invoke(main, ["topology", "-i", str(inv), "--json"])
    assert result.exit_code == 0, result.output
    topo = json.loads(result.output)
    assert sorted(topo["hosts"]) == ["labhost1", "labhost2", "labhost3"]
    assert all(h["ports"] == [] for h in topo["hosts"].values())
    assert topo["links"] == [] and topo["ring"] is None and topo["full_mesh"] is False

    lab3.link_down(2)
    try:
        result = CliRunner().invoke(main, ["topology", "-i", str(inv)])
    finally:
        lab3.heal(2)
    assert result.exit_code == 1, result.output
    assert "error: labhost3 could not be probed" in result.output
