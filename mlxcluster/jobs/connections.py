"""A job's hosts on shared SSH connections, for the job's whole life.

``shared_hosts`` gives every remote rank host the sharing options of
``ssh.shared`` (one master connection per host), so that the python check or
the probe, the staging of smoke's worker, the launcher's start and stop of
each rank (through the launchers' ssh, ``ssh.launcher_ssh``), the sweep and
the stall's state collection all ride on one login per host. `smoke` and
`tune` use it for their hosts, `run` and `train` through
``shared_connections`` for their Job. When the command is over, however it
ended, every master is closed and the socket folder removed: nothing of the
job is left running here either.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from mlxcluster.jobs.hosts import RankHost
from mlxcluster.jobs.job import Job
from mlxcluster.ssh import shared


def can_share(hosts: Sequence[RankHost]) -> bool:
    """Whether these rank hosts can share one connection each: some host is
    remote, and no host runs more ranks than a master takes sessions."""
    ranks_per_host = Counter(h.ssh_target for h in hosts if not h.is_local)
    return bool(ranks_per_host) and max(ranks_per_host.values()) <= shared.MAX_SHARED_RANKS


@contextmanager
def shared_hosts(hosts: tuple[RankHost, ...],
                 env: dict[str, str] | None = None) -> Iterator[tuple[RankHost, ...]]:
    """The rank hosts with the remote ones on shared connections (unchanged
    when they cannot share); the masters are closed on the way out."""
    if not can_share(hosts):
        yield hosts
        return
    folder = shared.open_folder()
    options = shared.share_options(folder)
    sharing = tuple(h if h.is_local else replace(h, ssh_options=(*h.ssh_options, *options))
                    for h in hosts)
    try:
        yield sharing
    finally:
        shared.close(folder, env)


@contextmanager
def shared_connections(job: Job, env: dict[str, str] | None = None) -> Iterator[Job]:
    """The job with its hosts on shared connections (``shared_hosts``)."""
    with shared_hosts(job.hosts, env) as hosts:
        yield job if hosts is job.hosts else replace(job, hosts=hosts)
