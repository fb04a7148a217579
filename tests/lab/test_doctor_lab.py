"""doctor against the real 3-host lab: healthy => pass; each injected fault
fails exactly the check that names it, blaming exactly the faulty host, and
doctor still finishes within its timeouts.

One lab is shared by the module; every test heals its fault before returning.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.doctor.checks.base import Status
from mlxcluster.doctor.checks.common import BAD
from mlxcluster.doctor.doctor import DoctorReport, run_doctor
from mlxcluster.inventory.inventory import load_inventory
from tests.lab.jobs import MPI_ENV, OPENBLAS_ENV
from tests.waits import (
    DOCTOR_BUDGET_S,
    DOCTOR_CONNECT_TIMEOUT_S,
    TWELVE_CONNECT_TIMEOUT_S,
    poll_until,
)

pytestmark = pytest.mark.lab

# The shared `lab_inventory` fixture's env: block: the documented fix for
# reference-blas on Linux, with which a healthy lab passes.
INVENTORY_ENV = OPENBLAS_ENV
OTHER_MLX = "0.31.0"


@pytest.fixture(scope="module")
def other_mlx_python(tmp_path_factory) -> str:
    """A venv whose python reports mlx OTHER_MLX via importlib.metadata: a
    dist-info of that version in its own site-packages, shadowing the real
    (shared) mlx, which still imports through a .pth file."""
    import subprocess
    import sysconfig

    root = tmp_path_factory.mktemp("oldmlx") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    site = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    dist = site / f"mlx-{OTHER_MLX}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mlx\nVersion: {OTHER_MLX}\n")
    (site / "zz_shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return str(root / "bin" / "python")


@pytest.fixture(scope="module")
def python_without_mpi(tmp_path_factory) -> str:
    """A venv python with no Open MPI beside it (the real mlx imports through
    a .pth file): with PATH lacking MPI too, a host has no mpirun at all."""
    import subprocess
    import sysconfig

    root = tmp_path_factory.mktemp("nompi") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    site = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "zz_shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return str(root / "bin" / "python")


def doctor(path: Path, connect_timeout: float = DOCTOR_CONNECT_TIMEOUT_S,
           **kwargs) -> tuple[DoctorReport, float]:
    started = time.monotonic()
    report = run_doctor(load_inventory(path), connect_timeout=connect_timeout, command_timeout=30, **kwargs)
    return report, time.monotonic() - started


def blamed(report: DoctorReport) -> dict[str, list[str]]:
    """Failing check id -> the hosts its evidence blames."""
    return {r.id: sorted(h for h, e in r.hosts.items() if e.startswith(BAD))
            for r in report.results if r.status in (Status.FAIL, Status.CRASH)}


def failing_evidence(report: DoctorReport) -> str:
    """Every failing check's evidence per host: what a failed assertion shows."""
    return "\n".join(f"{r.id}: {h}: {e}" for r in report.results
                     if r.status in (Status.FAIL, Status.CRASH) for h, e in r.hosts.items())


def evidence(report: DoctorReport, check_id: str, host: str) -> str:
    return next(r for r in report.results if r.id == check_id).hosts[host]


def test_healthy_lab_passes_collects_and_replays(lab3, lab_inventory, tmp_path):
    runner = CliRunner()
    collect = tmp_path / "captures"
    result = runner.invoke(main, ["doctor", "-i", str(lab_inventory), "--json", "--collect", str(collect)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["verdict"] == "pass", [c for c in doc["checks"] if c["status"] != "pass"]
    assert sorted(doc["hosts"]) == ["labhost1", "labhost2", "labhost3"]
    assert doc["hosts"]["labhost2"]["hostname"] == "labhost2"
    ids = {c["id"] for c in doc["checks"]}
    assert {"ssh-paramiko", "ssh-openssh", "host-keys", "host-to-host-ssh", "data-path", "mlx-version",
            "mpirun-path", "libmpi-loadable"} <= ids
    assert set(doc["checks"][0]) == {"id", "title", "status", "hosts", "hint"}
    assert (collect / "labhost3" / "probe.json").is_file()

    replay = runner.invoke(main, ["doctor", "--from", str(collect), "-i", str(lab_inventory)])
    assert replay.exit_code == 0, replay.output
    assert "no issues found" in replay.output
    assert "check(s) skipped: not needed or not possible here" in replay.output  # -v says why
    verbose = runner.invoke(main, ["doctor", "--from", str(collect), "-i", str(lab_inventory), "-v"])
    assert "needs hosts reached over SSH" in verbose.output


@pytest.mark.parametrize(
    "fault, host, expected, cause",
    [
        ("link_down", "labhost2", {"ssh-paramiko", "ssh-openssh"}, ""),
        ("stop_sshd", "labhost3", {"ssh-paramiko", "ssh-openssh"}, "refused"),
        ("drop_ssh_port", "labhost2", {"ssh-paramiko", "ssh-openssh"}, "timed out"),
        ("drop_data_ports", "labhost3", {"data-path"}, "a firewall drops the port"),
        # Neither on PATH nor beside the python (mpirun only beside it is a
        # warning: test_mpirun_beside_the_python_only_warns).
        ("mpirun_nowhere", "labhost3", {"mpirun-path"}, "mpirun not found"),
        ("other_mlx", "labhost2", {"mlx-version"}, OTHER_MLX),
        ("unknown_host_key", "labhost2", {"host-keys"}, "unknown"),
        # The first host runs the host-to-host hops with its python: with that
        # python gone the hops are not tried, and no other host is blamed.
        ("python_missing_on_first", "labhost1", {"python-path"}, "not found"),
        # sshd runs every command through the login shell: fish parses none of
        # the launchers' command lines (login-shell), nothing else is blamed.
        ("login_shell_fish", "labhost2", {"login-shell"}, "/usr/bin/fish"),
    ],
)
def test_fault_fails_the_right_check_on_the_right_host(lab3, lab_inventory, other_mlx_python,
                                                       python_without_mpi, fault, host, expected, cause):
    from tests.lab import SYSTEM_PATH

    inject = {
        "link_down": lambda: lab3.link_down(host),
        "stop_sshd": lambda: lab3.stop_sshd(host),
        "drop_ssh_port": lambda: lab3.drop_port(host, 22),
        "drop_data_ports": lambda: lab3.drop_port(host, "32323-32400"),
        "mpirun_nowhere": lambda: (lab3.set_host_path(host, f"{lab3.bin_dir}:{SYSTEM_PATH}"),
                                   lab3.set_host_python(host, python_without_mpi)),
        "other_mlx": lambda: lab3.set_host_python(host, other_mlx_python),
        "unknown_host_key": lambda: lab3.forget_host_key(host),
        "python_missing_on_first": lambda: lab3.set_host_python(host, "/nonexistent/python"),
        "login_shell_fish": lambda: lab3.set_login_shell(host, "fish"),
    }[fault]
    inject()
    try:
        report, seconds = doctor(lab_inventory)
    finally:
        lab3.heal(host)
    assert seconds < DOCTOR_BUDGET_S
    if fault in ("link_down", "drop_ssh_port"):
        # A dead host costs one connect timeout, not one per test that tries it
        # (paramiko, OpenSSH and the hop from the first host wait side by side).
        assert seconds < 2 * DOCTOR_CONNECT_TIMEOUT_S, seconds
    assert report.verdict == "fail"
    assert blamed(report) == {check_id: [host] for check_id in expected}, failing_evidence(report)
    first = sorted(expected)[0]
    assert cause in evidence(report, first, host)


def test_accept_new_host_keys_trusts_and_saves(lab3, lab_inventory):
    target = lab3.host("labhost3")
    lab3.forget_host_key(target)
    try:
        report, _ = doctor(lab_inventory, accept_new_host_keys=True)
        saved = Path(lab3.known_hosts).read_text()
    finally:
        lab3.heal(target)
    assert report.verdict == "pass", blamed(report)
    assert target.ip in saved


def test_paramiko_honours_proxyjump_from_the_ssh_config(lab3, tmp_path):
    """An alias reached through the first host: sshd on labhost2 sees the
    connection coming from labhost1's address."""
    from mlxcluster.ssh.remote import ParamikoRunner

    jump, target = lab3.hosts[0], lab3.hosts[1]
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host via-jump\n  HostName {target.ip}\n  ProxyJump {jump.ip}\n"
        f"  User root\n  IdentityFile {lab3.key}\n  UserKnownHostsFile {lab3.known_hosts}\n"
        + Path(lab3.ssh_config).read_text())
    on_jump = lab3.host_processes(jump)
    with ParamikoRunner(str(cfg), connect_timeout=DOCTOR_CONNECT_TIMEOUT_S) as runner:
        result = runner.run("via-jump", 'hostname; echo "$SSH_CONNECTION"', timeout=20)
    name, connection = result.stdout.split("\n")[:2]
    assert name == target.name
    assert connection.split()[0] == jump.ip
    # Closing the runner closes its connection to the jump host too: it once
    # kept a session on labhost1 until the process ended.
    poll_until(lambda: lab3.host_processes(jump) == on_jump, 5, "the session on the jump host closed")


def test_a_command_that_ends_before_reading_its_input_gives_its_own_answer(lab3):
    # Seen in CI: doctor's probe sends its script to a python that is not
    # there; sshd closed the channel (exit 127) before the script was sent,
    # and paramiko's "Socket is closed" was blamed on ssh-paramiko instead of
    # python-path. 8 MiB of input cannot fit in the channel's window, so the
    # command always ends while it is being sent.
    from mlxcluster.ssh.remote import ParamikoRunner

    host = lab3.hosts[1]
    with ParamikoRunner(str(lab3.ssh_config), connect_timeout=DOCTOR_CONNECT_TIMEOUT_S) as runner:
        result = runner.run(host.name, "echo not reading >&2; exit 3", stdin="x" * (8 << 20),
                            timeout=30)
        assert (result.exit_status, result.stderr.strip()) == (3, "not reading")
        # The connection is still good for the next command.
        assert runner.run(host.name, "hostname", timeout=30).stdout.strip() == host.name


def test_data_ip_not_on_its_host_blames_only_data_ips_present(lab3, lab_inventory, tmp_path):
    """An inventory IP that labhost3 does not have (e.g. renumbered after a reboot)."""
    host = lab3.host("labhost3")
    wrong = host.ip.rsplit(".", 1)[0] + ".99"  # in the lab subnet, assigned to nobody
    path = tmp_path / "wrong_ip.yaml"
    path.write_text(lab_inventory.read_text().replace(f"ips: [{host.ip}]", f"ips: [{wrong}]"))
    report, _ = doctor(path)
    assert blamed(report) == {"data-ips-present": ["labhost3"]}
    assert f"{wrong} is not assigned" in evidence(report, "data-ips-present", "labhost3")
    assert "see data-ips-present" in evidence(report, "data-path", "labhost3")


def test_collect_captures_for_other_commands(lab3, lab_inventory):
    """The public collector (topology uses it): one capture per host, an error for a dead one."""
    from mlxcluster.facts.collect import collect_captures

    lab3.stop_sshd("labhost1")
    try:
        captures = collect_captures(load_inventory(lab_inventory), connect_timeout=DOCTOR_CONNECT_TIMEOUT_S)
    finally:
        lab3.heal("labhost1")
    assert list(captures) == ["labhost1", "labhost2", "labhost3"]
    assert captures["labhost1"].probe() is None and "refused" in captures["labhost1"].error
    assert captures["labhost3"].probe()["hostname"] == "labhost3"
    assert captures["labhost3"].error is None


def test_twelve_hosts_pass_within_sshd_default_session_limits(make_lab, tmp_path):
    """Every host reaches the 11 others (hops are made for the mpi backend).
    The lab keeps sshd's default MaxSessions (10 per connection), so one
    session per hop over doctor's connection to a host would be refused;
    doctor runs each host's hops from one session, and sshd's MaxStartups
    (10 connections being set up at once): each host but the first hops 4 at
    a time, starting after itself; the whole cluster passes.

    A refused session fails at once, whatever the timeouts; a slow login is not a
    refusal. 12 hosts' 132 logins on 2 cores at load 17 took over doctor's 19 s
    BatchMode limit (connect timeout + 15 s) in a cold CI run (issue 50), so this test
    gives a connect timeout of TWELVE_CONNECT_TIMEOUT_S. How long doctor takes on 12
    hosts is bench/doctor_hops_cost.py's to measure (docs/performance-runs.md), not a timed
    test's."""
    lab = make_lab(12)
    path = lab.write_inventory(tmp_path / "lab12.yaml", env={**OPENBLAS_ENV, **MPI_ENV})
    report, _ = doctor(path, connect_timeout=TWELVE_CONNECT_TIMEOUT_S, backend="mpi")
    assert report.verdict == "pass", {r.id: r.hosts for r in report.results if r.status is not Status.PASS}
    hops = next(r for r in report.results if r.id == "host-to-host-ssh").hosts
    assert hops == {f"labhost{i}": f"every other host (11) -> labhost{i}: ok" for i in range(1, 13)}
    data = next(r for r in report.results if r.id == "data-path").hosts
    assert all(data[f"labhost{i}"].endswith("reachable from every other host (11)") for i in range(1, 13)), data
    assert doctor_helpers_left_after(5.0) == []


def doctor_helpers_left_after(seconds: float) -> list:
    """The data-path agents and hop scripts still running on any lab host
    (they all run on this machine) once ``seconds`` have passed."""
    import psutil

    from mlxcluster.doctor.datapath import AGENT
    from mlxcluster.ssh.hops import HOPS

    deadline = time.monotonic() + seconds
    while True:
        left = [p.pid for p in psutil.process_iter(["cmdline"])
                if any(script in (p.info["cmdline"] or []) for script in (AGENT, HOPS))]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_busy_ring_port_is_blamed_on_its_host_with_the_holder(lab3, lab_inventory):
    """Something else listens on labhost2's ring port (an old run left behind):
    data-path fails on labhost2 only and names the process holding the port."""
    import subprocess

    host = lab3.host("labhost2")
    port = 32323 + host.index  # mlx.launch numbers one port per host IP, in host order
    holder = subprocess.Popen(
        ["ip", "netns", "exec", host.netns, sys.executable, "-c",
         # SO_REUSEADDR like any server: earlier runs leave this port in TIME-WAIT.
         "import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
         f"s.bind(('{host.ip}', {port})); s.listen(1); "
         "print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        report, _ = doctor(lab_inventory)
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert blamed(report) == {"data-path": ["labhost2"]}
    assert f"{host.ip}:{port}: port already in use by python" in evidence(report, "data-path", "labhost2")
    assert f"(pid {holder.pid})" in evidence(report, "data-path", "labhost2")


def test_an_ssh_config_that_accepts_any_key_is_warned_for_every_host(lab3, lab_inventory, tmp_path):
    """The lab's own ssh config with 'StrictHostKeyChecking no' in front: the
    SSH checks still pass (our calls force checking and the keys are known),
    and ssh-host-key-policy warns for every host that plain ssh, as
    mlx.launch or mpirun run by hand, would accept any key."""
    weak = tmp_path / "weak_ssh_config"
    weak.write_text("Host *\n  StrictHostKeyChecking no\n\n" + Path(lab3.ssh_config).read_text())
    path = tmp_path / "weak.yaml"
    path.write_text(lab_inventory.read_text().replace(f"ssh_config: {lab3.ssh_config}",
                                                       f"ssh_config: {weak}"))
    assert str(weak) in path.read_text()
    report, _ = doctor(path, data_path=False)
    policy = next(r for r in report.results if r.id == "ssh-host-key-policy")
    assert policy.status is Status.WARN
    assert sorted(h for h, e in policy.hosts.items() if e.startswith("! StrictHostKeyChecking no")) == [
        "labhost1", "labhost2", "labhost3"]
    assert blamed(report) == {}
    healthy, _ = doctor(lab_inventory, data_path=False)
    assert next(r for r in healthy.results if r.id == "ssh-host-key-policy").status is Status.PASS


def smoke_mpi(lab, lab_inventory: Path) -> dict:
    """The real `smoke --backend mpi` across the lab (mpirun beside the python,
    MLX_MPI_LIBNAME set by smoke); its run report."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "mlxcluster", "smoke", "-i", str(lab_inventory), "--backend", "mpi",
                           "--sizes", "1K:2K", "--dtypes", "float32", "--phase-timeout", "30", "--json"],
                          env=lab.env(), capture_output=True, text=True, timeout=120,
                          cwd=lab_inventory.parent)  # a hang's report: ./runs/, not the checkout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)["backends"][0]


def mpi_statuses(report: DoctorReport) -> dict[str, Status]:
    return {r.id: r.status for r in report.results
            if r.id in ("mpirun-path", "openmpi-version", "openmpi5-for-launch", "libmpi-loadable",
                        "libmpi-by-hand", "backends")}


def test_mpi_doctor_agrees_with_smoke_on_the_lab(lab3, lab_inventory):
    """smoke --backend mpi runs on all three hosts; MLX's default libmpi name
    loads on none of them (the venv's libmpi is not on the loader path), so
    doctor -i INV --backend mpi passes libmpi-loadable and backends with the
    MLX_MPI_LIBNAME smoke sets, and only warns for launches by hand."""
    from mlxcluster.facts.mpi import find_libmpi, find_mpirun

    run = smoke_mpi(lab3, lab_inventory)
    assert [(r["host"], r["status"]) for r in run["ranks"]] == [
        ("labhost1", "passed"), ("labhost2", "passed"), ("labhost3", "passed")]
    result = CliRunner().invoke(main, ["doctor", "-i", str(lab_inventory), "--backend", "mpi", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    checks = {c["id"]: c for c in doc["checks"]}
    assert doc["verdict"] == "warn", [(c["id"], c["hosts"]) for c in doc["checks"] if c["status"] == "fail"]
    assert [c["id"] for c in doc["checks"] if c["status"] == "warn"] == ["libmpi-by-hand"]
    libmpi = find_libmpi(mpirun=find_mpirun())  # what smoke set on every rank
    for host in ("labhost1", "labhost2", "labhost3"):
        assert checks["libmpi-loadable"]["hosts"][host].startswith(f"mlxcluster sets MLX_MPI_LIBNAME={libmpi}")
        assert f"mpi (with MLX_MPI_LIBNAME={libmpi}" in checks["backends"]["hosts"][host]
        assert doc["hosts"][host]["launch_libmpi"] == libmpi
    assert {checks[c]["status"] for c in ("libmpi-loadable", "backends", "mpirun-path", "openmpi-version",
                                           "openmpi5-for-launch")} == {"pass"}
    assert f"MLX_MPI_LIBNAME={libmpi}" in checks["libmpi-by-hand"]["hint"]


def test_mpirun_beside_the_python_only_warns(lab3, lab_inventory):
    """labhost3's non-interactive PATH loses the venv's bin: mpirun is still
    beside the python, which is the one mlxcluster starts (by full path), so
    mpirun-path warns for that host and nothing MPI fails."""
    from tests.lab import SYSTEM_PATH

    host = lab3.host("labhost3")
    lab3.set_host_path(host, f"{lab3.bin_dir}:{SYSTEM_PATH}")
    try:
        report, seconds = doctor(lab_inventory, backend="mpi")
    finally:
        lab3.heal(host)
    assert seconds < DOCTOR_BUDGET_S
    assert blamed(report) == {}
    statuses = mpi_statuses(report)
    assert statuses["mpirun-path"] is Status.WARN
    assert {statuses[c] for c in ("libmpi-loadable", "backends", "openmpi-version")} == {Status.PASS}
    path_check = next(r for r in report.results if r.id == "mpirun-path")
    venv_mpirun = report.facts["labhost1"].mpirun
    assert path_check.hosts["labhost3"] == (f"! not on PATH; found beside python at {venv_mpirun} "
                                            f"({report.facts['labhost1'].mpirun_version}): mlxcluster uses it")
    assert not path_check.hosts["labhost1"].startswith("!")
