"""What ranks import from this project, on every host that lacks this version.

Every rank of `train` and `run` runs under mlxcluster's rank wrapper, and
`train`'s ranks run ``reference_train``: the hosts need those files, not an
installed or checked-out mlxcluster. ``code_manifest`` lists them (the
rank wrapper with its two package ``__init__`` files, serve's
``pipeline_rank`` with its package's, every file of ``reference_train``
but caches) and names their version by a sha256 of
their names and contents; a host keeps each version in a folder of its
own, ``~/.cache/mlxcluster/code/<version>/`` in its home::

    ~/.cache/mlxcluster/code/3f9c.../mlxcluster/jobs/rank_wrapper.py
    ~/.cache/mlxcluster/code/3f9c.../reference_train/train.py ...

``sync_code`` checks every remote host's folder of this version and sends
what it lacks, as `--data` is sent (launch/sync.py over mlxcluster.transfer: one check
per host, files verified by sha256 there before they are renamed into place, the
same events); a host that has this version is sent nothing. The ranks then
import from that folder: it is first on their PYTHONPATH
(``Job.code_paths``). Ranks on this machine import from this checkout.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

from mlxcluster.jobs.events import OnEvent
from mlxcluster.jobs.hosts import remote_hosts
from mlxcluster.jobs.job import RANK_WRAPPER_FILES, Job, package_root
from mlxcluster.launch.sync import send_where_needed
from mlxcluster.transfer.manifest import DataFile, Manifest

CACHE_ROOT = "~/.cache/mlxcluster/code"  # on each host, in its own home
PACKAGES = ("reference_train",)  # sent whole (but caches): what ranks import besides the wrapper
# serve's ranks under a split by memory run mlx-lm's server through this module
# (serve/pipeline_rank.py: standard library and mlx_lm only); its package's
# __init__ imports nothing.
SERVE_RANK_FILES = ("mlxcluster/serve/__init__.py", "mlxcluster/serve/pipeline_rank.py")


def code_files(root: Path | None = None) -> list[str]:
    """The files ranks import, as paths below ``root`` (this checkout), sorted:
    the rank wrapper's, then every file of ``PACKAGES`` except ``__pycache__``,
    compiled files and dot files."""
    root = package_root() if root is None else root
    names = set(RANK_WRAPPER_FILES) | set(SERVE_RANK_FILES)
    for package in PACKAGES:
        for path in (root / package).rglob("*"):
            rel = path.relative_to(root)
            if (path.is_file() and path.suffix != ".pyc"
                    and not any(part == "__pycache__" or part.startswith(".") for part in rel.parts)):
                names.add(rel.as_posix())
    return sorted(names)


def version_of(files: tuple[DataFile, ...]) -> str:
    """The sha256 naming one version: every file's path and sha256, in order
    (a file changed, added, removed or renamed is another version)."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.name):
        digest.update(f"{f.name}\0{f.sha256}\n".encode())
    return digest.hexdigest()


def code_manifest(root: Path | None = None) -> Manifest:
    """The files ranks import, hashed here, to be kept on each host in the
    folder of their version (``CACHE_ROOT/<version>``, ~ being the host's home)."""
    root = package_root() if root is None else root
    files = tuple(DataFile.of(root / name, name) for name in code_files(root))
    return Manifest(f"{CACHE_ROOT}/{version_of(files)}", files, source=str(root))


def sync_code(job: Job, env: dict[str, str], on_event: OnEvent) -> Job:
    """The job with what its ranks import on every remote host: each host's
    folder of this version checked and sent what it lacks (events as
    `--data`'s), the folders (as the hosts name them) first on the ranks'
    PYTHONPATH, then this checkout for ranks on this machine. A job with no
    remote host is returned as it is (its ranks import from this checkout)."""
    if not remote_hosts(job.hosts):
        return job
    copies = send_where_needed(job, code_manifest(), "code", env, on_event)
    return replace(job, code_paths=code_paths(job, [c.folder for c in copies]))


def code_paths(job: Job, folders: list[str]) -> tuple[str, ...]:
    """The ranks' code entries of PYTHONPATH: each remote host's folder once
    (one environment reaches every rank, and hosts with other homes name
    the folder differently: each finds its own, a path missing on a host is
    passed over), then this checkout when a rank runs here."""
    paths = list(dict.fromkeys(folders))
    if any(h.is_local for h in job.hosts):
        paths.append(str(package_root()))
    return tuple(paths)
