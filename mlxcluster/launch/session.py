"""One launch session: the steps every command that launches a job takes,
in one order, from a typed request to a job ready to launch.

`run`, `train` and `serve` each ask for a job the same way: a
``LaunchRequest`` (the launch flags as ``LaunchFlags``, the command's
program, its own check, the files its ranks need on every host). Then
``launch_session(request, env, on_event)``, a context manager, does:

1. ``choose_job``: the job from -i / --hostfile / --local, --backend,
   --python, --mpi-arg, with what tune recorded (launch/job_source.py);
2. ``request.program(job)``: the command's program on the job (and its
   checks against the ranks: train's batch split, run's script here);
3. ``plan_backend``: jaccl's rdma rows (exit 3 naming a host that cannot
   take part), the MLX_METAL_FAST_SYNCH warning;
4. shared ssh connections, one per host, until the session ends;
5. ``prepare_job`` on the hosts: the job's python on every host (exit 2
   when missing), then ``request.check(job, env, on_event)`` before anything
   else is checked, sent or launched (serve: can the model be split so;
   train: the same run not running there), run's script sent where it is
   missing (the preflight looks for it), what ranks import of this project
   (launch/code.py), the preflight (launch/preflight.py: the probe with the
   job's ``imports``, doctor's checks, OpenBLAS, the all_sum), then the
   model folders (``sync_model``) and data folders (``sync_data``).

It yields a ``PreparedJob`` (the job as it will run, its inventory, a new
run id, the cluster's mlx version when the preflight asked); the caller
launches it through the jobs layer, within the session (the connections
close when it ends). Every step is reported as an event (jobs/events.py):
nothing here prints; a problem raises an MlxclusterError with its fix.

The three callers (``flags``: ``LaunchFlags`` from the command's launch
options, ``view``: an event renderer, ``env``: the environment)::

    # mlxcluster run -- script.py ARGS
    request = program_request(argv, flags, detached=False, send_script=True)
    with launch_session(request, env, view) as prepared:
        done = run_program(prepared.job, Restarts(0), env, run_id=prepared.run_id,
                           logs_dir=None, timeout=None, stall_timeout=None,
                           rank0_only=False, on_line=show, on_event=view)

    # mlxcluster train -- --data D --init_from M --out O
    request = training_request(args, flags, detached=False, send_folders=True)
    with launch_session(request, env, view) as prepared:
        done = run_trainer(prepared.job, args, Restarts(2), env, timeout=None,
                           stall_timeout="auto", on_line=show, on_event=view,
                           run_id=prepared.run_id)

    # mlxcluster serve MODEL_DIR: mlx-lm's server on every rank (the preflight
    # checks every host imports mlx_lm, as `run -m mlx_lm` does), the split
    # judged before anything is sent, the model folder sent to every host
    # that lacks it; then launched through the jobs layer, supervised
    request = LaunchRequest(flags, "mlxserve",
                            program=partial(program_job, argv=("-m", "mlx_lm", "server", ...)),
                            check=split_fits, models=(model_dir,))
    with launch_session(request, env, view) as prepared:
        served = ServedModel(spec, front, prepared, logs_dir=None)  # serve/session.py
        done = served.serve(Restarts(3), env, on_line=show, on_event=view, on_up=say_up)

(``program_request``, ``program_job``, ``run_program``: launch/program.py;
``training_request``, ``run_trainer``: launch/trainer.py; serve's request is
``serve/serving.py`` ``serving_request``, its ``check`` ``split_fits``
there.) Each ``done`` is a ``JobResult`` (launch/supervisor.py: the half after
launch, written once), said by ``ending(done)``.

Light on purpose: `run --no-preflight` imports this, the jobs layer and the
inventory only; the preflight, the folder sending and the code sending are
imported when they run (docs/performance-history.md, run over bare mlx.launch).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace

from mlxcluster.hostfile.jaccl_plan import fast_synch_warning
from mlxcluster.inventory.inventory import Inventory
from mlxcluster.jobs.cleanup import new_run_id
from mlxcluster.jobs.connections import shared_connections
from mlxcluster.jobs.events import Note, OnEvent, Warned
from mlxcluster.jobs.hosts import remote_hosts
from mlxcluster.jobs.job import Job, plan_jaccl_job, script_path
from mlxcluster.jobs.job_python import require_job_python
from mlxcluster.launch.job_source import JobSource, choose_job


@dataclass(frozen=True)
class LaunchFlags:
    """What every launching command's launch options say (cli/params.py
    ``launch_options``): where the ranks run, and which checks and sends
    come before the launch (``--no-preflight``, ``--no-openblas``,
    ``--no-sync-code`` turn them off)."""

    source: JobSource
    preflight: bool = True
    openblas: bool = True
    send_code: bool = True


# A command's own check of the chosen job on its hosts (serve: the model's
# split fits, said as a Note; train: the same run is not running there):
# called with (job, env, on_event) once the job's python is found on every
# host (the check may run it there), before anything else is checked, sent
# or launched. Raises an MlxclusterError (InputError: exit 2). Returns the
# job as the check leaves it (serve's split by memory in its env), or None:
# unchanged.
HostCheck = Callable[[Job, dict[str, str], OnEvent], "Job | None"]
# Which files of a model folder each host goes without (serve --pipeline: the
# weight files no stage of its ranks loads): (job, folder) -> host name -> names.
ModelFilesLeftOut = Callable[[Job, str], Mapping[str, frozenset[str]]]


@dataclass(frozen=True)
class LaunchRequest:
    """What a command asks of a launch session.

    ``program``: the chosen job made the command's (its program, imports,
    title; None: as chosen), raising InputError when it cannot run on those
    ranks. ``send_script``: a script the job starts (``script_path``) is
    checked on every remote host and sent where missing, before the
    preflight (which looks for it). ``models`` / ``data``: folders sent to
    every host that lacks them (launch/sync.py), after the preflight."""

    flags: LaunchFlags
    run_prefix: str  # the run id's: mlxrun, mlxtrain... (jobs/cleanup.py new_run_id)
    program: Callable[[Job], Job] | None = None
    detached: bool = False
    check: HostCheck | None = None
    send_script: bool = True
    models: tuple[str, ...] = ()
    model_flag: str = "--init_from"  # how messages about ``models`` name them
    data: tuple[str, ...] = ()
    model_files: ModelFilesLeftOut | None = None  # None: every host gets every file of ``models``


@dataclass(frozen=True)
class PreparedJob:
    """A job ready to launch, as the session left it."""

    job: Job  # with its hosts on the session's shared connections
    inventory: Inventory | None  # None for --hostfile and --local
    run_id: str
    mlx_version: str | None  # the cluster's, when the preflight asked (None with --no-preflight)


@contextmanager
def launch_session(request: LaunchRequest, env: dict[str, str],
                   on_event: OnEvent) -> Iterator[PreparedJob]:
    """The job of ``request`` chosen, planned and prepared on its hosts (the
    module docstring's steps); yields it ready to launch. The hosts' shared
    ssh connections stay open until the session ends, however it ends."""
    job, inventory = choose_job(request.flags.source, on_event)
    if request.program is not None:
        job = request.program(job)
    job = plan_backend(replace(job, detached=request.detached), inventory, env, on_event)
    run_id = new_run_id(request.run_prefix)
    with shared_connections(job, env) as job:
        job, mlx_version = prepare_job(job, inventory, request, env, on_event)
        yield PreparedJob(job, inventory, run_id, mlx_version)


def plan_backend(job: Job, inventory: Inventory | None, env: dict[str, str],
                 on_event: OnEvent) -> Job:
    """jaccl / jaccl-ring: the rdma rows and env (from the hosts' live
    topology with -i; exit 3 naming every host that cannot take part), and
    the MLX_METAL_FAST_SYNCH warning. Other backends: the job unchanged."""
    job = plan_jaccl_job(job, inventory, env)
    warning = fast_synch_warning(job.env) if job.mlx_hostfile is not None else None
    if warning:
        on_event(Warned(warning))
    return job


def prepare_job(job: Job, inventory: Inventory | None, request: LaunchRequest,
                env: dict[str, str], on_event: OnEvent) -> tuple[Job, str | None]:
    """Before the launch, on the hosts: the python looked for on every host
    (a missing one is exit 2), ``request.check``, the script sent
    (``send_script``), what ranks import of this project sent to every
    remote host that lacks this version (launch/code.py; not without
    ``send_code``: the ranks then import from this checkout's path), the
    preflight (unless turned off), then the model and data folders. Returns
    (the job, the cluster's mlx version or None)."""
    flags = request.flags
    require_job_python(job, env)  # the check, sends and preflight below run on the job's python
    if request.check is not None:
        job = request.check(job, env, on_event) or job
    remote = bool(remote_hosts(job.hosts))
    if remote and request.send_script and script_path(job):
        job = send_script(job, env, on_event)
    if remote and flags.send_code:
        from mlxcluster.launch.code import sync_code  # remote jobs only: see the module docstring

        job = sync_code(job, env, on_event)
    mlx_version = None
    if flags.preflight:
        from mlxcluster.launch.preflight import preflight  # heavy: see the module docstring

        job, mlx_version = preflight(job, env, on_event, no_openblas=not flags.openblas,
                                     inventory=inventory)
    if request.models or request.data:  # every Mac has its own disk
        from mlxcluster.launch.sync import sync_data, sync_model

        for folder in request.models:
            left_out = request.model_files(job, folder) if request.model_files else None
            sync_model(job, folder, env, on_event, flag=request.model_flag, left_out=left_out)
        for folder in request.data:
            sync_data(job, folder, env, on_event)
    return job, mlx_version


def send_script(job: Job, env: dict[str, str], on_event: OnEvent) -> Job:
    """The job's script on every host, at one path (every Mac has its own
    disk): sent where missing or different. A script that is not on this
    machine is left to the hosts (the preflight looks for it there)."""
    script = script_path(job)
    if not os.path.isfile(script):
        on_event(Note(f"script: {script} is not on this machine: not sent (every host must "
                      "have it at that path)"))
        return job
    from mlxcluster.launch.sync import sync_script

    sync_script(job, script, env, on_event)
    return replace(job, program=(os.path.abspath(script), *job.program[1:]))
