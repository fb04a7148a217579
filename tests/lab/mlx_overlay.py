"""One lab host on another version of a distribution at the same python
path, for the install fixes' lab tests (mlx, mlx-lm): the host's
site-packages and scripts folder become overlays in its mount namespace
(the venv's below, the host's changes in a folder of the test's), holding that version
installed (without dependencies: the venv's serve) from wheels fetched
here. This machine's venv and the other hosts are never changed."""

from __future__ import annotations

import platform
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlxcluster.doctor.fixes import wheels
from mlxcluster.doctor.fixes.mlx_version import MLX
from mlxcluster.doctor.fixes.same_version import Package, version_dir

OLD = "0.32.3"
MLX_DISTS = ("mlx", "mlx-cpu")


def version_of(dists: tuple[str, ...] = MLX_DISTS) -> str:
    """Python code printing the installed versions of ``dists``, in order."""
    return f"import importlib.metadata as m; print(*(m.version(d) for d in {dists!r}))"


VERSION_OF = version_of()


def installed_of(dists: tuple[str, ...]) -> str:
    """Python code printing the installed version of each of ``dists`` in order, ``-`` for one not installed."""
    return ("import importlib.metadata as m; got = {d.metadata['Name'].lower(): d.version for d in m.distributions()}; "
            f"print(*(got.get(d, '-') for d in {dists!r}))")


def versions(lab, host, dists: tuple[str, ...] = MLX_DISTS) -> list[str]:
    """The versions of ``dists`` (mlx's and mlx-cpu's) on ``host`` with the lab's python."""
    return lab.ssh(host, f"{lab.python} -c \"{version_of(dists)}\"").stdout.split()


# The venv's folders pip writes: site-packages and the scripts folder
# (bin/mlx.launch, mlx_lm.generate...). Both are overlaid on the host: an
# install or undo on one host must not touch this machine's venv, where the
# other hosts' python, and the other tests running beside this one, read them
# (an undo's `pip uninstall mlx` once took bin/mlx.launch away from a test
# running `mlxcluster run` in another worker).
VENV_FOLDERS = (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["scripts"])


def overlay_venv(folder: Path) -> tuple[str, str]:
    """Shell words that put an overlay over each of ``VENV_FOLDERS`` (the
    venv's below, the host's changes in ``folder``), and those that take
    them away again: (mount, umount)."""
    mounts = []
    for i, path in enumerate(VENV_FOLDERS):
        upper, work = folder / f"upper{i}", folder / f"work{i}"
        upper.mkdir(parents=True)
        work.mkdir()
        mounts.append(f"mount -t overlay overlay -o lowerdir={path},upperdir={upper},workdir={work} {path}")
    return " && ".join(mounts) + " && ", "".join(f"umount {path}; " for path in VENV_FOLDERS)


@contextmanager
def other_version(lab, host, folder: Path, package: Package, version: str,
                  without: tuple[str, ...] = ()) -> Iterator[None]:
    """``host`` on ``package`` ``version`` (and its companion), and without
    the distributions ``without`` (uninstalled there: its python cannot
    find them), until the block ends. Set XDG_CACHE_HOME first: the wheels are fetched into the
    fix's cache here (``same_version.version_dir``), where the fix then finds
    them. Without a home per host (``Lab.no_project``, as ``lab3_own_home``
    has) the host's ``~/.cache/mlxcluster`` is a tmpfs of its own, so what
    the fix sends there is that host's only; with one, the wheels sent to
    the host's home are removed when the block ends."""
    mount, umount = overlay_venv(folder)
    target = wheels.Target("Linux", platform.machine(), platform.python_version(),
                           libc=" ".join(platform.libc_ver()))
    requirements = package.requirements(target.system, version)
    got = wheels.fetched(target, requirements, version_dir(package, version, wheels.wheel_key(target)), 600)
    dists = tuple(r.split("==")[0] for r in requirements)
    own_cache = "" if lab.no_project else "mount -t tmpfs mlxc-wheels /root/.cache/mlxcluster && "
    remove = (f"{lab.python} -m pip uninstall -q -y --disable-pip-version-check {' '.join(without)} 2>/dev/null; "
              if without else "")
    made = lab.ssh(host, f"{mount}{own_cache}{lab.python} -m pip install -q --disable-pip-version-check --no-index --no-deps "
                         f"--find-links {got[0].parent} {' '.join(requirements)} 2>/dev/null; {remove}"
                         f"{lab.python} -c \"{version_of(dists)}\"; {lab.python} -c \"{installed_of(without)}\"",
                   timeout=120)
    try:
        assert made.stdout.split() == [version] * len(dists) + ["-"] * len(without), made.stdout + made.stderr
        yield
    finally:
        # What the fix sent is put back too: the host's own cache (a tmpfs,
        # or with a home per host the wheels folder there) goes.
        forget_cache = 'rm -rf "$HOME/.cache/mlxcluster/wheels"; ' if lab.no_project else "umount /root/.cache/mlxcluster; "
        lab.ssh(host, forget_cache + umount, timeout=30)


def wheels_on(lab, host) -> list[str]:
    """The wheels in ``host``'s own ``~/.cache/mlxcluster/wheels`` (a lab with a home per host)."""
    return sorted(p.name for p in (lab.host_home(lab.host(host)) / ".cache" / "mlxcluster" / "wheels").glob("*.whl"))


def venv_scripts_here() -> dict[str, tuple[int, int]]:
    """This machine's venv scripts folder: name -> (size, mtime in ns), compared before and after."""
    scripts = Path(VENV_FOLDERS[1])
    return {p.name: (p.lstat().st_size, p.lstat().st_mtime_ns) for p in scripts.iterdir()}


def wheels_here() -> list[str]:
    """The wheels in this machine's own ``~/.cache/mlxcluster/wheels`` (compared before and after)."""
    return sorted(p.name for p in (Path.home() / ".cache" / "mlxcluster" / "wheels").rglob("*.whl"))


def mlxcluster(env, *args: str) -> subprocess.CompletedProcess:
    """``python -m mlxcluster ARGS`` here with ``env`` (the lab's: its ssh first on PATH)."""
    return subprocess.run([sys.executable, "-m", "mlxcluster", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def other_mlx(lab, host, folder: Path, version: str = OLD):
    """``host`` on mlx ``version`` (and mlx-cpu) until the block ends (``other_version``)."""
    return other_version(lab, host, folder, MLX, version)
