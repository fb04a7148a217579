"""doctor --fix's inventory edit: one env variable set, every other byte kept."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from mlxcluster.doctor.fixes.inventory_edit import set_env
from mlxcluster.errors import InputError
from mlxcluster.inventory.inventory import parse_inventory

EXAMPLE = (Path(__file__).resolve().parents[1] / "inventory" / "example.yaml").read_text()


def added_lines(before: str, after: str) -> tuple[list[str], list[str]]:
    """(lines removed, lines added) between two texts."""
    diff = list(difflib.ndiff(before.splitlines(keepends=True), after.splitlines(keepends=True)))
    return ([d[2:] for d in diff if d.startswith("- ")], [d[2:] for d in diff if d.startswith("+ ")])


def test_a_host_without_env_gets_one_and_nothing_else_changes():
    after = set_env(EXAMPLE, "studio-2", "MLX_MPI_LIBNAME", "/opt/lib/libmpi.40.dylib")
    removed, added = added_lines(EXAMPLE, after)
    assert removed == []
    assert added == ["    env:\n", '      MLX_MPI_LIBNAME: "/opt/lib/libmpi.40.dylib"\n']
    # Right after studio-2's last line (its port, with its comment), before mini-1.
    assert after.index("port: 2222") < after.index("MLX_MPI_LIBNAME") < after.index("name: mini-1")
    inv = parse_inventory(after)
    assert inv.host("studio-2").env["MLX_MPI_LIBNAME"] == "/opt/lib/libmpi.40.dylib"
    assert "MLX_MPI_LIBNAME" not in inv.host("studio-1").env


def test_the_cluster_env_and_a_host_env_gain_a_line_in_their_indentation():
    after = set_env(EXAMPLE, None, "LD_PRELOAD", "/usr/lib/libopenblas.so.0")
    assert added_lines(EXAMPLE, after) == ([], ['  LD_PRELOAD: "/usr/lib/libopenblas.so.0"\n'])
    assert all(h.env["LD_PRELOAD"] == "/usr/lib/libopenblas.so.0" for h in parse_inventory(after).hosts)
    after = set_env(EXAMPLE, "mini-1", "LD_PRELOAD", "/x.so")
    assert added_lines(EXAMPLE, after) == ([], ['      LD_PRELOAD: "/x.so"\n'])


def test_a_key_already_there_has_only_its_value_replaced_and_twice_is_once():
    once = set_env(EXAMPLE, "mini-1", "MLX_IBV_DEVICES", "/new.json")
    removed, added = added_lines(EXAMPLE, once)
    assert removed == ["      MLX_IBV_DEVICES: /Users/me/ibv.json\n"]
    assert added == ['      MLX_IBV_DEVICES: "/new.json"\n']
    assert set_env(once, "mini-1", "MLX_IBV_DEVICES", "/new.json") == once
    fresh = set_env(EXAMPLE, "studio-1", "K", "v")
    assert set_env(fresh, "studio-1", "K", "v") == fresh


def test_no_cluster_env_goes_before_the_hosts_and_flow_styles_stay_flow():
    text = ("cluster: c  # mine\npython: /p\n\nhosts:\n  - {name: a, ssh: h}\n"
            "  - name: b\n    ssh: c\n    env: {X: '1'}\n")
    after = set_env(text, None, "Z", "3")
    assert after == "cluster: c  # mine\npython: /p\n\nenv:\n  Z: \"3\"\nhosts:\n  - {name: a, ssh: h}\n" \
                    "  - name: b\n    ssh: c\n    env: {X: '1'}\n"
    after = set_env(set_env(text, "a", "Y", "2"), "b", "Y", "2")
    assert "  - {name: a, ssh: h, env: {Y: \"2\"}}\n" in after
    assert "    env: {X: '1', Y: \"2\"}\n" in after
    inv = parse_inventory(after)
    assert inv.host("a").env == {"Y": "2"} and inv.host("b").env == {"X": "1", "Y": "2"}


def test_the_cluster_env_goes_above_the_comments_that_describe_the_hosts():
    text = "cluster: c\npython: /p\n\n# the Macs on the desk\n  # two of them\nhosts:\n  - {name: a, ssh: h}\n"
    after = set_env(text, None, "Z", "3")
    assert after == ("cluster: c\npython: /p\n\nenv:\n  Z: \"3\"\n# the Macs on the desk\n  # two of them\n"
                     "hosts:\n  - {name: a, ssh: h}\n")
    # comments that open the file are its header: they stay first
    assert set_env("# mine\nhosts: []\n", None, "Z", "3") == "# mine\nenv:\n  Z: \"3\"\nhosts: []\n"


def test_crlf_and_a_last_line_without_newline():
    text = "cluster: c\r\npython: /p\r\nhosts:\r\n  - name: a\r\n    ssh: h"
    after = set_env(text, "a", "K", "v")
    assert after == "cluster: c\r\npython: /p\r\nhosts:\r\n  - name: a\r\n    ssh: h\r\n    env:\r\n      K: \"v\"\r\n"
    assert parse_inventory(after).host("a").env == {"K": "v"}


def test_an_empty_env_is_filled():
    text = "cluster: c\npython: /p\nenv:   # later\nhosts:\n  - name: a\n    ssh: h\n"
    after = set_env(text, None, "K", "v")
    assert after == "cluster: c\npython: /p\nenv:   # later\n  K: \"v\"\nhosts:\n  - name: a\n    ssh: h\n"


def test_an_unknown_host_is_an_input_error():
    with pytest.raises(InputError, match="no host named nope"):
        set_env(EXAMPLE, "nope", "K", "v")
