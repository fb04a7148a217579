"""Capture folders as input (``--from DIR``) and output (``--collect DIR``):
what is a host, what is ignored, what is refused up front."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.errors import InputError
from mlxcluster.facts import capture as C
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


@pytest.fixture
def no_probe(monkeypatch):
    """doctor --local must not run: the input is refused before any host is probed."""
    def probed(**kwargs):
        raise AssertionError("a host was probed before the --collect folder was checked")
    monkeypatch.setattr("mlxcluster.doctor.request.run_local_doctor", probed)


@pytest.mark.parametrize("make, message", [
    (lambda t: t / "afile" / "sub", "cannot save captures in {}: Not a directory"),
    (lambda t: t / "old", "cannot save captures in {}: it is not empty (local-0, notes.txt, otherhost)"),
])
def test_collect_folder_is_checked_before_probing(tmp_path, no_probe, make, message):
    (tmp_path / "afile").write_text("")
    for host in ("local-0", "otherhost"):  # a capture of another cluster, left behind
        (tmp_path / "old" / host).mkdir(parents=True)
        (tmp_path / "old" / host / C.PROBE).write_text("{}")
    (tmp_path / "old" / "notes.txt").write_text("")
    target = make(tmp_path)
    result = invoke("doctor", "--local", "--collect", str(target))
    assert result.exit_code == 2, result.output
    assert message.format(target) in result.output
    assert "fix: pass a" in result.output and "Traceback" not in result.output


def test_collect_into_a_new_or_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    assert C.prepare_capture_dir(tmp_path / "empty") == tmp_path / "empty"
    assert C.prepare_capture_dir(tmp_path / "a" / "b").is_dir()  # created, parents too
    assert list((tmp_path / "a" / "b").iterdir()) == []  # the write test leaves nothing behind


def _fake_run(tmp_path, in_the_way):
    """A doctor --local run during which something takes the place of a capture file."""
    from mlxcluster.doctor.doctor import replay_doctor

    def run(**kwargs):
        in_the_way()
        return replay_doctor({"local-0": C.HostCapture("local-0", {C.PROBE: '{"hostname": "h"}'})})
    return run


@pytest.mark.parametrize("in_the_way, why", [
    (lambda d: (d / "local-0").write_text("a file"), "File exists"),
    (lambda d: (d / "local-0" / C.PROBE).mkdir(parents=True), "Is a directory"),
])
def test_a_failed_save_is_an_error_after_the_report(tmp_path, monkeypatch, in_the_way, why):
    """Was: a traceback (FileExistsError / IsADirectoryError) and no report at all."""
    target = tmp_path / "cap"
    monkeypatch.setattr("mlxcluster.doctor.request.run_local_doctor", _fake_run(tmp_path, lambda: in_the_way(target)))
    result = invoke("doctor", "--local", "--collect", str(target))
    assert result.exit_code == 1, result.output
    assert "mlxcluster doctor:" in result.output and "[hostnames-unique]" in result.output  # the report
    assert f"error: could not save the captures in {target}: {target}/local-0" in result.output
    assert why in result.output and "Traceback" not in result.output
    assert "raw outputs saved" not in result.output


def test_save_never_writes_outside_the_folder(tmp_path):
    with pytest.raises(ValueError):
        C.save_capture_dir({"h": C.HostCapture("h", {"../x": "y"})}, tmp_path)
