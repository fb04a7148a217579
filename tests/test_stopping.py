"""A rank asked to stop outlives the launcher's SIGTERM (reference_train/stopping.py).

The first rank to end after a stop ends with STOPPED_EXIT, and mlx.launch (or
mpirun) then SIGTERMs its peers as it does a failed rank's: a rank still
writing its last checkpoint or line must not die of it (seen on the lab:
rank 0 killed, its "stopped at step" lost). The lab test
(tests/lab/test_jobs_lab.py) stops a real 3-host job through `mlxcluster stop`.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import os, signal, sys, time
    import mlx.core as mx
    from reference_train.stopping import STOP_SIGNAL, STOPPED_EXIT, StopRequest

    request = StopRequest(mx.distributed.init(), enabled=True)
    if sys.argv[1] == "asked":
        os.kill(os.getpid(), STOP_SIGNAL)  # noted by the handler
        time.sleep(0.05)
    print("agreed", request.agreed(), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # what the launcher sends when a peer ended first
    time.sleep(0.2)
    print("wrote its last line", flush=True)
    sys.exit(STOPPED_EXIT)
""")


def run(case: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROGRAM, case], capture_output=True, text=True,
                          timeout=60)


def test_once_the_ranks_agreed_to_stop_sigterm_no_longer_ends_a_rank():
    stopped = run("asked")
    assert stopped.stdout.splitlines() == ["agreed True", "wrote its last line"], stopped
    assert stopped.returncode == 143
    # not asked: SIGTERM keeps its default, the process ends at once
    running = run("not asked")
    assert running.stdout.splitlines() == ["agreed False"] and running.returncode == -15, running
