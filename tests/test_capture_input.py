"""Capture folders as input (``--from DIR``) and output (``--collect DIR``):
what is a host, what is ignored, what is refused up front."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlxcluster import capture as C
from mlxcluster.cli import main
from mlxcluster.errors import InputError
from tests.topology_helpers import OMLX, make_capture_dir


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def _with_phantoms(root):
    """What unzipping on a Mac adds (__MACOSX/<host>/._file), a hidden folder with a capture
    file, a folder of notes, an empty folder."""
    (root / "__MACOSX" / "mbp").mkdir(parents=True)
    (root / "__MACOSX" / "mbp" / f"._{C.THUNDERBOLT}").write_bytes(b"\x00\x05\x16\x07Mac OS X")
    (root / "__MACOSX" / "mbp" / C.SW_VERS).write_text("ProductName: macOS\n")
    (root / ".old" / "gone").mkdir(parents=True)
    (root / ".old" / C.SW_VERS).write_text("ProductName: macOS\n")
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("cabled on Monday")
    (root / "empty").mkdir()
    return root


def test_phantom_folders_are_not_hosts(macos_fixtures, tmp_path):
    root = _with_phantoms(make_capture_dir(macos_fixtures, tmp_path / "c", OMLX))
    folder = C.read_capture_dir(root)
    assert list(folder.captures) == ["mbp", "studio"]
    assert folder.ignored == {".old": "hidden", "__MACOSX": "macOS archive metadata",
                              "empty": "no capture file", "notes": "no capture file"}
    assert list(C.load_capture_dir(root)) == ["mbp", "studio"]


def test_doctor_and_topology_show_no_phantom_host(macos_fixtures, tmp_path):
    """Was: __MACOSX, notes and empty became hosts (with every cable to them 'missing')."""
    root = _with_phantoms(make_capture_dir(macos_fixtures, tmp_path / "c", OMLX))
    doc = json.loads(invoke("doctor", "--from", str(root), "--json").stdout)
    assert list(doc["hosts"]) == ["mbp", "studio"]
    text = invoke("doctor", "--from", str(root)).output
    assert ("ignored (not hosts): .old/ (hidden), __MACOSX/ (macOS archive metadata), empty/ (no capture file), "
            "notes/ (no capture file)") in text
    topo = invoke("topology", "--from", str(root), "--json")
    assert topo.exit_code == 0, topo.output
    data = json.loads(topo.stdout)
    assert list(data["hosts"]) == ["mbp", "studio"] and data["full_mesh"] is True
    assert "note: ignored (not hosts): .old/ (hidden), __MACOSX/" in topo.stderr


def test_a_folder_of_only_phantoms_is_an_input_error(tmp_path):
    _with_phantoms(tmp_path)
    with pytest.raises(InputError, match="holds no capture files"):
        C.load_capture_dir(tmp_path)
