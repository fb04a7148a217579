"""Discovery: joining DNS-SD records and rendering inventories (pure), and
the `discover` command with its Bonjour browse replaced."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.inventory.discovery import (
    DEVICE_INFO_SERVICE,
    SSH_SERVICE,
    DiscoveredHost,
    ServiceRecord,
    inventory_name,
    merge_records,
    render_inventory,
)
from mlxcluster.inventory.inventory import parse_inventory


def records():
    return [
        ServiceRecord(SSH_SERVICE, "Studio 1", "studio-1.local.", ("fe80::1", "192.168.1.21"), 22),
        ServiceRecord(DEVICE_INFO_SERVICE, "Studio 1", "studio-1.local.", ("192.168.1.21",), 0,
                      {"model": "Mac15,14"}),
        ServiceRecord(DEVICE_INFO_SERVICE, "Air", "air.local.", ("192.168.1.40",), 0,
                      {"model": "Mac14,2"}),
        ServiceRecord(SSH_SERVICE, "mini", "mini.local.", ("192.168.1.30",), 2222),
    ]


def test_records_of_one_machine_are_joined():
    hosts = merge_records(records())
    assert [h.name for h in hosts] == ["Air", "mini", "Studio 1"]
    studio = hosts[2]
    assert studio.model == "Mac15,14" and studio.ssh_port == 22 and studio.is_mac
    assert studio.addresses == ("192.168.1.21", "fe80::1")  # IPv4 first
    assert studio.ssh_target == "studio-1.local"
    air = hosts[0]
    assert air.ssh_port is None and air.is_mac
    assert hosts[1].model is None and not hosts[1].is_mac


def test_rendered_inventory_loads_and_skips_hosts_without_ssh():
    text = render_inventory(merge_records(records()), cluster="home", python="/opt/v/bin/python",
                            user="me")
    inv = parse_inventory(text)
    assert inv.names == ["mini", "Studio-1"]
    assert inv.host("mini").port == 2222 and inv.host("mini").ips == ("192.168.1.30",)
    assert inv.host("Studio-1").ips == ("192.168.1.21",)


def test_inventory_names_are_safe_and_unique():
    assert inventory_name("Rick's M4 Max Studio") == "Rick-s-M4-Max-Studio"
    assert inventory_name("$(reboot)") == "reboot"
    twins = merge_records([
        ServiceRecord(SSH_SERVICE, "a b", "x.local.", ("10.0.0.1",), 22),
        ServiceRecord(SSH_SERVICE, "a-b", "y.local.", ("10.0.0.2",), 22),
    ])
    inv = parse_inventory(render_inventory(twins, cluster="c", python="/p"))
    assert sorted(inv.names) == ["a-b", "a-b-2"]


# ---- `discover` flags and --write: checked before the browse -----------------------------
# The browse is Bonjour multicast: never run here; the CLI is driven with it replaced.

STUDIO = DiscoveredHost(name="Studio One", hostname="studio-one.local", addresses=("10.0.0.11",),
                        ssh_port=22, model="Mac15,14", ssh_banner="SSH-2.0-x")


@pytest.fixture
def discover(monkeypatch, tmp_path):
    browsed = []

    def fake_browse(**kwargs):
        browsed.append(kwargs)
        return [STUDIO]

    monkeypatch.setattr("mlxcluster.cli.discover.browse", fake_browse)
    monkeypatch.setattr("mlxcluster.cli.discover.probe_ssh", lambda hosts: hosts)
    monkeypatch.chdir(tmp_path)

    def run(*args):
        browsed.clear()
        result = CliRunner().invoke(main, ["discover", *args])
        assert "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        return result, bool(browsed)

    return run


@pytest.mark.parametrize("args, needle", [
    (["--python", "relative/py"], "--python 'relative/py' is not an absolute path"),
    (["--cluster", "bad name"], "--cluster 'bad name' is not a plain name"),
    (["--user", "a b"], "--user 'a b' is not a user name"),
    (["--write", "nodir/x.yaml"], "folder nodir does not exist"),
    (["--write", "existing.yaml"], "existing.yaml already exists"),
    (["--write", ""], "the output path is empty"),
])
def test_bad_flags_are_named_before_the_browse(discover, tmp_path, args, needle):
    (tmp_path / "existing.yaml").write_text("# hand-edited\n")
    result, browsed = discover("--python", "/opt/venv/bin/python", *args)
    assert result.exit_code == 2 and needle in result.output, result.output
    assert not browsed
    assert (tmp_path / "existing.yaml").read_text() == "# hand-edited\n"


def test_write_refuses_an_existing_file_unless_force(discover, tmp_path):
    (tmp_path / "cluster.yaml").write_text("# hand-edited\n")
    result, _ = discover("--write", "cluster.yaml", "--python", "/opt/venv/bin/python")
    assert result.exit_code == 2 and "pass --force" in result.output
    result, browsed = discover("--write", "cluster.yaml", "--python", "/opt/venv/bin/python", "--force")
    assert result.exit_code == 0 and browsed, result.output
    assert parse_inventory((tmp_path / "cluster.yaml").read_text()).names == ["Studio-One"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml"]  # no temp file left


def test_write_new_file(discover, tmp_path):
    result, browsed = discover("--write", "new.yaml", "--python", "/opt/venv/bin/python", "--cluster", "lab")
    assert result.exit_code == 0 and browsed and "wrote new.yaml" in result.output
    assert parse_inventory((tmp_path / "new.yaml").read_text()).cluster == "lab"
