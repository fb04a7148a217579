"""The controller's lease: how the ranks of a job know that the machine
running mlxcluster is still there.

People start training from a MacBook and close its lid, lose Wi-Fi or kill
the terminal. The launcher (mlx.launch, mpirun) runs in a session of its own
and the ranks on other Macs do not notice: measured before this module, both
ranks of a lab job trained on for 74 s to the last step of their run, with
nobody recording or watching them. So every rank of an attached job
(``train``, ``run``; not ``--detach``) watches a lease file in its stacks
directory on its own host (mlxcluster.jobs.rank_wrapper ``watch_lease``),
and ``Lease`` here touches that file on every host every ``limit / 6``
seconds, one thread per host, over the job's shared ssh connection. When no
touch lands for ``limit`` seconds (this process killed, its Mac asleep, its
network down: all look the same from the host) every rank is stopped there,
after a last checkpoint where the program can (the trainer's SIGUSR2).

The limit is ``MLXCLUSTER_LEASE_S`` in mlxcluster's environment, default
``DEFAULT_LEASE_S``; a host's ranks stop within limit + one step + the
checkpoint (or the grace, ``MLXCLUSTER_LEASE_GRACE_S``, 60 s by default).
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from mlxcluster.errors import InputError
from mlxcluster.jobs.hosts import RankHost, distinct_hosts, run_script
from mlxcluster.jobs.job import Job
from mlxcluster.jobs.rank_wrapper import (
    LEASE_FILE,
    LEASE_GRACE_VAR,
    LEASE_VAR,
    STACKS_ROOT,
)

DEFAULT_LEASE_S = 30.0
RENEWALS_PER_LEASE = 6  # a host may miss five touches in a row (a loaded ssh) and keep its ranks
MIN_LEASE_S = 2.0


def lease_seconds(environ: Mapping[str, str]) -> float:
    """The lease's limit from ``MLXCLUSTER_LEASE_S`` (default DEFAULT_LEASE_S)."""
    value = environ.get(LEASE_VAR, "")
    if not value:
        return DEFAULT_LEASE_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds < MIN_LEASE_S:
        raise InputError(f"{LEASE_VAR}={value!r} is not a number of seconds >= {MIN_LEASE_S:.0f}",
                         f"unset it (the default is {DEFAULT_LEASE_S:.0f} s) or give e.g. "
                         f"{LEASE_VAR}=60")
    return seconds


def leased_job(job: Job, environ: Mapping[str, str]) -> Job:
    """``job`` with every rank told to watch its lease (and its grace, when
    set here): the rank wrapper reads both from its environment."""
    env = {**job.env, LEASE_VAR: f"{lease_seconds(environ):g}"}
    if environ.get(LEASE_GRACE_VAR):
        env[LEASE_GRACE_VAR] = environ[LEASE_GRACE_VAR]
    return replace(job, env=env)


def lease_path(job: Job, run_id: str) -> str:
    """Where every rank of ``job`` looks for its lease (the rank wrapper's
    stacks directory, on each host)."""
    directory = job.env.get("MLXCLUSTER_STACKS_DIR") or f"{STACKS_ROOT}/{run_id}"
    return f"{directory}/{LEASE_FILE}"


def renew_script(path: str) -> str:
    folder = shlex.quote(os.path.dirname(path))
    return f"mkdir -p {folder} && touch {shlex.quote(path)}"


class Lease:
    """Keeps a job's lease renewed on every host while it is entered."""

    def __init__(self, job: Job, run_id: str, env: Mapping[str, str] | None = None):
        self.limit = float(job.env.get(LEASE_VAR) or lease_seconds(env or {}))
        self.every = self.limit / RENEWALS_PER_LEASE
        self.path = lease_path(job, run_id)
        self.hosts = distinct_hosts(job.hosts)
        self.env = dict(env) if env is not None else None
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        self.last_renewed: dict[str, float] = {}  # host name -> monotonic time

    def renew(self, host: RankHost) -> bool:
        if host.is_local:
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                Path(self.path).touch()
            except OSError:
                return False
            return True
        return run_script(host, renew_script(self.path), timeout=max(self.limit / 2, 1.0),
                          env=self.env).ok

    def _keep(self, host: RankHost) -> None:
        while not self.stopped.is_set():
            if self.renew(host):
                self.last_renewed[host.name] = time.monotonic()
            self.stopped.wait(self.every)

    def __enter__(self) -> Lease:
        for host in self.hosts:
            thread = threading.Thread(target=self._keep, args=(host,), daemon=True,
                                      name=f"lease-{host.name}")
            thread.start()
            self.threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        # A touch still under way would make the run's folder again after
        # the sweep removed it: wait for it (each is bounded by its timeout).
        for thread in self.threads:
            thread.join(timeout=self.limit / 2 + 2)
