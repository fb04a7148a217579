"""A model served by mlx-lm's own server on every rank, supervised.

``serve_until_stopped`` launches ``python -m mlx_lm server`` on every rank
of a prepared job (the jobs layer: rank wrapper, lease, sweep), opens the
way to rank 0's port (``tunnel.py``), watches it with the probe
(``probe.py``) and, when a rank exits or the probe gets no answer, lets the
jobs layer diagnose and stop every rank, then launches again
(launch/supervisor.py ``supervise``), up to the restart budget. The front
(``front.py``), opened by the caller, keeps the one address meanwhile.

It ends when the restarts are spent (``ServeFailed``), or returns how it
ended (a ``JobResult``: `mlxcluster stop`, or a signal). Ctrl-C or SIGTERM
first drains (``Drain``): new requests get 503, the ones admitted finish
within --drain-timeout; then, or at a second signal, every rank is stopped
on every host as any job is.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from mlxcluster import interrupts
from mlxcluster.errors import EXIT_STALLED, InputError, Interrupted, MlxclusterError
from mlxcluster.fit.split import SplitVerdict, even_split
from mlxcluster.fit.split_check import check_split, refusal
from mlxcluster.fit.stage_files import files_left_out, layer_count
from mlxcluster.jobs.events import Note, OnEvent, Restarting
from mlxcluster.jobs.job import Job
from mlxcluster.jobs.preflight import probe_facts
from mlxcluster.jobs.restarts import Restarts
from mlxcluster.jobs.run import run_job
from mlxcluster.jobs.running import register_run_kind
from mlxcluster.jobs.stall import Stalled
from mlxcluster.jobs.watch import RunOutcome
from mlxcluster.launch.on_hosts import HeldOnHosts
from mlxcluster.launch.program import numbered, program_job
from mlxcluster.launch.session import LaunchFlags, LaunchRequest
from mlxcluster.launch.supervisor import JobResult, Words, supervise
from mlxcluster.launch.sync import SERVED_MODEL
from mlxcluster.serve.front import Backend
from mlxcluster.serve.journal import ServeJournal
from mlxcluster.serve.pipeline_rank import SPLIT_ENV, parse_split
from mlxcluster.serve.probe import ProbeWatch, probe_once
from mlxcluster.serve.tunnel import free_port_on, open_tunnel

SERVER_MODULE = ("-m", "mlx_lm", "server")  # mlx-lm's entry point (`-m mlx_lm.server` is deprecated)
# mlx-lm's server running serve's split by memory (its docstring says why a module of ours)
PIPELINE_RANK_MODULE = ("-m", "mlxcluster.serve.pipeline_rank")
SERVE_PREFIX = register_run_kind("mlxserve", "serve")  # its run ids


# mlx_lm.server's flags that serve sets on every rank itself, and what to
# give serve instead. Passed after `--` they would win over serve's (the last
# flag counts): rank 0 listening where serve does not probe, or the split not
# the one checked.
SERVE_OWNS = {
    "--model": "give the model as serve's MODEL_DIR argument",
    "--host": "rank 0's server listens on its host's loopback, reached through serve's front; "
              "use serve's --bind for the address clients reach",
    "--port": "use serve's --port (the one address here; rank 0's port is chosen per launch)",
    "--pipeline": "use serve's --pipeline, before MODEL_DIR",
}


def refuse_owned_args(server_args: tuple[str, ...]) -> None:
    """``InputError`` (exit 2) for an mlx_lm.server flag serve sets itself
    (``SERVE_OWNS``), its ``--flag=value`` form or an abbreviation argparse
    would take for it (``--po``)."""
    for arg in server_args:
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or len(name) < 4:
            continue
        for flag, instead in SERVE_OWNS.items():
            if flag.startswith(name):
                raise InputError(f"'{arg}' after '--' is mlx_lm.server's {flag}, which serve "
                                 "sets itself on every rank", instead)


@dataclass(frozen=True)
class ServeSpec:
    """What to serve and how it is watched (serve's flags)."""

    model: str  # the model folder, absolute: the same path on every host
    pipeline: bool = False
    probe_every: float = 10.0
    probe_timeout: float = 30.0
    start_timeout: float = 900.0
    server_args: tuple[str, ...] = ()  # after `--`: passed on to mlx_lm.server
    request_timeout: float | None = None  # one request's limit at the front (None: none)
    drain_timeout: float = 30.0  # at Ctrl-C/SIGTERM: how long the admitted requests may finish

    def __post_init__(self) -> None:
        refuse_owned_args(self.server_args)

    @property
    def split(self) -> str:
        return "pipeline" if self.pipeline else "tensor"


@dataclass(frozen=True)
class ServeUp:
    """Rank 0's server answered its first probe (``launch``: 0 first)."""

    launch: int
    seconds: float  # since that launch
    host: str  # rank 0's


class ServeFailed(MlxclusterError):
    """The server failed more often than the restart budget allows."""

    exit_code = EXIT_STALLED


def server_program(spec: ServeSpec, port: int, split: str | None = None) -> tuple[str, ...]:
    """What every rank's python runs: mlx-lm's server on rank 0's loopback
    at ``port`` (only rank 0 listens; the others follow its requests); with
    a ``split`` by memory (``SPLIT_ENV`` in the job's env), through
    serve/pipeline_rank.py, which gives mlx-lm's pipeline() that split."""
    module = PIPELINE_RANK_MODULE if spec.pipeline and split else SERVER_MODULE
    return (*module, "--model", spec.model, "--host", "127.0.0.1", "--port", str(port),
            *(("--pipeline",) if spec.pipeline else ()), *spec.server_args)


def server_job(job: Job, spec: ServeSpec) -> Job:
    """The chosen job running mlx-lm's server (``program_job``: the preflight
    judges mlx_lm on every host as for `run -m mlx_lm`); each launch gives
    rank 0's server its port (``serve_until_stopped``)."""
    return replace(program_job(job, server_program(spec, 0)), title="the server")


def check_job_split(job: Job, model_dir: str | Path, *, pipeline: bool,
                    env: dict[str, str] | None = None) -> SplitVerdict:
    """``check_split`` for the ranks of ``job``, each host's memory asked
    with the job's python (one probe per host)."""
    facts = probe_facts(job, env)
    return check_split(model_dir, [h.name for h in job.hosts], facts, pipeline=pipeline)


def split_fits(job: Job, env: dict[str, str], on_event: OnEvent, *, model_dir: str | Path,
               pipeline: bool, backend: Backend | None = None,
               on_hosts: str | None = None) -> Job:
    """serve's check in its launch session (launch/session.py ``HostCheck``),
    once the python is found, before anything is sent or launched: the refusal
    (exit 2) when the model cannot be split so over ``job``'s ranks, else
    the split said as a ``Note`` (and each host's line kept for the status
    page). Returns the job, with ``--pipeline``'s split by memory in its env
    (``SPLIT_ENV``) when the layers go by each host's memory: every launch
    runs it (``server_program``), and each host is sent its stage's files.
    ``on_hosts``: ``model_dir`` is a view of that folder, which every host
    holds whole already (--download-on): the verdict names it, not the view."""
    verdict = check_job_split(job, model_dir, pipeline=pipeline, env=env)
    if on_hosts is not None:
        verdict = replace(verdict, model=on_hosts)
    if not verdict.ok:
        raise refusal(verdict)
    if backend is not None:
        backend.status.split_judged([f"{h.host}: {h.line()}" for h in verdict.hosts])
    on_event(Note(f"split: {verdict.summary()}"))
    if pipeline and on_hosts is not None:
        on_event(Note("split: every host holds the whole model (--download-on): each rank loads "
                      "its stage's weight files there, nothing sent"))
    line = verdict.split_line()
    if line is None:
        return job
    on_event(Note(f"split: {line}"))
    return replace(job, env={**job.env, SPLIT_ENV: ",".join(map(str, verdict.split))})


def split_of(job: Job) -> tuple[int, ...] | None:
    """The split by memory ``split_fits`` put in the job's env (None: mlx-lm's even split)."""
    text = job.env.get(SPLIT_ENV)
    return tuple(parse_split(text)) if text else None


def stage_files(job: Job, model_dir: str) -> dict[str, frozenset[str]]:
    """``--pipeline``: host name -> the weight files of ``model_dir`` none of
    its ranks' stages loads (fit/stage_files.py): left out of its copy."""
    split = split_of(job) or even_split(layer_count(model_dir), len(job.hosts))
    left_out = files_left_out(model_dir, split)
    hosts: dict[str, frozenset[str]] = {}
    for rank, host in enumerate(job.hosts):  # a host of two ranks needs both stages' files
        hosts[host.name] = hosts[host.name] & left_out[rank] if host.name in hosts else left_out[rank]
    return hosts


def serving_request(spec: ServeSpec, flags: LaunchFlags, *, send_model: bool,
                    backend: Backend | None = None, view: str | None = None) -> LaunchRequest:
    """The launch session's request for `mlxcluster serve`: the server on
    every rank, the split judged before anything is sent (``split_fits``), and
    unless not ``send_model`` the model folder on every host. ``view``: the
    model is only on the hosts (--download-on: launch/on_hosts.py), whole on
    each and checked; the split is judged on this view of it here, and
    nothing is sent."""
    return LaunchRequest(flags, SERVE_PREFIX, program=partial(server_job, spec=spec),
                         check=partial(split_fits, model_dir=view or spec.model,
                                       pipeline=spec.pipeline, backend=backend,
                                       on_hosts=spec.model if view else None),
                         models=(spec.model,) if send_model and view is None else (),
                         model_flag=SERVED_MODEL,
                         model_files=stage_files if spec.pipeline else None)


@dataclass(frozen=True)
class ServeRun:
    """A prepared serve job and what it keeps here (serve/session.py builds
    it): the front's backend (admission, status, metrics), the logs folder
    (a stall's report) and serve.log."""

    job: Job
    spec: ServeSpec
    backend: Backend
    run_id: str
    logs_dir: Path
    journal: ServeJournal


def serve_until_stopped(run: ServeRun, restarts: Restarts, env: dict[str, str], *,
                        on_line: Callable[[str, str], None], on_event: OnEvent,
                        on_up: Callable[[ServeUp], None]) -> JobResult:
    """Serve until interrupted (the result ``interrupted``: every rank
    stopped), the restarts are spent (raises ``ServeFailed``, or the last
    stall), or `mlxcluster stop` ends the run (its ``asked_to_stop``); each
    launch, restart, time up and the stop written to ``run.journal`` (serve.log)."""
    job, spec, backend, run_id = run.job, run.spec, run.backend, run.run_id
    logs_dir, journal = run.logs_dir, run.journal
    backend.admission.settle(job.backend)  # --max-in-flight left out: by the backend
    on_event = journaled(journal, kept(backend, on_event))
    drain = Drain(backend, spec.drain_timeout, on_event)
    try:
        with interrupts.first_signal_calls(drain.start) as stop_now:
            drain.stop_now = stop_now
            result = _serve(job, spec, backend, restarts, env, run_id, logs_dir, on_line,
                            on_event, journaled(journal, on_up), drain)
    except (Interrupted, interrupts.Stop) as stop:
        # Stop: a signal while no rank ran (the drain's end after the server hung or
        # exited: every rank already stopped), not raised through run_job's sweep.
        journal.stopped(stop if isinstance(stop, Interrupted) else
                        f"interrupted ({interrupts.signal_name(stop.signum)})")
        return JobResult(job, RunOutcome(0, run_id=run_id), Words("serve", logs=logs_dir),
                         restarts.done, interrupted=True)
    journal.stopped(f"asked ('mlxcluster stop {run_id}'): every rank ended")
    return result


class Drain:
    """The first Ctrl-C or SIGTERM: new requests refused (503), the admitted
    ones finish, within ``timeout`` seconds; then the ranks are stopped as
    at any interrupt (``stop_now``: the signal again, in the main thread)."""

    def __init__(self, backend: Backend, timeout: float, on_event: OnEvent):
        self.backend, self.timeout, self.on_event = backend, timeout, on_event
        self.stop_now: Callable[[int], None] = lambda signum: None
        self.signum: int | None = None  # the signal that started the drain

    def server_ended(self, who: str) -> None:
        """The server ended while draining (``who``: which rank, how): what
        was admitted cannot finish, and serve is stopping anyway, so stop as
        at a second signal instead of launching the server again."""
        if self.signum is None:
            return
        self.on_event(Note(f"drain: {who} during the drain: not launched again, stopping"))
        self.stop_now(self.signum)

    def start(self, signum: int) -> None:
        self.signum = signum
        name = interrupts.signal_name(signum)
        self.backend.drain(f"serve is stopping ({name})")
        waiting = self.backend.admission.counts()[1]
        flights = len(self.backend.in_flight())  # requests: the probe is not one
        self.on_event(Note(f"{name}: draining, no new requests; {flights} in flight and {waiting} "
                           f"waiting may finish within {self.timeout:g} s (--drain-timeout); "
                           f"{name} again stops at once"))
        threading.Thread(target=self._wait, args=(signum,), name="serve-drain",
                         daemon=True).start()

    def _wait(self, signum: int) -> None:
        deadline = self.backend.clock() + self.timeout
        while not self.backend.idle() and self.backend.clock() < deadline:
            threading.Event().wait(0.1)
        if not self.backend.idle():
            waiting = self.backend.admission.counts()[1]
            self.on_event(Note(f"drain: {len(self.backend.in_flight())} request(s) still in "
                               f"flight and {waiting} waiting "
                               f"after {self.timeout:g} s: cut"))
        self.stop_now(signum)


def kept(backend: Backend, then: OnEvent) -> OnEvent:
    """``then``, each restart's cause kept for the status page first."""
    def keep(event: object) -> None:
        if isinstance(event, Restarting):
            backend.status.restarted(event.cause)
        then(event)
    return keep


def journaled(journal: ServeJournal, then: Callable) -> Callable:
    """``then``, each event or ServeUp written to ``journal`` first."""
    def both(what) -> None:
        if isinstance(what, ServeUp):
            journal.up(what.launch, what.seconds)
        else:
            journal.event(what)
        then(what)
    return both


def _serve(job, spec, backend, restarts, env, run_id, logs_dir, on_line, on_event, on_up,
           drain: Drain) -> JobResult:
    metrics = backend.metrics
    ended: list[str] = []  # how the last launch ended: "hang" or "exit"

    def launch_one(job: Job, k: int, say) -> RunOutcome:
        if k and ended:
            metrics.restarts.labels(ended[-1]).inc()
        metrics.launches.inc()
        metrics.ranks([h.name for h in job.hosts])
        backend.status.launched([h.name for h in job.hosts])
        rank0 = job.hosts[0]
        port = free_port_on(rank0, env)
        job = replace(job, program=server_program(spec, port, job.env.get(SPLIT_ENV)))
        say(job, f"mlx-lm's server, rank 0 on {rank0.name} at its 127.0.0.1:{port}")
        tunnel = open_tunnel(rank0, port, env)
        watch = ProbeWatch(lambda t: probe_once(tunnel.port, t), backend, tunnel.port,
                           every=spec.probe_every, timeout=spec.probe_timeout,
                           start_timeout=spec.start_timeout,
                           on_up=lambda s: on_up(ServeUp(k, s, rank0.name)))
        watch.start()
        ended.append("hang")  # unless the launch returns: a stall is raised
        try:
            outcome = run_job(job, on_line, env=env, report_dir=logs_dir, run_id=run_id,
                              watch=watch)
            ended[-1] = "exit"
        except Stalled:
            if backend.stopping is not None:  # draining: no restart either
                drain.server_ended("the server hung")
            raise
        finally:
            backend.down("the server is restarting")
            watch.stop()
            tunnel.close()
        if outcome.exit_code == 0:  # a server that ends on its own has failed all the same
            outcome = replace(outcome, exit_code=1)
        if backend.stopping is not None:  # draining: stop, no restart (raises in this thread)
            drain.server_ended(f"{outcome.who} exited with code {outcome.exit_code}")
        return outcome

    result = supervise(numbered(job, 0)[0], launch_one, restarts, env, run_id=run_id,
                       words=Words("serve", logs=logs_dir), on_event=on_event, again=numbered)
    outcome = result.outcome
    if outcome.asked_to_stop:
        return result
    if outcome.refused_at_start:
        words = outcome.usage_words()
        raise InputError(f"the server refused to start: {outcome.who} exited with code 2 before "
                          f"its first answer (a usage error){f': {words}' if words else ''}; every "
                          "rank was stopped, none restarted (a restart would be refused the same "
                          "way)", "correct the arguments after '--' ('python -m mlx_lm server "
                          "--help' lists them)")
    spent = f"after {restarts.done} restart(s) (--max-restarts {restarts.max_restarts})"
    raise ServeFailed(f"the server stopped: {outcome.who} exited with code {outcome.exit_code} "
                      f"{spent}; every rank was stopped",
                      "its lines are above and in the logs; raise --max-restarts, or run "
                      "'mlxcluster doctor' to check the hosts")


def model_named(model: str, download_on: str | None) -> str:
    """MODEL_DIR as serve's spec names it until the hosts hold it: with
    --download-on, the Hugging Face id that host downloads (InputError, exit 2,
    when it is none, or a folder here); else the folder here (`absolute_model`)."""
    if download_on:
        from mlxcluster.launch.pull import id_to_download

        id_to_download(model)
        return model
    return absolute_model(model)


def with_model_held(spec: ServeSpec, held: HeldOnHosts | None) -> tuple[ServeSpec, str | None]:
    """(the spec, the view here that serve's checks read in the model's place):
    with --download-on, the folder every host holds (``held``: launch/on_hosts.py)
    and its view; else the spec as it is, read from its folder here."""
    if held is None:
        return spec, None
    return replace(spec, model=held.folder), held.view


def absolute_model(folder: str) -> str:
    """The model folder as every host will have it: absolute, as here (a
    Hugging Face id: its folder in huggingface_hub's cache, downloaded there
    when missing: launch/pull.py); InputError (exit 2) when it is missing or
    holds no config.json."""
    from mlxcluster.launch.pull import as_folder

    folder = as_folder(folder)
    if not Path(folder).expanduser().exists():
        raise InputError(f"{folder} does not exist",
                         "give a model folder: the one mlx-lm downloaded or converted "
                         "(mlx_lm.convert), e.g. ~/.cache/huggingface/hub/models--ORG--NAME/"
                         "snapshots/HASH")
    if not (Path(folder).expanduser() / "config.json").is_file():
        raise InputError(f"{folder} is not a model folder (no config.json in it)",
                         "give the folder mlx-lm downloaded or converted (mlx_lm.convert), e.g. "
                         "~/.cache/huggingface/hub/models--ORG--NAME/snapshots/HASH")
    return os.path.abspath(os.path.expanduser(folder))
