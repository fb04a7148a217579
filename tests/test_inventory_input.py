"""Hostile inventory files: every one is an InventoryError (exit 2) naming the
file and line, never a traceback, and messages show the user's values, cut
short."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.errors import EXIT_USAGE, InventoryError
from mlxcluster.inventory.inventory import load_inventory, parse_inventory, parse_ip, ssh_target_ok

HEAD = "cluster: lab\npython: /v/bin/python\n"


def load_problems(tmp_path, data: bytes | str) -> list[str]:
    path = tmp_path / "inv.yaml"
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert info.value.exit_code == EXIT_USAGE
    return info.value.problems


@pytest.mark.parametrize("data, line, needle", [
    (HEAD.encode() + b"hosts:\n  - name: \xff\xfe\n    ssh: a\n", 4, "not UTF-8 text (byte 0xff"),
    (bytes(range(0x80, 0x100)) * 4, 1, "not UTF-8 text"),
    (b"cluster: a\x01\n", 1, "control character #x0001"),
])
def test_binary_or_non_utf8_file_names_file_and_line(tmp_path, data, line, needle):
    (problem,) = load_problems(tmp_path, data)
    assert problem.startswith(f"{tmp_path / 'inv.yaml'}:{line}: ") and needle in problem


@pytest.mark.parametrize("text, line, needle", [
    (HEAD + "[a, b]: 1\nhosts:\n  - {name: a, ssh: a}\n", 3, "top level: a field name must be a plain name, got ['a', 'b']"),
    (HEAD + "hosts:\n  - {name: a, ssh: a, {x: 1}: 2}\n", 4, "hosts[0]: a field name must be a plain name, got {'x': 1}"),
    (HEAD + "env: {[a]: 1}\nhosts:\n  - {name: a, ssh: a}\n", 3, "env: a field name must be a plain name, got ['a']"),
    (HEAD + "hosts: " + "[" * 5000 + "]" * 5000 + "\n", 3, "nest more than 16 levels"),
])
def test_non_scalar_keys_and_deep_nesting_are_problems(tmp_path, text, line, needle):
    problems = load_problems(tmp_path, text)
    assert any(p.startswith(f"{tmp_path / 'inv.yaml'}:{line}: ") and needle in p for p in problems), problems


def test_bad_inventories_exit_2_without_traceback(tmp_path):
    for i, data in enumerate([b"\x88\xd6\xcd\xcc" * 50, (HEAD + "[a, b]: 1\n").encode(),
                              (HEAD + "hosts: " + "[" * 3000).encode()]):
        path = tmp_path / f"bad{i}.yaml"
        path.write_bytes(data)
        r = CliRunner().invoke(main, ["hostfile", "generate", "-i", str(path), "--backend", "ring"])
        assert r.exit_code == 2, r.output
        assert f"inventory {path} is invalid" in r.output and "Traceback" not in r.output
        assert isinstance(r.exception, SystemExit), r.exception


def test_messages_show_the_users_value_not_parser_nodes():
    text = HEAD + "hosts:\n  - name: a\n    ssh: a\n    ips: [[1, 2], {a: 1}, 1]\n    port: [1]\n"
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, "x.yaml")
    joined = "\n".join(info.value.problems)
    assert "Node" not in joined
    assert "x.yaml:6: hosts[0].ips: [1, 2] is not an IP address" in joined
    assert "hosts[0].ips: {'a': 1} is not an IP address" in joined
    assert "x.yaml:7: hosts[0].port must be a TCP port number 1-65535, got [1]" in joined


def test_long_values_are_cut_in_messages():
    text = HEAD + "hosts:\n  - name: a\n    ssh: " + "a" * 100_000 + "\n"
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, "x.yaml")
    assert len(str(info.value)) < 400
    assert "'" + "a" * 79 + "..." in str(info.value)


def test_duplicate_keys_are_problems_not_last_wins():
    text = ("cluster: lab\ncluster: other\npython: /v/bin/python\nenv: {A: 1, A: 2}\n"
            "hosts:\n  - name: a\n    ssh: a\n    port: 22\n    port: 23\n")
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, "x.yaml")
    assert info.value.problems == [
        "x.yaml:2: top level: 'cluster' is given twice (first at line 1); keep one",
        "x.yaml:4: env: 'A' is given twice (first at line 4); keep one",
        "x.yaml:9: hosts[0]: 'port' is given twice (first at line 8); keep one",
    ]


@pytest.mark.parametrize("port", ["2_2", "' 22 '", "'+22'", "0x16", "22.0", "'٢٢'", "'２２'", "0", "65536"])
def test_port_must_be_plain_decimal(port):
    with pytest.raises(InventoryError, match=r"port must be a TCP port number"):
        parse_inventory(HEAD + f"hosts:\n  - {{name: a, ssh: a, port: {port}}}\n")


@pytest.mark.parametrize("port", ["22", "'2222'", "65535"])
def test_plain_decimal_ports_load(port):
    assert parse_inventory(HEAD + f"hosts:\n  - {{name: a, ssh: a, port: {port}}}\n").hosts[0].port == int(
        port.strip("'"))


def test_ssh_config_that_is_a_directory_is_named_as_one(tmp_path):
    problems = load_problems(tmp_path, HEAD + f"ssh_config: {tmp_path}\nhosts:\n  - {{name: a, ssh: a}}\n")
    assert problems == [f"{tmp_path / 'inv.yaml'}:3: 'ssh_config' = '{tmp_path}' is a directory, "
                        "not an OpenSSH config file (e.g. ~/.ssh/config)"]


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + (HEAD + "hosts:\n  - {name: a, ssh: a}\n").encode())
    assert load_inventory(path).cluster == "lab"


@pytest.mark.parametrize("field", ["cluster", "python", "name", "ssh", "user"])
def test_a_trailing_newline_does_not_pass_a_pattern(field):
    """'$' matches before a final newline; a quoted "a\\n" must not pass as a name."""
    values = {"cluster": "lab", "python": "/v/bin/python", "name": "a", "ssh": "a", "user": "me"}
    values[field] += "\\n"
    text = (f'cluster: "{values["cluster"]}"\npython: "{values["python"]}"\nhosts:\n'
            f'  - {{name: "{values["name"]}", ssh: "{values["ssh"]}", user: "{values["user"]}"}}\n')
    with pytest.raises(InventoryError, match=field):
        parse_inventory(text)
    assert not ssh_target_ok("mac1\n") and parse_ip("fe80::1%en0\n") is None
