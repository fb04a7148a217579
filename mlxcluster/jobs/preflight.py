"""Before a job: can every host run it? Doctor's probe, asked with the job's
python and environment on every host, read by doctor's facts.

The probe (``probe_script.py``, piped to ``<python> -`` as doctor does)
reports the python, mlx, the platform and the cores; the job adds
``--import`` for what every rank imports (the rank wrapper, and the job's
``imports``: the trainer for ``train``) and ``--file`` for the script of ``run`` and the OpenBLAS
candidates. ``HostProbe.facts`` is the little of that a job needs, by name.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from mlxcluster.facts.blas import OPENBLAS_CANDIDATES
from mlxcluster.facts.capture import PROBE, HostCapture
from mlxcluster.facts.collect import PROBE_TIMEOUT, capture_from_probe, probe_command, probe_source
from mlxcluster.facts.facts import HostFacts, host_facts
from mlxcluster.facts.shell import launch_refusal, shell_kind
from mlxcluster.jobs.hosts import RankHost, distinct_hosts, for_each_host, run_on
from mlxcluster.jobs.job import Job, rank_env, script_path
from mlxcluster.ssh.results import SshError

RANK_WRAPPER_MODULE = "mlxcluster.jobs.rank_wrapper"


@dataclass(frozen=True)
class HostProbe:
    """What the job's python reported on one host (or why it could not).

    ``facts``: ``python``, ``platform``, ``host``, ``cpus``, ``login_shell``
    and its ``shell_kind`` (facts.shell); ``mlx`` (its
    version) or ``mlx_error``; ``import_errors`` (each of the job's
    ``imports`` that does not import, and why); ``script`` (the file exists);
    ``rank_wrapper_error``; ``openblas`` (the first candidate present, or None)."""

    host: RankHost
    facts: dict
    error: str | None = None


def probe_arguments(job: Job) -> list[str]:
    """The probe's --import and --file arguments for ``job``."""
    modules = [RANK_WRAPPER_MODULE, *job.imports]
    files = ([script_path(job)] if script_path(job) else []) + list(OPENBLAS_CANDIDATES)
    return [*(a for m in modules for a in ("--import", m)), *(a for f in files for a in ("--file", f))]


def job_facts(probe: dict, job: Job) -> dict:
    """The probe's JSON (as doctor's facts read it) in HostProbe.facts' names."""
    facts = host_facts(HostCapture("host", {PROBE: json.dumps(probe)}))
    asked = probe.get("job") or {}
    imports, files = asked.get("imports") or {}, asked.get("files") or {}
    out: dict = {"python": facts.python, "platform": facts.platform, "host": facts.hostname,
                 "cpus": facts.cpu_count or 1, "login_shell": facts.login_shell,
                 "shell_kind": shell_kind(facts.login_shell, facts.login_shell_resolved,
                                          facts.platform)}
    if facts.mlx_version:
        out["mlx"] = facts.mlx_version
    else:
        out["mlx_error"] = facts.mlx_import_error
    out["import_errors"] = {m: imports.get(m, "not asked") for m in job.imports
                            if imports.get(m, "not asked") is not None}
    script = script_path(job)
    if script:
        out["script"] = bool(files.get(script))
    if imports.get(RANK_WRAPPER_MODULE, "not asked") is not None:
        out["rank_wrapper_error"] = imports.get(RANK_WRAPPER_MODULE, "not asked")
    out["openblas"] = next((p for p in OPENBLAS_CANDIDATES if files.get(p)), None)
    return out


def probe_hosts(job: Job, env: dict[str, str] | None = None,
                timeout: float = PROBE_TIMEOUT) -> list[HostProbe]:
    """Run the probe on every distinct host, in parallel; never raises for one host."""
    arguments = probe_arguments(job)

    def probe(host: RankHost) -> HostProbe:
        capture = probe_capture(host, job.python, rank_env(job), arguments, timeout, env)
        if capture.error:
            return HostProbe(host, {}, capture.error)
        return HostProbe(host, job_facts(capture.probe(), job))

    return for_each_host(distinct_hosts(job.hosts), probe)


def probe_facts(job: Job, env: dict[str, str] | None = None,
                timeout: float = PROBE_TIMEOUT) -> dict[str, HostFacts | None]:
    """Doctor's facts of every distinct host of ``job`` (its memory among
    them), asked with the job's python, in parallel; None for a host that
    did not answer."""

    def facts(host: RankHost) -> HostFacts | None:
        capture = probe_capture(host, job.python, rank_env(job), (), timeout, env)
        return None if capture.error else host_facts(capture)

    hosts = distinct_hosts(job.hosts)
    return dict(zip([h.name for h in hosts], for_each_host(hosts, facts), strict=True))


def probe_capture(host: RankHost, python: str, rank_vars: dict[str, str],
                  arguments: list[str] | tuple[str, ...] = (), timeout: float = PROBE_TIMEOUT,
                  env: dict[str, str] | None = None) -> HostCapture:
    """Doctor's probe run by ``python`` on one rank's host (over OpenSSH as the
    launcher reaches it, here for a local rank) with the ranks' environment:
    the capture doctor would read (its raw macOS outputs included), or one
    whose ``error`` says why not. Never raises."""
    command = probe_command(python, rank_vars) + "".join(f" {shlex.quote(a)}" for a in arguments)
    try:
        result = run_on(host, command, stdin=probe_source(), timeout=timeout, env=env)
    except SshError as err:
        why = f"no answer within {timeout:.0f} s" if err.kind == "command-timeout" else err.message
        return HostCapture(host.name, error=why)
    return capture_from_probe(host.name, result, python)


def check_probes(job: Job, probes: list[HostProbe]) -> list[str]:
    """Problems that would stop the job's program, one line per host and cause."""
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
        elif p.facts.get("import_errors"):
            module, error = next(iter(p.facts["import_errors"].items()))
            problems.append(f"{p.host.name}: {module} does not import: {error}")
        elif not p.host.is_local and (why := launch_refusal(
                p.facts.get("login_shell"), p.facts.get("shell_kind"), job.backend)):
            problems.append(f"{p.host.name}: {why}")
        elif p.facts.get("rank_wrapper_error"):
            problems.append(f"{p.host.name}: mlxcluster.jobs.rank_wrapper (every rank runs under it) "
                            f"does not import: {p.facts['rank_wrapper_error']}")
    versions = {p.facts["mlx"] for p in probes if "mlx" in p.facts}
    if len(versions) > 1:
        listing = ", ".join(f"{p.host.name} {p.facts['mlx']}" for p in probes if "mlx" in p.facts)
        problems.append(f"mlx versions differ between hosts: {listing}")
    return problems


def openblas_env(job: Job, probes: list[HostProbe]) -> dict[str, str]:
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
