"""Is the job's python there on every host?

MLX's launchers start one python path on every host. A path that does not
exist on a host is bad input (exit 2, errors.py), to be found before any rank
starts: otherwise mlx.launch starts the ranks that can start, the missing one
exits 127 ("No such file or directory"), and the others are stopped; mpirun
refuses the whole job with a message of its own. `mlxcluster run` and
`train` both say it the same way: ``python not found: PATH on HOST``.

The preflight's probe finds it on its way (``missing_python_hosts`` reads the
probe's errors). With ``--no-preflight`` ``require_job_python`` asks every
remote host once, in parallel, the cheapest question that gives the answer:
run the python with nothing to do (``PY -S -c ''``; a path that exists but
does not start, like a broken venv link, fails the same way).
"""

from __future__ import annotations

import re
import shlex

from mlxcluster.errors import InputError
from mlxcluster.jobs.hosts import RankHost, for_each_host, remote_hosts, run_on
from mlxcluster.ssh.results import CommandResult, SshError

# What a shell says when the python path is not there; "exit code 127" is how the probe
# reports a shell that said nothing.
MISSING_PYTHON_RE = re.compile(r"No such file or directory|not found|exit code 127")
CHECK_TIMEOUT_S = 20.0  # the ssh connect timeout is 5 s; a loaded host still answers


def python_not_found(python: str, host_names: list[str]) -> InputError:
    """The error for a job whose python is missing on ``host_names``."""
    return InputError(f"python not found: {python} on {', '.join(host_names)}",
                      "install the same venv at that path on every host, or give the python "
                      "every host has (inventory python:, or --python)")


def is_missing_python(returncode: int, output: str) -> bool:
    """Whether a shell that ran the python says the python is not there
    (127: not found, 126: not executable). An ssh failure (255: no
    connection) is not: the host, not the path, is the problem, and the
    launch reports it as such."""
    return returncode in (126, 127) or (returncode not in (0, 255)
                                        and bool(MISSING_PYTHON_RE.search(output)))


def python_answers(job, env: dict[str, str] | None = None, timeout: float = CHECK_TIMEOUT_S
                   ) -> list[tuple[RankHost, CommandResult | None]]:
    """Every remote host of ``job`` (a jobs.job.Job) asked, all at once, to
    run the job's python with nothing to do (``PY -S -c ''``): the cheapest
    question that says both whether the host answers ssh and whether the
    python is there. None: no answer within ``timeout``. Never prompts."""
    remote = remote_hosts(job.hosts)
    command = f"{shlex.quote(job.python)} -S -c ''"

    def ask(host) -> CommandResult | None:
        try:
            return run_on(host, command, timeout=timeout, env=env)
        except SshError as err:
            if err.kind == "command-timeout":
                return None
            raise

    return list(zip(remote, for_each_host(remote, ask), strict=True))


def require_job_python(job, env: dict[str, str] | None = None,
                       timeout: float = CHECK_TIMEOUT_S) -> None:
    """Raise ``python_not_found`` when the job's python does not start on a
    remote host of ``job`` (a jobs.job.Job). Ranks on this machine
    are checked where the job is built (jobs.hosts.require_python_here).
    A host that does not answer is not judged here: the launch reports it."""
    lacking = [h.name for h, answer in python_answers(job, env, timeout)
               if answer is not None and is_missing_python(answer.exit_status, answer.stderr)]
    if lacking:
        raise python_not_found(job.python, lacking)
