"""Hand-off to the reference trainer (or `mlxcluster run`'s own program,
``TrainJob.program``): preflight, then one process per host.

Flow (`mlxcluster train`): build a `TrainJob` from an inventory, an mlx.launch
hostfile or `--local N`; `probe_hosts` runs the job's python on every host over
non-interactive SSH (mlx version, reference_train importable, OpenBLAS path);
`check_probes` turns that into problems; `smoke_all_sum` runs the smoke
worker (all_sum only) across every rank on the chosen backend; `launch_training` starts
`python -m reference_train.train` on every host (ring: mlx.launch, MPI: mpirun),
streams the output line by line to a callback, and reads back which rank failed
and its exit code (mlx.launch itself exits 0 when a rank fails).

Every rank runs under mlxcluster.jobs.rank_wrapper (its Python stacks on SIGUSR1)
and prints heartbeat lines (MLXCLUSTER_HEARTBEAT=1); the launcher hides those
and feeds them to a stall.StallWatch. A job with no progress for its stall
timeout is diagnosed (each rank's state and stacks, stall.py), stopped on
every rank and reported as stall.Stalled (exit code 4).

When ranks fail: mlx.launch (ring) terminates the other ranks over SSH once one
exits non-zero; mpirun (MPI) aborts the whole job. Either way the run ends with
nothing left running, and `TrainOutcome.exit_code` is the failing rank's code.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from mlxcluster import interrupts
from mlxcluster.jobs import stall
from mlxcluster.blas import OPENBLAS_CANDIDATES
from mlxcluster.errors import BackendUnavailable, InputError, Interrupted, MlxclusterError
from mlxcluster.hostfile import BACKENDS as MLX_BACKENDS
from mlxcluster.hostfile import load_mlx_hostfile
from mlxcluster.inventory import Host, Inventory, local_inventory
from mlxcluster.launcher_ssh import launcher_environment
from mlxcluster.mpi import find_libmpi, libmpi_env, no_tree_spawn_args, require_mpirun
from mlxcluster.openssh import ssh_argv
from mlxcluster.smoke import launch as smoke_launch
from mlxcluster.smoke import remote as smoke_remote
from mlxcluster.smoke.launch import WorkerOptions
from mlxcluster.smoke.preflight import require_python_here
from mlxcluster.smoke.remote import for_each_host
from mlxcluster.smoke.run import run_backend
from mlxcluster.jobs.cleanup import (
    LauncherStopNoise,
    lost_host,
    marked_program,
    new_run_id,
    sweep,
    unstopped_hint,
)

if TYPE_CHECKING:
    from reference_train.train import TrainConfig

BACKENDS = ("ring", "mpi")
PROBE_TIMEOUT = 30.0
SMOKE_TIMEOUT = 90.0  # per phase: the ring backend retries connects for ~30 s before failing
# The train preflight only needs the group to form and sum: all_sum of a few float32s.
SMOKE_OPTIONS = WorkerOptions(dtypes=("float32",), lo_bytes=16, hi_bytes=16, ops=("all_sum",))

# Runs on each host with the job's python; one JSON line back.
PROBE_SCRIPT = """
import json, os, platform, sys
out = {"python": sys.executable, "platform": sys.platform, "host": platform.node(),
       "cpus": os.cpu_count() or 1}
try:
    import importlib.metadata as md
    import mlx.core
    out["mlx"] = md.version("mlx")
except Exception as e:
    out["mlx_error"] = f"{type(e).__name__}: {e}"
if NEED_TRAINER:
    try:
        import reference_train.train
        out["reference_train"] = True
    except Exception as e:
        out["reference_train_error"] = f"{type(e).__name__}: {e}"
if SCRIPT:
    out["script"] = os.path.isfile(SCRIPT)
try:
    import mlxcluster.jobs.rank_wrapper  # every rank runs under it (stall detection)
except Exception as e:
    out["rank_wrapper_error"] = f"{type(e).__name__}: {e}"
out["openblas"] = next((p for p in CANDIDATES if os.path.isfile(p)), None)
print("PROBE " + json.dumps(out))
"""

@dataclass(frozen=True)
class RankHost:
    """Where one rank runs: the ssh target and the IP the backend uses."""

    name: str
    ssh: str
    ip: str
    user: str | None = None
    port: int | None = None

    @property
    def is_local(self) -> bool:
        return self.ssh in ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class TrainJob:
    """Everything needed to start the trainer on every rank."""

    hosts: tuple[RankHost, ...]
    backend: str
    python: str
    trainer_args: tuple[str, ...] = ()
    ssh_config: str | None = None
    mpi_args: tuple[str, ...] = ()
    starting_port: int = 32323
    env: dict[str, str] = field(default_factory=dict)
    # The python arguments every rank runs (after the rank wrapper): None is
    # the reference trainer with trainer_args; `mlxcluster run` sets its own
    # (``("/abs/script.py", ARGS...)`` or ``("-m", "module", ARGS...)``).
    program: tuple[str, ...] | None = None
    tag_output: bool = False  # every rank's lines start with "[R] " (rank_wrapper)


@dataclass(frozen=True)
class HostProbe:
    """What the job's python reported on one host (or why it could not)."""

    host: RankHost
    facts: dict
    error: str | None = None


@dataclass(frozen=True)
class RunOutcome:
    """How a launched job ended: the exit code to return and which rank failed."""

    exit_code: int
    failed_rank: int | None = None
    seconds: float = 0.0
    lines: tuple[str, ...] = ()
    run_id: str = ""  # on every rank's command line (mlxcluster.jobs.cleanup)
    lost_host: str | None = None  # the host whose ssh connection failed or was lost
    unstopped: str | None = None  # hosts the final sweep could not reach, and what to run there


# ---------------------------------------------------------------- building a job


def package_root() -> Path:
    """The directory holding reference_train (put on PYTHONPATH for every rank)."""
    import reference_train

    return Path(reference_train.__file__).resolve().parent.parent


def job_from_inventory(inv: Inventory, backend: str, trainer_args: tuple[str, ...] = (),
                       mpi_args: tuple[str, ...] = ()) -> TrainJob:
    """A job with one rank per inventory host, all with the inventory's python."""
    check_backend(backend)
    pythons = sorted({h.python for h in inv.hosts})
    if len(pythons) > 1:
        raise InputError(f"hosts use different python paths {pythons}; mlx.launch and mpirun "
                         "start the same path everywhere",
                         "install the same venv at one path on every host")
    envs = {tuple(sorted(h.env.items())) for h in inv.hosts}
    if len(envs) > 1:
        raise InputError("hosts set different env values; mlx.launch and mpirun give every "
                         "rank one environment", "give every host the same env (the top-level env: applies to all)")
    hosts = tuple(RankHost(name=h.name, ssh=h.ssh, ip=h.data_ip, user=h.user, port=h.port)
                  for h in inv.hosts)
    return TrainJob(hosts=hosts, backend=backend, python=pythons[0], trainer_args=trainer_args,
                    ssh_config=inv.ssh_config, mpi_args=mpi_args, env=dict(envs.pop()))


def job_from_hostfile(path: str | Path, backend: str | None, python: str,
                      trainer_args: tuple[str, ...] = (),
                      mpi_args: tuple[str, ...] = ()) -> TrainJob:
    """A job from an mlx.launch hostfile ({"backend": ..., "hosts": [{"ssh", "ips"}]}),
    validated as ``hostfile check`` does."""
    hostfile = load_mlx_hostfile(path)
    backend = backend or hostfile.backend or "ring"
    check_backend(backend)
    hosts = [RankHost(name=h.ssh, ssh=h.ssh, ip=h.ips[0] if h.ips else h.ssh) for h in hostfile.hosts]
    return TrainJob(hosts=tuple(hosts), backend=backend, python=python,
                    trainer_args=trainer_args, mpi_args=mpi_args)


def job_local(n: int, backend: str, python: str, trainer_args: tuple[str, ...] = (),
              mpi_args: tuple[str, ...] = ()) -> TrainJob:
    """N ranks on this machine (its python must exist here)."""
    require_python_here(python)
    return job_from_inventory(local_inventory(n, python), backend, trainer_args, mpi_args)


def check_backend(backend: str) -> None:
    """An unknown name is bad input (exit 2); an MLX backend train does not run
    (jaccl, jaccl-ring, nccl) is unavailable (exit 3)."""
    if backend not in MLX_BACKENDS:
        raise InputError(f"unknown backend {backend!r} (MLX's backends are "
                         f"{', '.join(MLX_BACKENDS)})",
                         "use --backend ring (TCP, always available) or mpi")
    if backend not in BACKENDS:
        raise BackendUnavailable(f"mlxcluster train and run support the {' and '.join(BACKENDS)} "
                                 f"backends, not {backend!r}",
                                 "use --backend ring (TCP, always available) or mpi")


# ---------------------------------------------------------------- running on hosts


def host_argv(job: TrainJob, host: RankHost, remote_command: str) -> list[str]:
    """OpenSSH argv that can never prompt; local ranks run through bash directly."""
    if host.is_local:
        return ["bash", "-c", remote_command]
    return ssh_argv(host.ssh, remote_command, ssh_config=job.ssh_config, connect_timeout=5,
                    user=host.user, port=host.port)


def rank_env(job: TrainJob) -> dict[str, str]:
    """Variables every rank gets: PYTHONPATH to reference_train (and
    mlxcluster.jobs.rank_wrapper) ahead of the job's own PYTHONPATH, heartbeat
    lines on, rank-tagged output for ``tag_output``, plus the job's env."""
    env = {"MLXCLUSTER_HEARTBEAT": "1", **job.env}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_root()), job.env.get("PYTHONPATH"))
                                        if p)
    if job.tag_output:
        env["MLXCLUSTER_TAG_OUTPUT"] = "1"
    return env


def rank_program(job: TrainJob) -> tuple[str, ...]:
    """What each rank's python runs after the rank wrapper: the job's
    program, else the reference trainer (its progress bar off: output arrives
    line by line, and mpirun gives ranks a terminal; the user's --progress
    still wins)."""
    if job.program is not None:
        return job.program
    return ("-m", "reference_train.train", "--progress", "false", *job.trainer_args)


def script_path(job: TrainJob) -> str | None:
    """The script file a `run` job starts (None for a module or the trainer)."""
    if job.program and job.program[0] != "-m":
        return job.program[0]
    return None


def probe_hosts(job: TrainJob, env: dict[str, str] | None = None,
                timeout: float = PROBE_TIMEOUT) -> list[HostProbe]:
    """Run the probe on every distinct host, in parallel; never raises for one host."""
    script = (f"CANDIDATES = {list(OPENBLAS_CANDIDATES)!r}\nSCRIPT = {script_path(job)!r}\n"
              f"NEED_TRAINER = {job.program is None!r}\n{PROBE_SCRIPT}")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in rank_env(job).items())
    remote = f"env {exports} {shlex.quote(job.python)} -c {shlex.quote(script)}"
    distinct = list({(h.ssh, h.port, h.user): h for h in job.hosts}.values())

    def probe(host: RankHost) -> HostProbe:
        try:
            proc = subprocess.run(host_argv(job, host, remote), capture_output=True, text=True,
                                  timeout=timeout, env=env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return HostProbe(host, {}, f"no answer within {timeout:.0f} s")
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
        if line is None:
            detail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            return HostProbe(host, {}, detail)
        return HostProbe(host, json.loads(line[len("PROBE "):]))

    return for_each_host(distinct, probe)


def check_probes(job: TrainJob, probes: list[HostProbe]) -> list[str]:
    """Problems that would stop the trainer (or a `run` program), one line per
    host and cause."""
    problems = []
    script = script_path(job)
    for p in probes:
        if p.error:
            problems.append(f"{p.host.name}: cannot run {job.python}: {p.error}")
        elif "mlx" not in p.facts:
            problems.append(f"{p.host.name}: mlx does not import: {p.facts.get('mlx_error')}")
        elif script and p.facts.get("script") is False:
            problems.append(f"{p.host.name}: no file {script} (every rank runs it from that path; "
                            "copy it there or use a shared folder)")
        elif job.program is None and not p.facts.get("reference_train"):
            problems.append(f"{p.host.name}: reference_train does not import: "
                            f"{p.facts.get('reference_train_error')}")
        elif p.facts.get("rank_wrapper_error"):
            problems.append(f"{p.host.name}: mlxcluster.jobs.rank_wrapper (every rank runs under it) "
                            f"does not import: {p.facts['rank_wrapper_error']}")
    versions = {p.facts["mlx"] for p in probes if "mlx" in p.facts}
    if len(versions) > 1:
        listing = ", ".join(f"{p.host.name} {p.facts['mlx']}" for p in probes if "mlx" in p.facts)
        problems.append(f"mlx versions differ between hosts: {listing}")
    return problems


def openblas_env(job: TrainJob, probes: list[HostProbe]) -> dict[str, str]:
    """LD_PRELOAD and OPENBLAS_NUM_THREADS for every rank, or {} without a common OpenBLAS.

    Threads: the host's cores shared among its ranks. OpenBLAS's default (all
    cores in every process) oversubscribes when ranks share a host: measured
    here, a demo step with 2 threads on a busy 2-core machine took 4.4x longer
    than with 1.
    """
    path = common_openblas(probes)
    if path is None:
        return {}
    per_host: dict[str, int] = {}
    for h in job.hosts:
        per_host[h.ssh] = per_host.get(h.ssh, 0) + 1
    cpus = {p.host.ssh: int(p.facts.get("cpus") or 1) for p in probes}
    threads = min(max(1, cpus.get(ssh, 1) // n) for ssh, n in per_host.items())
    return {"LD_PRELOAD": path, "OPENBLAS_NUM_THREADS": str(threads)}


def common_openblas(probes: list[HostProbe]) -> str | None:
    """The OpenBLAS path to preload: set when every host is Linux and has it at one path."""
    paths = {p.facts.get("openblas") for p in probes}
    if not probes or len(paths) != 1 or None in paths:
        return None
    if any(not str(p.facts.get("platform", "")).startswith("linux") for p in probes):
        return None
    return paths.pop()


# ---------------------------------------------------------------- launch commands


def write_hostfile(job: TrainJob, directory: Path) -> Path:
    """The hostfile the launcher reads: mlx.launch JSON (ring) or Open MPI lines (mpi)."""
    if job.backend == "ring":
        path = directory / "hosts.json"
        path.write_text(json.dumps({"backend": "ring", "hosts": [
            {"ssh": h.ssh if not h.user else f"{h.user}@{h.ssh}", "ips": [h.ip]}
            for h in job.hosts]}, indent=1))
    else:
        path = directory / "mpi_hosts"
        counts: dict[str, int] = {}
        for h in job.hosts:
            target = "localhost" if h.is_local else h.ip
            counts[target] = counts.get(target, 0) + 1
        path.write_text("".join(f"{t} slots={n}\n" for t, n in counts.items()))
    return path


def launcher_argv(job: TrainJob, hostfile: Path, program: list[str]) -> list[str]:
    """mlx.launch (ring) or mpirun (mpi) argv running `python PROGRAM...` on every rank."""
    env = rank_env(job)
    if job.backend == "ring":
        argv = [smoke_launch.mlx_launch_path(), "--hostfile", str(hostfile), "--backend", "ring",
                "--python", job.python, "--starting-port", str(job.starting_port)]
        argv += [f"--env={k}={v}" for k, v in env.items()]
        return argv + ["--", *program]
    mpirun = require_mpirun()
    libmpi = find_libmpi(mpirun=mpirun)
    if libmpi:  # MLX dlopens libmpi: name the one of this mpirun, unless the inventory does
        env = {**libmpi_env(libmpi), **env}
    argv = [mpirun, "--hostfile", str(hostfile), "-np", str(len(job.hosts)),
            "--mca", "btl", "tcp,self", *no_tree_spawn_args(split_mpi_args(job)), "-x", "PATH"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if len({h.ip for h in job.hosts}) < len(job.hosts):
        # Several ranks on one host (--local): more ranks than cores is fine here.
        argv += ["--map-by", ":OVERSUBSCRIBE", "--bind-to", "none"]
    for k, v in env.items():
        argv += ["-x", f"{k}={v}"]
    # Interface choice is left to the user (--mpi-arg "--mca btl_tcp_if_include 10.0.0.0/24"):
    # per-host /32 lists made mpirun hang or crash in the lab.
    return argv + list(split_mpi_args(job)) + ["--", job.python, *program]


def split_mpi_args(job: TrainJob) -> tuple[str, ...]:
    """The user's --mpi-arg values as mpirun arguments ("--mca a b" is three)."""
    return tuple(part for arg in job.mpi_args for part in shlex.split(arg))


# ---------------------------------------------------------------- running


WARN_RE = re.compile(r"Node with rank (\d+) exited with code (\d+)")
MPI_RANK_RE = re.compile(r"Process name:\s*\[[^\]]*,(\d+)\]")
MPI_CODE_RE = re.compile(r"Exit code:\s*(\d+)")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def failed_rank(lines: list[str], returncode: int) -> tuple[int, int | None]:
    """(exit code, failing rank) from a launcher's output and return code.

    mlx.launch exits 0 when a rank fails and only warns "Node with rank R exited
    with code C"; mpirun returns the first failing process's code and names it
    "[prterun-...@1,R]".
    """
    text = ANSI_RE.sub("", "\n".join(lines))
    warn = WARN_RE.search(text)
    if warn:
        return int(warn.group(2)), int(warn.group(1))
    rank, code = MPI_RANK_RE.search(text), MPI_CODE_RE.search(text)
    if code and returncode != 0:
        return int(code.group(1)), int(rank.group(1)) if rank else None
    return returncode, None


HELP_RULE_RE = re.compile(r"^-{20,}$")  # Open MPI frames its own messages with these
HELP_DETAIL_RE = re.compile(r"^\s+([A-Z][\w ]*):\s+(\S.*)$")  # "  Option: --bogus-flag"
ARGPARSE_ERROR_RE = re.compile(r"^mlx\.launch: error: (.+)$", re.M)


def launcher_error(lines: list[str] | tuple[str, ...]) -> str | None:
    """The launcher's own error when it failed without naming a rank, else None.

    mpirun (Open MPI 5, prterun) refuses an unknown option, a bad directive, a
    missing executable or a hostfile without slots before any rank runs: it
    prints a message framed by lines of dashes ("An unrecognized option was
    included on the mpirun command line:" / "Option: --bogus-flag") and exits
    with its own code (213, 183...). mlx.launch exits 2 with "mlx.launch:
    error: ...". A failing rank is named instead ("Node with rank R exited",
    "Process name:" / "Exit code:"), and then this returns None.
    """
    text = ANSI_RE.sub("", "\n".join(lines))
    if WARN_RE.search(text) or MPI_RANK_RE.search(text) or MPI_CODE_RE.search(text):
        return None
    argparse_error = ARGPARSE_ERROR_RE.search(text)
    if argparse_error:
        return argparse_error.group(1).strip()
    body = text.splitlines()
    rules = [i for i, line in enumerate(body) if HELP_RULE_RE.match(line.strip())]
    if len(rules) < 2:
        return None
    block = body[rules[0] + 1:rules[1]]
    summary: list[str] = []
    for line in block:  # the first paragraph says what went wrong
        if not line.strip():
            if summary:
                break
            continue
        summary.append(line.strip())
    details = [f"{m.group(1)}: {m.group(2).strip()}" for m in map(HELP_DETAIL_RE.match, block) if m]
    message = " ".join(summary).rstrip(":")
    return f"{message} ({'; '.join(details)})" if details else message or None


def run_streaming(argv: list[str], on_line: Callable[[str, str], None],
                  env: dict[str, str] | None = None, timeout: float | None = None,
                  keep: int = 400, watch: stall.StallWatch | None = None,
                  on_stall: Callable[[], MlxclusterError] | None = None) -> RunOutcome:
    """Run `argv`, calling on_line(stream, line) as lines arrive; kill it on timeout.

    With ``watch``, every line goes through it first (heartbeats are recorded
    and hidden); when it says the job stalled, ``on_stall()`` (diagnose and
    stop the ranks) runs, the launcher is stopped, and its error is raised."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                            bufsize=1, errors="replace")
    tail: list[str] = []
    lock = threading.Lock()

    stopping = threading.Event()  # set: the launcher is being stopped by us

    def pump(stream, name: str) -> None:
        noise = LauncherStopNoise()
        for raw in stream:
            shown = raw.rstrip("\n")
            if watch is not None:
                shown = watch.feed(shown)
                if shown is None:
                    continue
            for line in noise.feed(shown):
                with lock:
                    tail.append(line)
                    del tail[:-keep]
                    if not stopping.is_set():  # not the launcher's own traceback as it stops
                        on_line(name, line)
        for line in noise.flush():
            with lock:
                tail.append(line)
                on_line(name, line)

    pumps = [threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True),
             threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True)]
    for t in pumps:
        t.start()
    deadline = None if timeout is None else start + timeout
    try:
        while True:
            wait_s = 1.0 if watch is not None else None
            if deadline is not None:
                left = max(0.0, deadline - time.monotonic())
                wait_s = left if wait_s is None else min(wait_s, left)
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    stopping.set()
                    with interrupts.deferred():
                        stop_launcher(proc, pumps)
                    raise MlxclusterError(
                        f"the job did not finish within {timeout:.0f} s and was stopped",
                        "raise --timeout; a hung rank is found and named by --stall-timeout") from None
                if watch is not None and on_stall is not None and watch.stalled():
                    stopping.set()
                    with interrupts.deferred():
                        try:
                            error = on_stall()
                        finally:  # the launcher goes, whatever the diagnosis did
                            stop_launcher(proc, pumps)
                    raise error from None
    except KeyboardInterrupt as stop:
        stopping.set()
        with interrupts.deferred():
            stop_launcher(proc, pumps)
        signum = interrupts.signum_of(stop)
        raise Interrupted(signum, f"interrupted ({interrupts.signal_name(signum)}): the job was "
                                  "stopped on every rank") from None
    for t in pumps:
        t.join(timeout=10)
    code, rank = failed_rank(tail, proc.returncode)
    return RunOutcome(exit_code=code, failed_rank=rank, seconds=time.monotonic() - start,
                      lines=tuple(tail))


def stop_launcher(proc: subprocess.Popen, pumps: list[threading.Thread]) -> None:
    """SIGINT the launcher's process group (mlx.launch and mpirun then stop
    their ranks on every host themselves); KILL it if it is not gone in 20 s."""
    interrupts.stop_process(proc, signal.SIGINT, 20.0, group=True)
    for t in pumps:
        t.join(timeout=5)


def smoke_hosts(job: TrainJob) -> tuple[smoke_launch.RankHost, ...]:
    """The job's ranks as smoke ranks: same targets, python, ssh options and env."""
    return smoke_launch.hosts_from_inventory(Inventory(
        cluster="train", python=job.python, ssh_config=job.ssh_config, hosts=tuple(
            Host(h.name, h.ssh, (h.ip,), h.user, job.python, h.port, dict(job.env))
            for h in job.hosts)))


def smoke_all_sum(job: TrainJob, env: dict[str, str] | None = None,
                  timeout: float = SMOKE_TIMEOUT) -> tuple[bool, str]:
    """The smoke worker, all_sum only (float32, a few elements), across every rank
    on the job's backend: strict init, group size and sums checked on every rank,
    a deadline per phase, nothing left running. Returns (ok, one-line detail)."""
    n = len(job.hosts)
    try:
        report = run_backend(job.backend, smoke_hosts(job), SMOKE_OPTIONS, timeout_s=timeout,
                             environ=env, mpi_args=split_mpi_args(job))
    except MlxclusterError as e:
        return False, str(e)
    if report.passed:
        return True, f"all_sum over {n} ranks on {job.backend} = {n} ({report.duration_s:.1f} s)"
    why = launcher_error(report.launcher_stderr.splitlines()) if report.ranks else None
    if why:  # e.g. a bad --mpi-arg: no rank ran, so none is to blame
        return False, f"{launcher_name(job)} did not start the ranks: {why}"
    # Every rank's verdict, the one that failed first leading (unavailable: no ranks ran).
    verdicts = "; ".join(f"rank {r.rank} on {r.host} {r.status}" + (f": {r.detail}" if r.detail else "")
                         for r in report.failed_ranks)
    return False, verdicts or report.reason or report.status


def launcher_name(job: TrainJob) -> str:
    """What starts the ranks of ``job``, as the user knows it."""
    return "mpirun" if job.backend == "mpi" else "mlx.launch"


AUTO = "auto"  # launch_training's default stall timeout: 10 x the median step, >= 60 s


def launch_training(job: TrainJob, on_line: Callable[[str, str], None],
                    env: dict[str, str] | None = None,
                    timeout: float | None = None,
                    stall_timeout: float | str | None = AUTO,
                    report_dir: Path | None = None, run_id: str | None = None,
                    any_line_progress: bool = False) -> RunOutcome:
    """Run the job's program (``rank_program``: by default `python -m
    reference_train.train ARGS`) on every rank and wait for the end.

    The launcher reaches the hosts through launcher_ssh's ssh (keepalive,
    BatchMode, the inventory's ssh_config): a host that dies mid-run ends that
    rank within ~15 s instead of leaving the job waiting forever. However the
    job ends (also timed out or interrupted), every host is then swept for
    ranks of it (mlxcluster.jobs.cleanup).

    ``stall_timeout``: seconds without a heartbeat that make a stall, AUTO
    (stall.StallWatch's default), or None (not watched). On a stall, the
    report (summary and every rank's stacks) goes to
    ``report_dir``/stall-RUN_ID (default: the current directory), every rank
    is stopped, and stall.Stalled is raised. ``any_line_progress``: every
    output line counts as progress, not only heartbeats (`mlxcluster run`:
    a program of its own prints none). ``run_id``: default a new one."""
    run_id = run_id or new_run_id()
    base_env = dict(os.environ if env is None else env)
    watch = None
    if stall_timeout is not None:
        limit = None if stall_timeout == AUTO else float(stall_timeout)
        watch = stall.LineWatch(limit) if any_line_progress else stall.StallWatch(limit)

    def on_stall() -> MlxclusterError:
        return stop_stalled(job, run_id, watch, Path(report_dir or "."), base_env)

    try:
        with tempfile.TemporaryDirectory(prefix="mlxcluster-train.") as tmp:
            hostfile = write_hostfile(job, Path(tmp))
            program = marked_program(run_id, ["-m", "mlxcluster.jobs.rank_wrapper", *rank_program(job)])
            argv = launcher_argv(job, hostfile, program)
            launcher_env = launcher_environment(base_env, Path(tmp) / "bin", job.ssh_config)
            outcome = run_streaming(argv, on_line, env=launcher_env, timeout=timeout,
                                    watch=watch, on_stall=on_stall)
    except (MlxclusterError, Interrupted) as err:  # timed out or interrupted: sweep, then say so
        with interrupts.deferred():
            hint = unstopped_hint(sweep(smoke_hosts(job), run_id, base_env), run_id)
        if hint:
            err.hint = f"{err.hint}; {hint}" if err.hint else hint
        raise
    with interrupts.deferred():
        unstopped = unstopped_hint(sweep(smoke_hosts(job), run_id, base_env), run_id)
    lost = lost_host(outcome.exit_code, outcome.failed_rank, [h.name for h in job.hosts], outcome.lines)
    return replace(outcome, run_id=run_id, lost_host=lost, unstopped=unstopped)


def stop_stalled(job: TrainJob, run_id: str, watch: stall.StallWatch, report_root: Path,
                 env: dict[str, str]) -> stall.Stalled:
    """A stalled job: every rank's state and stacks, the diagnosis, the report
    saved, then every rank stopped (a SIGSTOPped one too: the sweep sends
    CONT and KILL). Returns the error to raise."""
    silent, limit = watch.silent_for(), watch.limit()
    how = "--stall-timeout" if watch.fixed is not None else "automatic: 10 x the median step, >= 60 s"
    hosts = smoke_hosts(job)
    states = stall.collect_states(
        list(hosts), run_id,
        run_script=lambda h, script: smoke_remote.run_script(h, script, env=env),
        for_each_host=smoke_remote.for_each_host)
    summary = stall.diagnose(states)
    steps = ", ".join(f"rank {r} {s}" for r, s in sorted(watch.steps.items()))
    header = (f"run {run_id}: no progress for {silent:.0f} s (stall timeout {limit:.0f} s, {how}); "
              f"last step seen: {steps or 'none'}")
    folder: Path | None = report_root / f"stall-{run_id}"
    try:
        stall.save_report(folder, summary, states, header)
    except OSError:
        folder = None
    sweep(hosts, run_id, env)  # stop every rank now; launch_training sweeps once more
    where = f"every rank's state and Python stacks: {folder}" if folder else \
        "the stacks could not be saved"
    what, resume = ("training", ", then rerun with '-- --resume auto' to continue from the "
                    "last checkpoint") if job.program is None else ("the job", "")
    return stall.Stalled(
        f"{what} stalled: no progress for {silent:.0f} s (stall timeout {limit:.0f} s): "
        f"{summary}\n" + "\n".join(f"  {line}" for line in stall.rank_lines(states)),
        f"{where}; every rank was stopped. Look at the named rank's host (swapped out, "
        f"stopped, a hung collective){resume}", report_dir=folder)


def trainer_help(args: tuple[str, ...]) -> str | None:
    """The trainer's own help text when ``args`` ask for it (``-- --help``), else None."""
    from reference_train.train import build_config

    shown = io.StringIO()
    try:
        with contextlib.redirect_stdout(shown), contextlib.redirect_stderr(io.StringIO()):
            build_config(list(args))
    except SystemExit as done:  # argparse exits 0 after printing the help
        return shown.getvalue() if done.code in (0, None) else None
    except ValueError:  # validate_trainer_args reports it
        return None
    return None


def validate_trainer_args(args: tuple[str, ...]) -> TrainConfig:
    """Parse the trainer's own flags here, before anything starts on the hosts:
    a typo must not cost a launch on every host to find out. Returns the
    config every rank will build."""
    from reference_train.train import build_config  # same code the ranks run

    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(captured):
            return build_config(list(args))
    except SystemExit:  # argparse: unknown flag or missing value (--help: see trainer_help)
        said = [ln for ln in captured.getvalue().splitlines() if ln.strip()]
        raise InputError(f"trainer arguments rejected: {said[-1] if said else ' '.join(args)}",
                         "python -m reference_train.train --help lists every --field") from None
    except ValueError as err:  # a config file's problem, a type or a value out of range
        raise InputError(f"trainer arguments rejected: {err}",
                         "configs are tiny, demo, blog or a YAML file; docs/training.md lists "
                         "every field, its type and its allowed values") from None


def check_batch_split(cfg: TrainConfig, ranks: int) -> None:
    """InputError when the global batch does not split over ``ranks`` x
    ``grad_accum`` micro-batches. The ranks check this too (reference_train
    split_batch), but only after a launch on every host, and then every rank
    dies with the same error; the number of ranks is known here before that."""
    unit = ranks * cfg.grad_accum
    rest = cfg.global_batch % unit
    if not rest:
        return
    over = f"{ranks} ranks" if cfg.grad_accum == 1 else \
        f"{ranks} ranks x grad_accum {cfg.grad_accum} = {unit} micro-batches"
    below, above = cfg.global_batch - rest, cfg.global_batch - rest + unit
    choices = f"{below} or {above}" if below else f"{above}"
    divisors = [n for n in range(1, cfg.global_batch + 1)
                if cfg.global_batch % (n * cfg.grad_accum) == 0]
    raise InputError(
        f"global_batch {cfg.global_batch} does not split over {over} "
        f"({cfg.global_batch} % {unit} = {rest}): use --global_batch {choices}",
        f"pass it to the trainer after '--' (e.g. -- --global_batch {above}) or set it in the "
        f"config; or run on a number of ranks it splits over: "
        f"{', '.join(map(str, divisors[:8]))}{', ...' if len(divisors) > 8 else ''}")


def check_out_here(out: str) -> None:
    """For ranks on this machine: rank 0 writes the run to the trainer's
    ``--out``, so it must be a directory here or creatable here (checked by
    creating and removing a directory beside where it will be made)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise InputError(f"trainer --out {out} exists and is not a directory",
                         "give --out a directory path (new or existing), e.g. -- --out runs/mine")
    base = path
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise InputError(f"trainer --out {out} cannot be created: {base} is not a directory",
                         "give --out a path under a directory, e.g. -- --out runs/mine")
    try:
        probe = tempfile.mkdtemp(prefix=".mlxcluster-out-probe.", dir=base)
    except OSError as err:
        raise InputError(f"trainer --out {out} cannot be created: {err.strerror} in {base}",
                         "give --out a path in a directory you can write to") from None
    os.rmdir(probe)


def trainer_command(job: TrainJob) -> str:
    """The command line every rank runs (the trainer, or a `run` program), for display."""
    if job.program is not None:
        return shlex.join([job.python, *job.program])
    return shlex.join([job.python, "-m", "reference_train.train", *job.trainer_args])
