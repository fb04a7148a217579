"""The job from the launch flags: where its ranks run and with what.

Every command that launches a job (`run`, `train`, `serve`) or looks at the
jobs on the hosts (`jobs`, `attach`, `stop`) takes the same flags: an
mlx.launch hostfile (with the settings ``mlxcluster tune`` recorded beside
it), ``--local N`` ranks on this machine, else an inventory (``-i`` or the
default one). ``JobSource`` holds them as given; ``choose_job`` makes the
job. What it picked up and from where is said as an ``Aside`` event (on
stderr: stdout stays the job's).

Light on purpose: `run --no-preflight` imports this (cli/job_launch.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from mlxcluster.errors import InputError
from mlxcluster.hostfile.tuned import tuned_job
from mlxcluster.inventory.inventory import Inventory, load_inventory
from mlxcluster.inventory.inventory_search import find_inventory
from mlxcluster.jobs.events import Aside, OnEvent
from mlxcluster.jobs.job import Job, job_from_hostfile, job_from_inventory, job_local


@dataclass(frozen=True)
class JobSource:
    """The launch flags as given (None: not given): ``--hostfile``, ``-i``,
    ``--local N``, ``--backend``, ``--python``, ``--mpi-arg`` and
    ``--connections-per-ip``."""

    hostfile: str | None = None
    inventory_path: str | None = None
    local_ranks: int | None = None
    backend: str | None = None
    python: str | None = None
    mpi_args: tuple[str, ...] = ()
    connections_per_ip: int | None = None


def one_source(command: str, source: JobSource, *, example: str) -> None:
    """InputError unless at most one of --hostfile, -i, --local is given."""
    if len([s for s in (source.hostfile, source.inventory_path, source.local_ranks) if s]) > 1:
        raise InputError("give one of --hostfile FILE, -i INVENTORY or --local N, not several",
                         f"with none of them {command} uses the default inventory "
                         f"(./cluster.yaml...); e.g. mlxcluster {command} {example}")


def choose_job(source: JobSource, on_event: OnEvent) -> tuple[Job, Inventory | None]:
    """The job from ``source``: a hostfile, --local N, else the inventory (-i
    or the default one, named in an ``Aside`` when found by default), with the
    settings tune recorded beside a hostfile (``pick_up_tuned``). Returns (the
    job, the inventory or None)."""
    python = source.python or sys.executable
    mpi_args = tuple(source.mpi_args)
    inventory = None
    if source.hostfile:
        job = job_from_hostfile(source.hostfile, source.backend, python, mpi_args)
    elif source.local_ranks:
        job = job_local(source.local_ranks, source.backend or "ring", python, mpi_args)
    else:
        choice = find_inventory(source.inventory_path, other_sources="--hostfile FILE or --local N")
        if not choice.given:
            on_event(Aside(choice.describe()))
        inventory = load_inventory(choice.path)
        job = job_from_inventory(inventory, source.backend or "ring", mpi_args)
    return pick_up_tuned(job, source.hostfile, source.connections_per_ip, on_event), inventory


def pick_up_tuned(job: Job, hostfile: str | None, connections_per_ip: int | None,
                  on_event: OnEvent) -> Job:
    """The job with the settings ``mlxcluster tune`` recorded beside the
    hostfile (HOSTFILE.args), the command line's flags winning; what it
    picked up and from where, each an ``Aside``."""
    job, notes = tuned_job(job, hostfile, connections_per_ip)
    for note in notes:
        on_event(Aside(note))
    return job
