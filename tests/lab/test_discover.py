"""`mlxcluster discover` against real mDNS responders inside lab hosts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.inventory.inventory import load_inventory

pytestmark = pytest.mark.lab
HERE = Path(__file__).resolve().parent


def test_discover_finds_macs_and_writes_inventory(lab3, tmp_path):
    published = [("Studio One", "Mac15,14"), ("mini-2", "Mac16,11"), ("printer", "-")]
    lab3.set_host_python(1, "/nonexistent/python")  # mini-2 lacks the cluster's python
    responders = []
    try:
        for host, (instance, model) in zip(lab3.hosts, published, strict=True):
            proc = subprocess.Popen(
                ["ip", "netns", "exec", host.netns, sys.executable, str(HERE / "mdns_publish.py"),
                 instance, host.ip, model, "30"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            responders.append(proc)
        for proc in responders:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        out = tmp_path / "found.yaml"
        result = CliRunner().invoke(main, [
            "discover", "--timeout", "3", "--interface", lab3.gateway, "--write", str(out),
            "--cluster", "found", "--python", lab3.python, "--user", "root",
            "--probe", "--ssh-config", str(lab3.ssh_config)])
    finally:
        lab3.heal(1)
        for proc in responders:
            proc.kill()
            proc.wait(5)
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines()[2:] if line.strip()}
    assert "Mac15,14" in result.output and "Mac16,11" in result.output
    # each host's real sshd answered the banner probe
    assert result.output.count("SSH-2.0-OpenSSH") == 3, result.output
    assert "Studio" in lines and lab3.hosts[0].ip in lines["Studio"]
    # --probe logged in and ran doctor's probe: real hostnames and mlx versions
    import mlx.core as mx

    assert "labhost1" in lines["Studio"] and mx.__version__ in lines["Studio"]
    assert "labhost3" in lines["printer"] and mx.__version__ in lines["printer"]
    assert "not probed" in lines["mini-2"]
    inv = load_inventory(out)
    assert inv.cluster == "found" and inv.user == "root" and inv.ssh_config == str(lab3.ssh_config)
    by_name = {h.name: h for h in inv.hosts}
    assert set(by_name) == {"Studio-One", "mini-2", "printer"}
    assert by_name["Studio-One"].ssh == "studio-one.local"
    assert by_name["Studio-One"].ips == (lab3.hosts[0].ip,)
    assert by_name["mini-2"].ips == (lab3.hosts[1].ip,)
