"""Host-to-host SSH from a host, every hop in one session.

``mpirun`` starts its daemons on the other hosts with plain ``ssh`` from the
host it runs on (and, with tree spawn, each daemon ssh's onward), so doctor
makes the same calls from every host: one ``ssh -o BatchMode=yes HOST true``
per other host. A host's hops all run from ONE SSH session on it (``HOPS``,
a standard-library script run with ``<python> -c``) rather than one session
per hop: sshd allows 10 sessions per connection by default (``MaxSessions``),
so 12 hops over one connection would be refused, and every session costs a
login shell. With every host hopping at once, each host runs at most
``PARALLEL`` hops at a time, starting with the host after it: a host then
receives about that many connections at once, under sshd's default
``MaxStartups 10`` (beyond which it drops new connections at random).

The script prints one JSON row per hop: ``[exit status or null on timeout,
stdout, stderr, seconds]``. Empty lines come before it: the script
writes one every moment to learn that the session is gone (doctor
interrupted, the connection lost), and then ends with its hops, not after
their timeouts: sshd does not signal a command without a terminal.
"""

from __future__ import annotations

import json

from mlxcluster.ssh.openssh import ssh_argv
from mlxcluster.ssh.remote import ParamikoRunner, python_command
from mlxcluster.ssh.results import CommandResult, Outcome, SshError

# SshError kind when the script itself could not run on the first host (its
# python is broken): no hop was tried, so no other host is to blame.
HOP_SCRIPT_FAILED = "hop-script"

# Hops at a time from one host when every host hops (see the module's docstring).
PARALLEL = 4

HOPS = r"""
import json, os, subprocess, sys, threading, time
spec = json.loads(sys.argv[1])
rows = [None] * len(spec["hops"])
running, lock = [], threading.Lock()
def hop(i, argv):
    t = time.time()
    try:
        with lock:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            running.append(p)
        try:
            out, err = p.communicate(timeout=spec["timeout"])
            rows[i] = [p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")]
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            rows[i] = [None, "", ""]
    except OSError as e:
        rows[i] = [127, "", "%s: %s" % (argv[0], e.strerror)]
    rows[i].append(round(time.time() - t, 3))
def watch():
    # sshd leaves a session's command running when its connection drops (no
    # terminal, no signal), but the pipe to it is gone: an empty line a moment
    # finds that out, and the hops end with the script.
    while True:
        time.sleep(0.2)
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except OSError:
            break
    with lock:
        for p in running:
            try:
                p.kill()
            except OSError:
                pass
        os._exit(3)
threading.Thread(target=watch, daemon=True).start()
slots = threading.BoundedSemaphore(spec.get("parallel") or len(rows) or 1)
def limited(i, argv):
    with slots:
        hop(i, argv)
threads = [threading.Thread(target=limited, args=(i, argv)) for i, argv in enumerate(spec["hops"])]
for t in threads:
    t.start()
for t in threads:
    t.join()
sys.stdout.write(json.dumps(rows) + "\n")
"""


def hop_argv(target: str, user: str | None, port: int | None, connect_timeout: float) -> list[str]:
    """What the first host runs to reach another: plain ssh with BatchMode, as mpirun does."""
    return ssh_argv(target, "true", connect_timeout=connect_timeout, user=user, port=port)


def hop_outcome(target: str, row: list, timeout: float) -> Outcome:
    """One script row -> an Outcome the host-to-host check judges (it explains
    ssh's exit 255 itself, as for any BatchMode call)."""
    status, stdout, stderr, seconds = row
    if status is None:
        return Outcome(target, error=SshError("command-timeout", f"ssh {target}: no answer within {timeout:.0f} s",
                                              "the host hangs after connecting; check it directly"),
                       seconds=seconds)
    return Outcome(target, value=CommandResult(stdout, stderr, status, seconds), seconds=seconds)


def run_hops(runner: ParamikoRunner, first, others: list, connect_timeout: float,
             parallel: int | None = None) -> dict[str, Outcome]:
    """From ``first``, ssh BatchMode to every host in ``others``, at most
    ``parallel`` at a time (all at once without it), in the order given.

    Returns one Outcome per other host name; when the session on the first
    host itself fails, every hop carries that error.
    """
    timeout = connect_timeout + 15
    spec = {"hops": [hop_argv(h.ssh, h.user, h.port, connect_timeout) for h in others], "timeout": timeout}
    rounds = 1
    if parallel:
        spec["parallel"] = parallel
        rounds = -(-len(others) // parallel)
    timeout_all = timeout * rounds
    try:
        result = runner.run(first.ssh, python_command(first.python, HOPS, spec), user=first.user,
                            port=first.port, timeout=timeout_all + 10)
        lines = [ln for ln in result.stdout.splitlines() if ln.startswith("[")]
        if not lines:
            last = (result.stderr.strip().splitlines() or [f"exit {result.exit_status}"])[-1]
            raise SshError(HOP_SCRIPT_FAILED, f"the hop script did not run on {first.name} with "
                           f"{first.python}: {last}", "see python-path for that host")
        rows = json.loads(lines[-1])
    except Exception as exc:  # the session failed: no hop was tried
        return {h.name: Outcome(h.name, error=exc) for h in others}
    return {h.name: hop_outcome(h.name, row, timeout) for h, row in zip(others, rows, strict=True)}
