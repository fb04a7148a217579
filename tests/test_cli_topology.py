"""``mlxcluster topology`` through click's runner, on assembled capture dirs."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.facts import capture as C
from mlxcluster.facts.capture import load_capture_dir
from mlxcluster.inventory.inventory import parse_inventory
from tests.conftest import require
from tests.fakes import FakeSsh
from tests.topology_helpers import MACCLUSTER, OMLX, make_capture_dir


def run(*args):
    return CliRunner().invoke(main, ["topology", *args], catch_exceptions=False)


def test_json_output(macos_fixtures, tmp_path):
    d = make_capture_dir(macos_fixtures, tmp_path / "c", OMLX)
    result = run("--from", str(d), "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert set(data) == {"hosts", "links", "ring", "full_mesh"}
    assert data["links"] == [{"a": "mbp", "a_interface": "en1", "b": "studio",
                              "b_interface": "en3", "speed_gbps": 80.0, "matched_by": "uuid"}]
    assert data["ring"] == ["mbp", "studio"] and data["full_mesh"] is True
    assert set(data["hosts"]["mbp"]) == {"ports", "rdma_devices", "bridge_holds_thunderbolt"}
    assert set(data["hosts"]["mbp"]["ports"][0]) == {
        "receptacle", "interface", "connected", "speed_gbps", "peer", "via", "devices", "ipv4", "rdma_active"}


def test_text_output(macos_fixtures, tmp_path):
    d = make_capture_dir(macos_fixtures, tmp_path / "c", OMLX)
    out = run("--from", str(d)).output
    assert "mbp en1 <-> studio en3  80 Gb/s  (uuid)" in out
    assert "receptacle 4  en5    connected 80 Gb/s   [Envoy Ultra]" in out
    assert "ring: mbp -> studio -> mbp" in out and "full mesh: yes" in out


def test_dot_marks_missing_and_unmatched(macos_fixtures, tmp_path):
    d = make_capture_dir(macos_fixtures, tmp_path / "c", MACCLUSTER)
    out = run("--from", str(d), "--dot").output
    assert out.startswith("graph mlxcluster {")
    assert '"mbp" -- "mini" [label="missing", style=dotted, color="grey"];' in out
    assert '"mbp:en2" [shape=note, style=dashed, label="Mac mini (Mac16,11)\\nnot matched to a host"];' in out
    text = run("--from", str(d)).output
    assert "ring: none through all hosts" in text and "full mesh: no" in text


def test_dot_marks_slow_cable(macos_fixtures, tmp_path):
    from mlxcluster.topology.topology import Link, Topology
    from mlxcluster.topology.topology_dot import to_dot
    t = Topology({}, (Link("a", "en1", "b", "en2", 80.0, "uuid"),
                      Link("a", "en3", "b", "en4", 40.0, "inferred")), ("a", "b"), True)
    dot = to_dot(t)
    assert '"a" -- "b" [label="en1 - en2\\n80 Gb/s"];' in dot
    assert '"a" -- "b" [label="en3 - en4\\n40 Gb/s (inferred) slow", color="orange"];' in dot


def test_png(macos_fixtures, tmp_path):
    require(shutil.which("dot") is not None, "graphviz dot not installed")
    d = make_capture_dir(macos_fixtures, tmp_path / "c", OMLX)
    png = tmp_path / "t.png"
    result = run("--from", str(d), "--png", str(png))
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_graphviz(macos_fixtures, tmp_path, monkeypatch):
    d = make_capture_dir(macos_fixtures, tmp_path / "c", OMLX)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    result = run("--from", str(d), "--png", str(tmp_path / "t.png"))
    assert result.exit_code == 2  # what to install: not "backend unavailable" (3)
    assert "graphviz 'dot' is not installed" in result.output


def test_bad_usage(tmp_path):
    assert run().exit_code == 2
    assert run("--from", str(tmp_path), "-i", "x.yaml").exit_code == 2
    result = run("--from", str(tmp_path / "nope"))
    assert result.exit_code == 2 and "does not exist" in result.output


def test_live_uses_doctor_collector(macos_fixtures, tmp_path, hosts_run_by):
    """The hosts answer doctor's probe with real Macs' outputs (the one fake host)."""
    d = make_capture_dir(macos_fixtures, tmp_path / "c", OMLX)
    inv = tmp_path / "cluster.yaml"
    inv.write_text("cluster: c\npython: /usr/bin/python3\nhosts:\n  - {name: mbp, ssh: mbp}\n"
                   "  - {name: studio, ssh: studio}\n")
    fake = hosts_run_by(FakeSsh.probed(parse_inventory(inv.read_text()), load_capture_dir(d)))
    result = run("-i", str(inv), "--json")
    assert result.exit_code == 0 and sorted(h for h, _ in fake.calls) == ["mbp", "studio"]
    assert json.loads(result.output)["ring"] == ["mbp", "studio"]


def _items_is_a_number(host, file_name, text):
    """SPThunderboltDataType[0]._items = 5 on the MacBook Pro (a wrong-shaped capture)."""
    if host != "mbp" or file_name != C.THUNDERBOLT:
        return text
    data = json.loads(text)
    data["SPThunderboltDataType"][0]["_items"] = 5
    return json.dumps(data)


def test_wrong_shaped_thunderbolt_json_does_not_crash(macos_fixtures, tmp_path):
    d = make_capture_dir(macos_fixtures, tmp_path / "c", OMLX, edit=_items_is_a_number)
    result = run("--from", str(d), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["hosts"]["mbp"]["ports"]
    inv = tmp_path / "cluster.yaml"
    inv.write_text("cluster: c\npython: /usr/bin/python3\nhosts:\n  - {name: mbp, ssh: mbp}\n"
                   "  - {name: studio, ssh: studio}\n")
    gen = CliRunner().invoke(main, ["hostfile", "generate", "-i", str(inv), "--backend", "jaccl",
                                    "--from", str(d), "-o", "-"])  # never ./hostfile-jaccl.json
    assert not isinstance(gen.exception, TypeError), gen.output
    assert "Traceback" not in gen.output


def test_corrupt_thunderbolt_capture_is_named_not_shown_as_unknown(macos_fixtures, tmp_path):
    d = make_capture_dir(macos_fixtures, tmp_path / "c", OMLX)
    broken = d / "mbp" / C.THUNDERBOLT
    broken.write_text('{"SPThunderboltDataType": ')
    result = run("--from", str(d))
    assert result.exit_code == 1, result.output
    assert "mbp  (thunderbolt: unreadable;" in result.output
    assert f"error: mbp: {broken} is unreadable (not valid JSON (" in result.output
    assert "studio  (thunderbolt: ok;" in result.output  # the readable host is still shown
    assert json.loads(run("--from", str(d), "--json").stdout)["hosts"]["mbp"]["ports"] == []


def test_png_to_a_bad_path_is_an_input_error_before_any_work(macos_fixtures, tmp_path, monkeypatch):
    """Was: exit 1 after the work, 'graphviz dot failed ... run with --dot'."""
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/dot")  # graphviz is not what is wrong
    monkeypatch.setattr("mlxcluster.cli.topology.read_capture_dir",
                        lambda path: pytest.fail("captures read before the --png path was checked"))
    (tmp_path / "afolder").mkdir()
    for bad, why in ((tmp_path / "nodir" / "x.png", f"the folder {tmp_path / 'nodir'} does not exist"),
                     (tmp_path / "afolder", "is a directory")):
        result = run("--from", str(tmp_path), "--png", str(bad))
        assert result.exit_code == 2, result.output
        assert why in result.output and "run with --dot" not in result.output
    result = run("--from", str(tmp_path), "--png", str(tmp_path / "nodir" / "x.png"))
    assert f"error: cannot write the PNG to {tmp_path / 'nodir' / 'x.png'}" in result.output
    assert "fix: create it first (mkdir -p" in result.output
