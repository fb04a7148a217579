"""One lab host on another mlx at the same python path, for the mlx fix's lab
tests: the host's site-packages becomes an overlay in its mount namespace
(the venv's below, the host's changes in a folder of the test's), holding
mlx ``OLD`` installed from wheels fetched here. This machine's venv and the
other hosts are never changed."""

from __future__ import annotations

import platform
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlxcluster.doctor.fixes import mlx_version as fix

OLD = "0.32.3"
VERSION_OF = "import importlib.metadata as m; print(m.version('mlx'), m.version('mlx-cpu'))"


def versions(lab, host) -> list[str]:
    """mlx's and mlx-cpu's versions on ``host`` with the lab's python."""
    return lab.ssh(host, f"{lab.python} -c \"{VERSION_OF}\"").stdout.split()


@contextmanager
def other_mlx(lab, host, folder: Path, version: str = OLD) -> Iterator[None]:
    """``host`` on mlx ``version`` until the block ends. Set XDG_CACHE_HOME
    first: the wheels are fetched into the fix's cache here, where the fix
    then finds them. Without a home per host (``Lab.no_project``) the host's
    ``~/.cache/mlxcluster`` is a tmpfs of its own, so what the fix sends
    there is that host's only."""
    site = sysconfig.get_paths()["purelib"]
    upper, work = folder / "upper", folder / "work"
    upper.mkdir(parents=True)
    work.mkdir()
    target = fix.Target("Linux", platform.machine(), platform.python_version(), libc=" ".join(platform.libc_ver()))
    wheels = fix.fetched(target, version, fix.wheel_key(target), 600)
    own_cache = "" if lab.no_project else "mount -t tmpfs mlxc-wheels /root/.cache/mlxcluster && "
    made = lab.ssh(host, f"mount -t overlay overlay -o lowerdir={site},upperdir={upper},workdir={work} {site} && "
                         f"{own_cache}{lab.python} -m pip install -q --disable-pip-version-check --no-index "
                         f"--find-links {wheels[0].parent} mlx=={version} mlx-cpu=={version} 2>/dev/null; "
                         f"{lab.python} -c \"{VERSION_OF}\"", timeout=120)
    try:
        assert made.stdout.split() == [version, version], made.stdout + made.stderr
        yield
    finally:
        lab.ssh(host, ("" if lab.no_project else "umount /root/.cache/mlxcluster; ") + f"umount {site}", timeout=30)
