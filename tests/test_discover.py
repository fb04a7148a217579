"""``mlxcluster discover``: naming and inventory writing (pure), and in the
lab, real Bonjour responders inside the host namespaces found, probed over
SSH and written to an inventory that loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.discover import DiscoveredHost, discovered_inventory, inventory_name, inventory_yaml
from mlxcluster.inventory import load_inventory

RESPONDER = Path(__file__).with_name("mdns_responder.py")


def test_instance_names_become_inventory_names():
    assert inventory_name("Studio 1 (2)") == "studio-1-2"
    assert inventory_name("Jane’s MacBook Pro") == "jane-s-macbook-pro"
    assert inventory_name("!!!") == "host"


def test_written_inventory_loads_with_unique_names():
    hosts = [
        DiscoveredHost("Studio 1", "studio-1.local.", ["192.168.1.21"], 22, "Mac15,14"),
        DiscoveredHost("studio 1", "studio-1-2.local.", ["fe80::1", "192.168.1.22"], 2222, None),
        DiscoveredHost("Printer", None, [], None, None),  # no SSH: left out
    ]
    text = inventory_yaml(hosts, cluster="found", python="/opt/venv/bin/python", user="me")
    inv = discovered_inventory(hosts, cluster="found", python="/opt/venv/bin/python", user="me")
    assert "# Mac15,14" in text
    assert [(h.name, h.ssh, h.port, h.user) for h in inv.hosts] == [
        ("studio-1", "192.168.1.21", None, "me"), ("studio-1-2", "192.168.1.22", 2222, "me")]


@pytest.mark.lab
def test_discover_finds_probes_and_writes(lab3, tmp_path):
    announcing = lab3.hosts[:2]  # the third host stays silent
    responders = []
    try:
        for i, h in enumerate(announcing, start=1):
            proc = subprocess.Popen(
                ["ip", "netns", "exec", h.netns, sys.executable, str(RESPONDER), h.ip, f"Lab Host {i}",
                 f"Mac16,{i}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            responders.append(proc)
            assert proc.stdout.readline().strip() == "ready"
        out = tmp_path / "found.yaml"
        result = CliRunner().invoke(main, [
            "discover", "--interface", lab3.gateway, "--timeout", "2", "--python", lab3.python,
            "--user", "root", "--ssh-config", str(lab3.ssh_config), "--cluster", "found",
            "--write", str(out)])
    finally:
        for proc in responders:
            proc.stdin.close()
            proc.wait(timeout=10)
    assert result.exit_code == 0, result.output
    lines = {ln.split()[0]: ln for ln in result.output.splitlines() if ln.startswith("lab-host-")}
    assert sorted(lines) == ["lab-host-1", "lab-host-2"]
    for i, h in enumerate(announcing, start=1):
        row = lines[f"lab-host-{i}"]
        # address and model from Bonjour, hostname from the SSH probe
        assert h.ip in row and f"Mac16,{i}" in row and h.name in row and row.rstrip().endswith("ok")
    inv = load_inventory(out)
    assert [(h.name, h.ssh) for h in inv.hosts] == [("lab-host-1", announcing[0].ip),
                                                     ("lab-host-2", announcing[1].ip)]
    assert inv.python == lab3.python
