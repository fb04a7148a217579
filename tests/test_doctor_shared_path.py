"""`doctor --shared-path DIR`: which hosts see one DIR, from tokens each writes and the
others look for. The hosts are folders here (tests.fakes.FakeSsh.local: each its own
HOME, every command run by sh on this machine), so their tokens are real files:
an absolute path is one folder for all of them, ~/runs one per host; real hosts
in tests/lab/test_shared_storage_lab.py."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.cli.doctor import render_shared_path
from mlxcluster.doctor.shared_path import HERE, find_shared_path
from mlxcluster.inventory.inventory import Host, Inventory, parse_inventory
from reference_train.storage import STORAGE_DIR
from tests.fakes import FakeSsh, result, run_hosts_by
from tests.inventory_support import inventory_text

INVENTORY = Inventory("test", "python3", tuple(Host(f"mac{i}", f"10.0.0.{i}") for i in (1, 2, 3)))


def everything_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_folder_every_host_and_this_machine_see_is_one(tmp_path):
    ssh = FakeSsh.local(tmp_path / "homes", INVENTORY)
    nas = tmp_path / "nas"
    nas.mkdir()
    report = find_shared_path(INVENTORY, str(nas), ssh)
    assert report.folders == [["mac1", "mac2", "mac3", HERE]] and report.failed == {}
    assert report.shared() == report.folders
    assert list(nas.iterdir()) == []  # tokens and their folder removed
    lines = [text for text, _ in render_shared_path(report, 3)]
    assert f"[✓] one folder: mac1, mac2, mac3, {HERE}" in lines
    assert lines[-1] == f"✓ shared storage: mac1, mac2, mac3, {HERE} see one {nas}"


def test_a_home_folder_is_each_hosts_own_and_what_doctor_made_is_removed(tmp_path):
    ssh = FakeSsh.local(tmp_path / "homes", INVENTORY)
    before = everything_under(tmp_path / "homes")
    report = find_shared_path(INVENTORY, "~/runs/a b", ssh)  # a space, quoted on the hosts
    assert report.folders == [["mac1"], ["mac2"], ["mac3"]] and report.shared() == []
    assert everything_under(tmp_path / "homes") == before  # runs/a b made, then removed
    lines = [text for text, _ in render_shared_path(report, 3)]
    assert "[✓] its own folder: mac2" in lines
    assert lines[-1] == "✓ no shared storage: each host has its own ~/runs/a b"


def test_two_hosts_on_a_nas_and_one_on_its_own_disk(tmp_path):
    ssh = FakeSsh.local(tmp_path / "homes", INVENTORY)
    nas = tmp_path / "nas"
    nas.mkdir()
    for host in ("mac1", "mac3"):
        (tmp_path / "homes" / host / "runs").symlink_to(nas)
    report = find_shared_path(INVENTORY, "~/runs", ssh)
    assert report.folders == [["mac1", "mac3"], ["mac2"]]
    assert not (nas / STORAGE_DIR).exists()


class OneHostDown(FakeSsh):
    def run(self, alias, command, **kwargs):
        if alias == "10.0.0.2":
            return result(stderr="ssh: connect to host 10.0.0.2 port 22: Connection refused\n",
                          exit_status=255)
        return super().run(alias, command, **kwargs)


def test_a_host_that_cannot_be_asked_is_named_and_the_others_compared(tmp_path):
    ssh = OneHostDown.local(tmp_path / "homes", INVENTORY)
    nas = tmp_path / "nas"
    nas.mkdir()
    report = find_shared_path(INVENTORY, str(nas), ssh, here=False)
    assert report.folders == [["mac1", "mac3"]]
    assert "Connection refused" in report.failed["mac2"]
    lines = [text for text, _ in render_shared_path(report, 3)]
    assert "[✗] mac2: not asked: ssh: connect to host 10.0.0.2 port 22: Connection refused" in lines
    assert lines[-1].startswith("✗ 1 host(s) could not be asked; shared storage: mac1, mac3")


def test_the_command_prints_json_and_exits_1_when_a_host_cannot_be_asked(tmp_path, monkeypatch):
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text(inventory_text(["mac1", "mac2", "mac3"], subnet="10.0.0", data_ips=False))
    hosts = parse_inventory(inventory.read_text(), source=str(inventory))
    nas = tmp_path / "nas"
    nas.mkdir()
    run_hosts_by(monkeypatch, FakeSsh.local(tmp_path / "homes0", hosts))  # doctor's own connections
    result = CliRunner().invoke(main, ["doctor", "-i", str(inventory), "--shared-path", str(nas),
                                       "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "path": str(nas), "folders": [["mac1", "mac2", "mac3", HERE]],
        "shared": [["mac1", "mac2", "mac3", HERE]], "failed": {}}

    run_hosts_by(monkeypatch, OneHostDown.local(tmp_path / "homes1", hosts))
    result = CliRunner().invoke(main, ["doctor", "-i", str(inventory), "--shared-path", str(nas)])
    assert result.exit_code == 1, result.output
    assert "[✗] mac2: not asked: " in result.output

    run_hosts_by(monkeypatch, FakeSsh(default=None))  # refused before any host is asked
    result = CliRunner().invoke(main, ["doctor", "-i", str(inventory), "--shared-path", str(nas),
                                       "--fix"])
    assert result.exit_code == 2
    assert "--shared-path asks the hosts one question; it excludes --fix" in result.output
