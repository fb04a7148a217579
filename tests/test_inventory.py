"""Inventory loading and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxcluster.errors import EXIT_USAGE, InventoryError
from mlxcluster.inventory.inventory import load_inventory, local_inventory, parse_inventory

REPO = Path(__file__).resolve().parents[1]


def test_minimal_form_loads_exactly():
    inv = load_inventory(REPO / "inventory" / "minimal.yaml")
    assert inv.cluster == "lab"
    assert inv.python == "/opt/venv/bin/python"
    assert inv.ssh_config.endswith("/.ssh/config") and "~" not in inv.ssh_config
    (host,) = inv.hosts
    assert (host.name, host.ssh, host.ips, host.user, host.python) == (
        "studio-1", "studio-1.local", ("192.168.1.21",), "me", "/opt/venv/bin/python",
    )


def test_example_documents_every_field_and_loads(tmp_path):
    inv = load_inventory(REPO / "inventory" / "example.yaml")
    assert inv.names == ["studio-1", "studio-2", "mini-1"]
    s2 = inv.host("studio-2")
    assert s2.user == "admin" and s2.port == 2222 and s2.ips == ("192.168.1.22", "10.0.0.2")
    m1 = inv.host("mini-1")
    assert m1.python == "/opt/venv/bin/python" and m1.ips == ("192.168.1.23",)
    assert m1.env == {"MLX_METAL_FAST_SYNCH": "0", "MLX_IBV_DEVICES": "/Users/me/ibv.json"}
    # A per-host python is documented commented out (launches refuse it); as written, it loads.
    text = (REPO / "inventory" / "example.yaml").read_text()
    commented = "    # python: /Users/me/venv/bin/python"
    assert commented in text
    path = tmp_path / "python.yaml"
    path.write_text(text.replace(commented, commented.replace("# ", "", 1)))
    assert load_inventory(path).host("mini-1").python == "/Users/me/venv/bin/python"


def test_every_problem_reported_at_once_with_lines():
    text = (
        "cluster: lab\n"
        "python: relative/py\n"
        "hosts:\n"
        "  - name: a\n"
        "    ssh: 'a; rm -rf /'\n"
        "    ips: [1.2.3]\n"
        "    bogus: 1\n"
        "  - name: b\n"
        "    ssh: b\n"
        "    port: 99999\n"
        "  - name: b\n"
        "    ssh: c\n"
    )
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, "x.yaml")
    err = info.value
    assert err.exit_code == EXIT_USAGE
    joined = "\n".join(err.problems)
    assert "x.yaml:2:" in joined and "absolute path" in joined
    assert "x.yaml:5:" in joined and "shell characters" in joined
    assert "x.yaml:6:" in joined and "'1.2.3' is not an IP address" in joined
    assert "x.yaml:7:" in joined and "unknown field 'bogus'" in joined
    assert "x.yaml:10:" in joined and "port" in joined
    assert "x.yaml:11:" in joined and "used twice" in joined
    lines = [int(p.split(":")[1]) for p in err.problems]
    assert lines == sorted(lines)


@pytest.mark.parametrize(
    "target",
    ["$(reboot)", "a`id`", "host name", "-oProxyCommand=evil", "a|b", "a&b", "'q'"],
)
def test_shell_syntax_in_ssh_target_is_rejected(target):
    text = f"cluster: c\npython: /p\nhosts:\n  - name: h\n    ssh: {target!r}\n"
    with pytest.raises(InventoryError, match="ssh"):
        parse_inventory(text)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("- a\n- b\n", "must be a mapping"),
        ("cluster: c\npython: /p\n", "'hosts' is missing"),
        ("cluster: c\npython: /p\nhosts: []\n", "non-empty list"),
        ("cluster: c\nhosts:\n  - {name: a, ssh: a}\n", "'python' is missing"),
        ("cluster: [c\n", "not valid YAML"),
        ("cluster: c\npython: /p\nenv: {1BAD: x}\nhosts:\n  - {name: a, ssh: a}\n", "environment variable"),
    ],
)
def test_structural_problems(text, needle):
    with pytest.raises(InventoryError) as info:
        parse_inventory(text)
    assert needle in str(info.value)


def test_missing_file_is_an_inventory_error(tmp_path):
    with pytest.raises(InventoryError, match="file not found"):
        load_inventory(tmp_path / "nope.yaml")


def test_local_inventory_repeats_loopback():
    inv = local_inventory(3, python="/usr/bin/python3")
    assert [h.ssh for h in inv.hosts] == ["127.0.0.1"] * 3
    assert len(set(inv.names)) == 3
    with pytest.raises(InventoryError):
        local_inventory(0)


def test_an_ipv6_zone_must_be_an_interface_name():
    """ipaddress accepts any text after '%'; an inventory IP must not carry shell syntax."""
    base = "cluster: c\npython: /v/bin/python\nhosts:\n  - {name: a, ssh: a, ips: [%s]}\n"
    assert parse_inventory(base % "'fe80::1%en5'").hosts[0].ips == ("fe80::1%en5",)
    with pytest.raises(InventoryError, match=r"is not an IP address"):
        parse_inventory(base % "'fe80::1%$(id)'")
