"""The lab itself: real hosts, real MLX ring and MPI traffic, faults, teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.lab import our_namespaces
from tests.lab.jobs import run_job

pytestmark = pytest.mark.lab

HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent


def test_three_hosts_each_with_own_hostname(lab3):
    names = [lab3.ssh(h, "hostname", check=True).stdout.strip() for h in lab3.hosts]
    assert names == ["labhost1", "labhost2", "labhost3"]
    # host-to-host ssh works too (mpirun starts remote daemons from a host)
    proc = lab3.ssh(0, f"ssh {lab3.hosts[2].ip} hostname", check=True)
    assert proc.stdout.strip() == "labhost3"


def test_every_host_has_its_own_disk(lab3):
    """A file a host writes under lab.disk is on that host only, as on Macs;
    this machine (where mlxcluster runs) keeps its own files there too."""
    path = lab3.disk / "own-disk-probe.txt"
    path.write_text("client\n")
    try:
        assert not any(lab3.host_exists(h, path) for h in lab3.hosts)
        lab3.ssh(1, f"echo labhost2 > {path}", check=True)
        assert lab3.host_read(1, path) == "labhost2\n"
        assert not lab3.host_exists(0, path) and not lab3.host_exists(2, path)
        assert path.read_text() == "client\n"
        # Ranks started by a launcher over ssh see the same private disk.
        proc = lab3.ssh(0, f"ssh {lab3.hosts[1].ip} cat {path}", check=True)
        assert proc.stdout == "labhost2\n"
        # The ranks' stack dumps and pid files are each host's own too.
        probe = "/tmp/mlxcluster-stacks/own-disk-probe"
        lab3.ssh(1, f"echo labhost2 > {probe}", check=True)
        assert lab3.host_read(1, probe) == "labhost2\n"
        assert not lab3.host_exists(0, probe) and not os.path.exists(probe)
    finally:
        path.unlink()
        lab3.ssh(1, f"rm -f {path} /tmp/mlxcluster-stacks/own-disk-probe")


def test_every_host_runs_commands_through_zsh_as_a_mac_does(lab3):
    """sshd runs a command through the login shell, zsh on a Mac: a glob
    that matches nothing fails there and drops the rest of the line (bash
    passes the word on). This machine's own root keeps bash."""
    for h in lab3.hosts:
        proc = lab3.ssh(h, "echo $ZSH_VERSION; for f in /nonexistent-dir/*.err; do :; done; "
                           "echo reached")
        assert proc.stdout.strip() and "reached" not in proc.stdout
        assert "no matches found" in proc.stderr
    assert subprocess.run(["bash", "-c", "getent passwd root"], capture_output=True,
                          text=True).stdout.rstrip().endswith("bash")


def bounded_job(cmd: list[str], lab, timeout: float) -> tuple[int | None, str]:
    """(exit code or None when it was still running after ``timeout`` s, output);
    the launcher's process group is killed either way, and the ranks on the hosts."""
    proc = subprocess.Popen(cmd, env=lab.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return None, proc.communicate()[0]
    finally:
        for h in lab.hosts:
            lab.ssh(h, "pkill -KILL -f '[a]llsum.py'")


def test_what_each_login_shell_makes_of_the_launchers_command_lines(lab3, tmp_path):
    """The evidence behind doctor's login-shell check: sshd runs the command
    line a launcher sends with the login shell. dash (a POSIX sh) runs
    mpirun's but not mlx.launch's bash text (that rank exits 2); fish runs
    neither, and both launchers hang, rank 0 waiting for a rank that never
    started."""
    ips = ",".join(h.ip for h in lab3.hosts)
    ring = [str(VENV_BIN / "mlx.launch"), "--hosts", ips, "--backend", "ring",
            "--python", lab3.python, str(HERE / "allsum.py"), "ring"]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{h.ip} slots=1\n" for h in lab3.hosts))
    mpi = mpirun_cmd(lab3, hostfile) + ["mpi"]
    try:
        lab3.set_login_shell(1, "dash")
        code, out = bounded_job(ring, lab3, 60)
        assert "Node with rank 1 exited with code 2" in out, (code, out[-2000:])
        code, out = bounded_job(mpi, lab3, 60)
        assert code == 0 and out.count("RESULT ") == 3, out[-2000:]
        lab3.set_login_shell(1, "fish")
        for cmd in (ring, mpi):
            code, out = bounded_job(cmd, lab3, 15)
            assert code is None and "RESULT " not in out, (code, out[-2000:])
    finally:
        lab3.heal(1)


def test_mlx_launch_ring_all_sum_across_three_hosts(lab3):
    ips = ",".join(h.ip for h in lab3.hosts)
    rows = run_job([str(VENV_BIN / "mlx.launch"), "--hosts", ips, "--backend", "ring",
                    "--python", lab3.python, str(HERE / "allsum.py"), "ring"], lab3)
    assert rows == [(0, 3, 3, "labhost1"), (1, 3, 3, "labhost2"), (2, 3, 3, "labhost3")]


def mpirun_cmd(lab, hostfile: Path, with_libname: bool = True) -> list[str]:
    cmd = [str(VENV_BIN / "mpirun"), "--allow-run-as-root", "--hostfile", str(hostfile),
           "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", lab.subnet,
           "--mca", "oob_tcp_if_include", lab.subnet, "--mca", "btl_tcp_links", "4",
           "-x", "PATH", "-x", f"LD_LIBRARY_PATH={VENV_BIN.parent / 'lib'}"]
    if with_libname:
        cmd += ["-x", f"MLX_MPI_LIBNAME={VENV_BIN.parent / 'lib' / 'libmpi.so.40'}"]
    return cmd + [lab.python, str(HERE / "allsum.py")]


def test_mpi_all_sum_across_three_hosts(lab3, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{h.ip} slots=1\n" for h in lab3.hosts))
    rows = run_job(mpirun_cmd(lab3, hostfile) + ["mpi"], lab3)
    assert rows == [(0, 3, 3, "labhost1"), (1, 3, 3, "labhost2"), (2, 3, 3, "labhost3")]


def test_mpi_without_libname_silently_runs_alone(lab3, tmp_path):
    """The FIELD_NOTES trap, reproduced: without MLX_MPI_LIBNAME and a
    non-strict init every rank is a group of 1 (why smoke uses strict init)."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{h.ip} slots=1\n" for h in lab3.hosts))
    cmd = mpirun_cmd(lab3, hostfile, with_libname=False)
    cmd[-1:] = [str(HERE / "allsum_lenient.py")]
    rows = run_job(cmd, lab3)
    assert [(r[1], r[2]) for r in rows] == [(1, 1)] * 3


def _ssh_timed(lab, host, command="true"):
    start = time.monotonic()
    proc = lab.ssh(host, command, timeout=30)
    return proc, time.monotonic() - start


def test_fault_link_down_makes_connects_time_out(lab3):
    try:
        lab3.link_down(1)
        proc, elapsed = _ssh_timed(lab3, 1)
        assert proc.returncode == 255 and "timed out" in proc.stderr
        assert elapsed >= 4  # ConnectTimeout 5 in the lab ssh_config
        assert lab3.ssh(0, "true").returncode == 0  # the others are untouched
    finally:
        lab3.heal(1)
    assert lab3.ssh(1, "true").returncode == 0


def test_fault_sshd_stopped_refuses(lab3):
    try:
        lab3.stop_sshd(2)
        proc, elapsed = _ssh_timed(lab3, 2)
        assert proc.returncode == 255 and "refused" in proc.stderr
        assert elapsed < 4
    finally:
        lab3.heal(2)
    assert lab3.ssh(2, "hostname").stdout.strip() == "labhost3"


def test_fault_ssh_port_dropped_times_out(lab3):
    try:
        lab3.drop_port(0, 22)
        proc, _ = _ssh_timed(lab3, 0)
        assert proc.returncode == 255 and "timed out" in proc.stderr
    finally:
        lab3.heal(0)
    assert lab3.ssh(0, "true").returncode == 0


def test_fault_small_disk_fills_on_that_host_only_and_heals(lab3):
    folder = lab3.disk / f"small-{uuid.uuid4().hex[:8]}"
    try:
        lab3.small_disk(1, folder, "64k")
        full = lab3.ssh(1, f"head -c 100000 /dev/zero > {folder}/f")
        assert full.returncode != 0 and "No space left on device" in full.stderr
        lab3.resize_small_disk(1, folder, "256k")  # room freed, the file kept
        assert lab3.ssh(1, f"head -c 100000 /dev/zero >> {folder}/f && stat -c %s {folder}/f",
                        check=True).stdout.split() == ["165536"]
        assert not lab3.host_exists(0, folder / "f")  # the others' disks are untouched
        assert "small_disk" in lab3.hosts[1].faults
    finally:
        lab3.heal(1)
    assert not lab3.host_exists(1, folder / "f")  # unmounted: the host's own disk again
    assert lab3.hosts[1].small_disks == []


def test_fault_data_port_range_dropped(lab3):
    target = lab3.hosts[1]
    listener = subprocess.Popen(
        ["ip", "netns", "exec", target.netns, sys.executable, "-c",
         f"import socket,time;s=socket.create_server(('{target.ip}',32330));time.sleep(60)"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = (f"{lab3.python} -c \"import socket;socket.create_connection(('{target.ip}',32330),2);"
             "print('connected')\"")
    try:
        deadline = time.monotonic() + 10
        while lab3.ssh(0, probe).stdout.strip() != "connected":
            assert time.monotonic() < deadline, "listener never came up"
            time.sleep(0.2)
        lab3.drop_port(target, "32323-32400")
        proc = lab3.ssh(0, probe)
        assert proc.returncode != 0 and "timed out" in proc.stderr
        assert lab3.ssh(0, f"ssh {target.ip} true").returncode == 0  # ssh itself still fine
    finally:
        listener.kill()
        listener.wait(5)
        lab3.heal(target)


def _transfer_timed(lab, host, nbytes: int) -> tuple[int, float]:
    """(bytes received, seconds from the first byte to the last) of ``nbytes``
    sent by the host over ssh: the ssh login before the first byte, which a
    loaded machine stretches to seconds, is not counted."""
    proc = subprocess.Popen(["ssh", "-F", str(lab.ssh_config), lab.host(host).ip, f"head -c {nbytes} /dev/zero"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        got = proc.stdout.read(1)
        first = time.monotonic()
        while chunk := proc.stdout.read1(65536):
            got += chunk
        return len(got), time.monotonic() - first
    finally:
        proc.kill()
        proc.wait()


def test_fault_slow_link_throttles(lab3):
    _, fast = _transfer_timed(lab3, 2, 400000)
    try:
        lab3.slow_link(2, "1mbit")
        received, slow = _transfer_timed(lab3, 2, 400000)
        assert received == 400000
        assert slow > 2.0 and slow > 3 * fast  # 3.2 Mbit at 1 Mbit/s
    finally:
        lab3.heal(2)


def test_fault_per_host_path_and_python(lab3):
    other_python = os.path.join(sys.base_prefix, "bin", "python3")
    try:
        lab3.set_host_path(1, "/usr/bin:/bin")
        lab3.set_host_python(2, other_python)
        assert lab3.ssh(0, "command -v mpirun").returncode == 0
        assert lab3.ssh(1, "command -v mpirun").returncode != 0
        exe = "-c 'import sys; print(sys.prefix)'"
        prefixes = [lab3.ssh(h, f"{lab3.python} {exe}").stdout.strip() for h in lab3.hosts]
        assert prefixes[0] == prefixes[1] == sys.prefix
        assert prefixes[2] == sys.base_prefix != sys.prefix
    finally:
        lab3.heal()
    assert lab3.ssh(1, "command -v mpirun").returncode == 0


def test_fault_unknown_host_key(lab3):
    try:
        lab3.forget_host_key(0)
        proc = lab3.ssh(0, "true")
        assert proc.returncode == 255 and "Host key verification failed" in proc.stderr
        assert lab3.ssh(1, "true").returncode == 0
    finally:
        lab3.heal(0)
    assert lab3.ssh(0, "true").returncode == 0


def test_teardown_leaves_nothing(make_lab):
    lab = make_lab(2)
    ns = [h.netns for h in lab.hosts]
    sshd_pids = [h.sshd.pid for h in lab.hosts]
    # a process left running on a host is killed by teardown too
    lab.ssh(0, "nohup sleep 300 >/dev/null 2>&1 &")
    assert set(ns) <= set(our_namespaces())
    lab.stop()
    remaining = set(our_namespaces())
    assert not set(ns) & remaining
    assert not lab.state.exists()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert lab.tag not in links
    for pid in sshd_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # (No connect to the old address: with the lab gone it would leave this
    # machine by the default route, and the lab never contacts foreign addresses.)
    routes = subprocess.run(["ip", "-o", "route"], capture_output=True, text=True).stdout
    assert lab.subnet not in routes


def test_stale_lab_of_dead_owner_is_cleaned(make_lab):
    from tests.lab import cleanup_stale

    lab = make_lab(1)
    (lab.state / "owner.pid").write_text("999999999")  # an owner that cannot exist
    removed = cleanup_stale()
    assert lab.id in removed
    assert lab.hosts[0].netns not in our_namespaces()


def test_second_link_carries_traffic_throttles_apart_and_goes_with_the_lab(make_lab, tmp_path):
    """Lab.add_second_link: real veths (eth1) on a second bridge, host-to-host
    TCP over them, a throttle on eth1 that leaves eth0 fast, nothing left after stop."""
    from mlxcluster.inventory.inventory import load_inventory
    from mlxcluster.jobs.hosts import hosts_from_inventory
    from mlxcluster.tune.measure import tcp_stream

    lab = make_lab(2)
    a, b = lab.hosts
    second = lab.add_second_link()
    assert second == {a.name: a.second_ip, b.name: b.second_ip}
    assert a.second_ip.rsplit(".", 1)[0] != a.ip.rsplit(".", 1)[0]  # a subnet of its own
    shown = lab.netns_exec(a, ["ip", "-o", "-4", "addr", "show", "dev", "eth1"]).stdout
    assert f"inet {a.second_ip}/24" in shown

    def gbps(ips_of_b: list[str]) -> float:
        inv = lab.write_inventory(tmp_path / "lab.yaml", data_ips={a.name: [a.ip], b.name: ips_of_b})
        sender, receiver = hosts_from_inventory(load_inventory(inv))
        return tcp_stream(sender, receiver, 1, 1.5)

    fast_second = gbps([b.second_ip])
    lab.slow_link(a, "20mbit", dev="eth1")
    assert "tbf" in lab.netns_exec(a, ["tc", "qdisc", "show", "dev", "eth1"]).stdout
    slow_second, first = gbps([b.second_ip]), gbps([b.ip])
    assert slow_second < 0.0035 < 0.02 < fast_second  # 20 Mbit/s = 0.0025 GB/s
    assert first > 10 * slow_second  # eth0 is not throttled
    lab.heal(a)
    assert "tbf" not in lab.netns_exec(a, ["tc", "qdisc", "show", "dev", "eth1"]).stdout
    lab.stop()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert lab.tag not in links  # the second bridge and its veths are gone too


def test_the_shared_lab_check_sees_what_a_test_leaves_changed(lab3, tmp_path):
    """What tests/lab/conftest.py compares before and after every test on a
    shared lab: a dropped port, a mount, a process left on a host and a
    changed host setting each show, and the lab compares equal again once
    they are put back."""
    host = lab3.hosts[1]
    before = lab3.fingerprint()
    assert lab3.fingerprint() == before  # nothing that moves by itself
    try:
        lab3.drop_port(host, 32330)
        folder = tmp_path / "mounted"
        folder.mkdir()
        lab3.ssh(host, f"mount -t tmpfs left-behind {folder}", check=True)
        lab3.ssh(host, "nohup sleep 123 >/dev/null 2>&1 &", check=True)
        lab3.set_host_python(2, "/nonexistent/python")
        changed = {key for key, value in lab3.fingerprint().items() if before.get(key) != value}
        assert {f"{host.name} firewall", f"{host.name} faults", f"{host.name} mounts",
                f"{host.name} processes", "labhost3 python", "labhost3 faults", "bin/python"} <= changed
    finally:
        lab3.ssh(host, f"umount {tmp_path / 'mounted'}; pkill -f 'sleep 123'")
        lab3.heal()
    assert lab3.fingerprint() == before
