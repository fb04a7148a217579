"""A rank asked to stop outlives the launcher's SIGTERM (reference_train/stopping.py).

The first rank to end after a stop ends with STOPPED_EXIT, and mlx.launch (or
mpirun) then SIGTERMs its peers as it does a failed rank's: a rank still
writing its last checkpoint or line must not die of it (seen on the lab:
rank 0 killed, its "stopped at step" lost). The lab test
(tests/lab/test_jobs_lab.py) stops a real 3-host job through `mlxcluster stop`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

from reference_train.stopping import last_words
from tests import waits

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
    return waits.run([sys.executable, "-c", PROGRAM, case])


def test_once_the_ranks_agreed_to_stop_sigterm_no_longer_ends_a_rank():
    stopped = run("asked")
    assert stopped.stdout.splitlines() == ["agreed True", "wrote its last line"], stopped
    assert stopped.returncode == 143
    # not asked: SIGTERM keeps its default, the process ends at once
    running = run("not asked")
    assert running.stdout.splitlines() == ["agreed False"] and running.returncode == -15, running


def test_a_stopped_ranks_last_lines_wait_for_a_slow_reader_within_a_bound():
    """last_words: a full pipe whose reader comes back 0.3 s later gets the lines
    whole (they were dropped before: CI at load lost "stopped at step"); one whose
    reader never comes back costs the bound, not forever."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    filled = 0
    while True:  # a pipe with no room left
        try:
            filled += os.write(write, b"x" * 4096)
        except BlockingIOError:
            break
    got = bytearray()

    def slow_reader():
        time.sleep(0.3)
        while len(got) < filled + len("stopped at step 7\n"):
            got.extend(os.read(read, 65536))

    reader = threading.Thread(target=slow_reader)
    reader.start()
    assert last_words(["stopped at step 7"], seconds=10, fd=write)
    reader.join(timeout=10)
    assert got.endswith(b"xstopped at step 7\n")

    started = time.monotonic()  # nobody reads any more: the bound, and False
    while True:
        try:
            os.write(write, b"x" * 4096)
        except BlockingIOError:
            break
    assert not last_words(["lost"], seconds=0.3, fd=write)
    assert 0.25 < time.monotonic() - started < 5
    os.close(read)
    os.close(write)


def test_rank_0_says_where_it_stopped_before_the_ranks_last_collective(monkeypatch, tmp_path):
    """train.main: rank 0's last lines (the record's, then the person's) are
    written before the ranks part together. After that collective another rank
    may end first, and mlx.launch then kills the ssh clients of the ranks still
    running: lines written after it were lost (CI at load: no "stopped at step")."""
    from reference_train import train
    from reference_train.metrics import RECORD_ENV
    from reference_train.stopping import Stopped
    from tests.train_support import FakeGroup

    events: list[str] = []

    class StoppedTrainer:
        def __init__(self, cfg, group, log):
            self.out = tmp_path

        def run(self):
            raise Stopped(7)

    monkeypatch.setenv(RECORD_ENV, "1")
    monkeypatch.setattr(train, "init_group", lambda: FakeGroup(0, 2))
    monkeypatch.setattr(train, "Trainer", StoppedTrainer)
    monkeypatch.setattr(train, "last_words", lambda lines: events.extend(lines))
    monkeypatch.setattr(train, "part_together", lambda group: events.append(f"part of {group.size()}"))
    assert train.main(["--out", str(tmp_path)]) == 143
    assert '"event": "stopped"' in events[0] and '"step": 7' in events[0]
    assert events[1].startswith("stopped at step 7 when asked") and events[2:] == ["part of 2"]
