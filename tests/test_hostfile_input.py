"""Hostile hostfiles and what `hostfile check` may claim: every bad file is a
HostfileError (exit 2), never a traceback; "ok" only when every host that
was to be checked against the cluster was."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlxcluster.capture import HostCapture
from mlxcluster.cli import main
from mlxcluster.errors import EXIT_USAGE, HostfileError
from mlxcluster.hostfile import (
    MlxHostfile,
    MpiHost,
    load_hostfile,
    load_mlx_hostfile,
    parse_mpi_hostfile,
)

RING = {"backend": "ring", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]}
INVENTORY = """cluster: t
python: /v/bin/python
hosts:
  - {name: mbp, ssh: mbp.local, ips: [10.0.0.1]}
  - {name: studio, ssh: studio.local, ips: [10.0.0.2]}
"""
IFCONFIG = ("en0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500\n"
            "\tinet {ip} netmask 0xffffff00 broadcast 10.0.0.255\n")


def cli(*args):
    return CliRunner().invoke(main, ["hostfile", *args])


def load_error(tmp_path, data: bytes | str) -> HostfileError:
    path = tmp_path / "h"
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    with pytest.raises(HostfileError) as info:
        load_hostfile(path)
    assert info.value.exit_code == EXIT_USAGE
    r = cli("check", str(path))
    assert r.exit_code == 2 and "Traceback" not in r.output and isinstance(r.exception, SystemExit), r.output
    return info.value


@pytest.mark.parametrize("data, needle", [
    (b"a slots=1\nb slots=1 max_slots=\xff\n", "line 2 is not UTF-8 text (byte 0xff"),
    (bytes(range(0x80, 0x100)) * 8, "line 1 is not UTF-8 text"),
    (b'{"hosts": [{"ssh": "\xc3"}]}', "not UTF-8 text"),
])
def test_binary_or_non_utf8_hostfile(tmp_path, data, needle):
    assert needle in load_error(tmp_path, data).message


def test_deep_json_is_a_hostfile_error(tmp_path):
    assert "nests too deeply" in load_error(tmp_path, "[" * 200_000).message


@pytest.mark.parametrize("line", ["a slots=²", "a slots=٣", "a slots=1 garbage here", "a b",
                                  "a slots=1 port=22", "a slots=1 slots=2", "a slots=2 max_slots=1",
                                  "a slots=0", "a slots=99999999999999999999999", "a slots=" + "9" * 5000])
def test_mpi_lines_open_mpi_would_refuse(tmp_path, line):
    err = load_error(tmp_path, line + "\n")
    assert "line 1: expected 'host slots=N'" in err.message


def test_mpi_lines_open_mpi_reads():
    path_text = "# cluster\na slots=2 max_slots=4\nb\tslots = 1   # trailing comment\nc\n\nme@d slots=3\n"
    assert parse_mpi_hostfile(path_text) == (MpiHost("a", 2), MpiHost("b", 1), MpiHost("c", 1),
                                             MpiHost("me@d", 3))


@pytest.mark.parametrize("text", ['"just a string"\n', "5\n", "null\n", "[1, 2"])
def test_json_is_never_reread_as_an_mpi_hostfile(tmp_path, text):
    err = load_error(tmp_path, text)
    assert not err.message.startswith("MPI hostfile"), err.message


def test_json_with_a_utf8_bom_is_json(tmp_path):
    path = tmp_path / "h.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(RING).encode())
    hf = load_hostfile(path)
    assert isinstance(hf, MlxHostfile) and [h.ssh for h in hf.hosts] == ["a", "b"]
    assert load_mlx_hostfile(path) == hf  # the smoke / train path too
    assert cli("check", str(path)).exit_code == 0


def test_long_values_are_cut_in_messages(tmp_path):
    err = load_error(tmp_path, json.dumps({"backend": "x" * 100_000, "hosts": [{"ssh": "-" + "y" * 100_000}]}))
    assert len(err.message) < 600 and "xxx..." in err.message and "yyy..." in err.message


# ---- item: `check -i` / `--from` claims "ok" only for what it checked ----------------


@pytest.fixture
def ring(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    hf = tmp_path / "ring.json"
    r = cli("generate", "-i", str(inv), "--backend", "ring", "-o", str(hf))
    assert r.exit_code == 0, r.output
    return inv, hf


def test_check_from_dir_with_no_matching_capture_is_not_ok(ring, tmp_path):
    inv, hf = ring
    caps = tmp_path / "caps"
    (caps / "other").mkdir(parents=True)
    (caps / "other" / "ifconfig.txt").write_text(IFCONFIG.format(ip="10.0.0.9"))
    r = cli("check", str(hf), "--from", str(caps))
    assert r.exit_code == 1, r.output
    assert "ok:" not in r.output
    assert "mbp.local: no capture folder named 'mbp.local'" in r.output and "studio.local:" in r.output
    r = cli("check", str(hf), "-i", str(inv), "--from", str(caps))
    assert r.exit_code == 1 and "ok:" not in r.output
    assert "mbp.local: no capture of mbp" in r.output and "studio.local: no capture of studio" in r.output


def test_check_from_dir_names_the_hosts_it_could_not_check(ring, tmp_path):
    inv, hf = ring
    caps = tmp_path / "caps"
    (caps / "mbp").mkdir(parents=True)
    (caps / "mbp" / "ifconfig.txt").write_text(IFCONFIG.format(ip="10.0.0.1"))
    (caps / "studio").mkdir()
    (caps / "studio" / "sw_vers.txt").write_text("ProductVersion: 15.0\n")
    r = cli("check", str(hf), "-i", str(inv), "--from", str(caps))
    assert r.exit_code == 1 and "ok:" not in r.output
    assert "checked: mbp.local" in r.output
    assert "studio.local: its ifconfig.txt capture is missing" in r.output
    (caps / "studio" / "ifconfig.txt").write_text(IFCONFIG.format(ip="10.0.0.2"))
    r = cli("check", str(hf), "-i", str(inv), "--from", str(caps))
    assert r.exit_code == 0 and r.output.startswith("ok: "), r.output


def test_check_against_live_hosts_that_cannot_be_probed_is_not_ok(ring, monkeypatch):
    inv, hf = ring
    monkeypatch.setattr("mlxcluster.cli.hostfile.collect_captures", lambda inventory: {
        "mbp": HostCapture("mbp", {"ifconfig.txt": IFCONFIG.format(ip="10.0.0.1")}),
        "studio": HostCapture("studio", error="ssh studio.local: connection refused"),
    })
    r = cli("check", str(hf), "-i", str(inv))
    assert r.exit_code == 1 and "ok:" not in r.output
    assert "studio.local: studio could not be probed: ssh studio.local: connection refused" in r.output
