"""Hostile hostfiles and what `hostfile check` may claim: every bad file is a
HostfileError (exit 2), never a traceback; "ok" only when every host that
was to be checked against the cluster was."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.errors import EXIT_USAGE, HostfileError
from mlxcluster.facts.capture import HostCapture
from mlxcluster.hostfile.hostfile import (
    MlxHostfile,
    MpiHost,
    load_hostfile,
    load_mlx_hostfile,
    parse_mpi_hostfile,
)
from mlxcluster.inventory.inventory import parse_inventory
from tests.fakes import FakeSsh
from tests.topology_helpers import OMLX, make_capture_dir

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
    assert f"IPs and RDMA devices match the captures in {caps}" in r.output
    mpi = tmp_path / "hosts"
    mpi.write_text("mbp.local slots=1\nstudio.local slots=1\n")
    r = cli("check", str(mpi), "-i", str(inv), "--from", str(caps))
    assert r.exit_code == 0 and "it lists no IPs or RDMA devices to compare" in r.output, r.output


def test_check_against_live_hosts_that_cannot_be_probed_is_not_ok(ring, hosts_run_by):
    inv, hf = ring
    hosts_run_by(FakeSsh.probed(parse_inventory(inv.read_text()), {
        "mbp": HostCapture("mbp", {"ifconfig.txt": IFCONFIG.format(ip="10.0.0.1")}),
        "studio": HostCapture("studio", error="ssh studio.local: connection refused"),
    }))
    r = cli("check", str(hf), "-i", str(inv))
    assert r.exit_code == 1 and "ok:" not in r.output
    assert "studio.local: studio could not be probed: ssh studio.local: connection refused" in r.output


# ---- `hostfile generate` writes only what `hostfile check` accepts --------------------

GENERATE_INVENTORIES = {
    "two-hosts": INVENTORY,
    "local-ranks": "cluster: l\npython: /v/bin/python\nhosts:\n"
                   "  - {name: l0, ssh: 127.0.0.1, ips: [127.0.0.1]}\n  - {name: l1, ssh: 127.0.0.1, ips: [127.0.0.1]}\n",
    "ip-targets-no-ips": "cluster: n\npython: /v/bin/python\nhosts:\n"
                         "  - {name: a, ssh: 10.0.0.5}\n  - {name: b, ssh: 10.0.0.6}\n",
    "names-no-ips": "cluster: n\npython: /v/bin/python\nhosts:\n  - {name: a, ssh: a}\n  - {name: b, ssh: b}\n",
    "same-target-twice": "cluster: n\npython: /v/bin/python\nhosts:\n"
                         "  - {name: a, ssh: mac1, ips: [10.0.0.1]}\n  - {name: b, ssh: mac1, ips: [10.0.0.2]}\n",
}
GENERATE_ARGS = {
    "ring": ["--backend", "ring"],
    "nccl": ["--backend", "nccl"],
    "mpi": ["--backend", "mpi", "--mpi-libname", "/v/lib/libmpi.so"],
    "mpi-mlx": ["--backend", "mpi", "--format", "mlx", "--mpi-libname", "/v/lib/libmpi.so"],
}


@pytest.mark.parametrize("inventory", sorted(GENERATE_INVENTORIES))
@pytest.mark.parametrize("backend", sorted(GENERATE_ARGS))
def test_generate_then_check_round_trips(tmp_path, inventory, backend):
    """Either generate refuses (exit 2/3, nothing written) or `check` accepts what it wrote."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(GENERATE_INVENTORIES[inventory])
    out = tmp_path / "hf"
    r = cli("generate", "-i", str(inv), *GENERATE_ARGS[backend], "-o", str(out))
    assert "Traceback" not in r.output
    if r.exit_code != 0:
        assert r.exit_code in (2, 3) and isinstance(r.exception, SystemExit), r.output
        assert not out.exists() and not (tmp_path / "hf.args").exists()
        return
    checked = cli("check", str(out))
    assert checked.exit_code == 0 and checked.output.startswith("ok: "), (r.output, checked.output)


def test_jaccl_generated_from_captures_passes_check(macos_fixtures, tmp_path):
    caps = make_capture_dir(macos_fixtures, tmp_path / "cap", OMLX)
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    for backend in ("jaccl", "jaccl-ring", "ring"):
        out = tmp_path / f"{backend}.json"
        r = cli("generate", "-i", str(inv), "--backend", backend, "--from", str(caps), "--plan-ips", "-o", str(out))
        assert r.exit_code == 0, r.output
        assert cli("check", str(out)).exit_code == 0


def test_nccl_without_an_ip_for_rank_0_is_refused_at_generate(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(GENERATE_INVENTORIES["names-no-ips"])
    r = cli("generate", "-i", str(inv), "--backend", "nccl")
    assert r.exit_code == 2 and "a: rank 0 needs an IP (the coordinator address)" in r.output
    assert '"backend"' not in r.output  # nothing printed as a hostfile


@pytest.mark.parametrize("env", ["BAD NAME=1", "1X=y", "NOEQUALS", "=v", "A-B=1", "A=line\nbreak"])
def test_env_flag_is_validated_before_anything_runs(tmp_path, env):
    r = cli("generate", "-i", str(tmp_path / "missing.yaml"), "--backend", "ring", "--env", env)
    assert r.exit_code == 2 and "--env" in r.output, r.output
    assert "file not found" not in r.output  # checked before the inventory is read


@pytest.mark.parametrize("flag, value", [
    ("--if-include", "; rm -rf /"), ("--if-include", "en0, en1"), ("--if-include", ""),
    ("--if-include", "10.0.0.0/33"), ("--if-include", "$(id)"),
    ("--mpi-libname", "relative lib.so"), ("--mpi-libname", "libmpi.so"), ("--mpi-libname", "/a b/libmpi.so"),
])
def test_mpi_flags_are_validated(tmp_path, flag, value):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    r = cli("generate", "-i", str(inv), "--backend", "mpi", flag, value, "-o", str(tmp_path / "h"))
    assert r.exit_code == 2 and flag in r.output, r.output
    assert not (tmp_path / "h").exists()


def test_good_mpi_flags_are_used(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    r = cli("generate", "-i", str(inv), "--backend", "mpi", "--if-include", "en5,192.168.0.0/16,lo",
            "--mpi-libname", "/v/lib/libmpi.so", "-o", str(tmp_path / "h"))
    assert r.exit_code == 0, r.output
    assert "btl_tcp_if_include en5,192.168.0.0/16,lo" in (tmp_path / "h.args").read_text()


# ---- outputs: never the input, never half-written --------------------------------------


def test_output_that_is_the_inventory_is_refused(tmp_path, monkeypatch):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    monkeypatch.chdir(tmp_path)
    for out in ("inv.yaml", str(inv), "./sub/../inv.yaml"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        r = cli("generate", "-i", "inv.yaml", "--backend", "ring", "-o", out)
        assert r.exit_code == 2 and "is the inventory (-i) file" in r.output, r.output
        assert inv.read_text() == INVENTORY
    (tmp_path / "h.args").symlink_to(inv)  # mpi's second output
    r = cli("generate", "-i", "inv.yaml", "--backend", "mpi", "--mpi-libname", "/v/lib/libmpi.so", "-o", "h")
    assert r.exit_code == 2 and inv.read_text() == INVENTORY and not (tmp_path / "h").exists()


def test_mpi_outputs_are_checked_before_either_is_written(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    (tmp_path / "h").write_text("previous\n")
    (tmp_path / "h.args").mkdir()
    r = cli("generate", "-i", str(inv), "--backend", "mpi", "--mpi-libname", "/v/lib/libmpi.so",
            "-o", str(tmp_path / "h"), "--force")
    assert r.exit_code == 2 and "h.args: it is a directory" in r.output
    assert (tmp_path / "h").read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h", "h.args", "inv.yaml"]  # no temp file left


def test_outputs_are_written_atomically_and_keep_their_mode(tmp_path, monkeypatch):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    out = tmp_path / "h.json"
    out.write_text("previous\n")
    out.chmod(0o640)
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr("mlxcluster.outputs.os.replace",
                        lambda src, dst: replaced.append((src, dst)) or real_replace(src, dst))
    r = cli("generate", "-i", str(inv), "--backend", "ring", "-o", str(out), "--force")
    assert r.exit_code == 0, r.output
    (src, dst), = replaced
    assert str(dst) == str(out) and os.path.dirname(src) == str(tmp_path)
    assert out.stat().st_mode & 0o777 == 0o640 and json.loads(out.read_text())["backend"] == "ring"


@pytest.mark.parametrize("out, needle", [("", "the output path is empty"), ("nodir/h.json", "does not exist")])
def test_bad_output_paths_are_input_errors(tmp_path, monkeypatch, out, needle):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    monkeypatch.chdir(tmp_path)
    r = cli("generate", "-i", str(inv), "--backend", "ring", "-o", out)
    assert r.exit_code == 2 and needle in r.output and '"backend"' not in r.output, r.output
