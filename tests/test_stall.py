"""Stall detection with an injected clock, the collect script's output read
back, and the diagnosis named from sample states and stacks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mlxcluster.jobs.stall import (
    HEARTBEAT_MARK,
    RankState,
    StallWatch,
    collect_script,
    collect_states,
    cpu_seconds,
    diagnose,
    parse_collect,
    rank_lines,
    save_report,
    split_threads,
)
from tests import waits
from tests.fakes import Clock


def test_heartbeat_marker_matches_the_trainers():
    from reference_train.metrics import HEARTBEAT_MARK as trainers

    assert HEARTBEAT_MARK == trainers


# ---------------------------------------------------------------- the watch


def test_fixed_timeout_stalls_only_after_that_long_without_progress():
    clock = Clock(1000.0)
    watch = StallWatch(20.0, clock=clock, startup_grace=300)
    watch.beat(0, 1)
    clock.now += 19.9
    assert not watch.stalled()
    watch.beat(0, 2)  # progress resets the silence
    clock.now += 19.8
    assert not watch.stalled()
    clock.now += 0.4
    assert watch.stalled() and watch.silent_for() == pytest.approx(20.2)


def test_before_the_first_step_the_startup_grace_applies():
    clock = Clock(1000.0)
    watch = StallWatch(20.0, clock=clock, startup_grace=300)
    clock.now += 299
    assert not watch.stalled() and watch.limit() == 300
    clock.now += 2
    assert watch.stalled()


def test_auto_limit_is_ten_median_steps_with_a_floor_of_60_s():
    clock = Clock(1000.0)
    watch = StallWatch(None, clock=clock)
    for step in range(1, 6):  # 1 s steps: 10 x 1 s is below the floor
        watch.beat(0, step)
        clock.now += 1.0
    assert watch.median_step_s() == pytest.approx(1.0) and watch.limit() == 60.0
    for step in range(6, 40):  # 12 s steps (and one long evaluation pause) -> 120 s
        clock.now += 12.0 + (300 if step == 20 else 0)
        watch.beat(0, step)
    assert watch.median_step_s() == pytest.approx(12.0)
    assert watch.limit() == pytest.approx(120.0)
    clock.now += 119
    assert not watch.stalled()
    clock.now += 2
    assert watch.stalled()


def test_every_ranks_beats_count_once_per_step_for_the_median():
    clock = Clock(1000.0)
    watch = StallWatch(None, clock=clock, factor=10, floor=0)
    for step in (1, 2, 3):
        for rank in (0, 1, 2):
            watch.beat(rank, step)
            clock.now += 0.01
        clock.now += 1.97
    assert watch.median_step_s() == pytest.approx(2.0)
    assert watch.steps == {0: 3, 1: 3, 2: 3}


def test_done_ends_the_watch():
    clock = Clock(1000.0)
    watch = StallWatch(5.0, clock=clock)
    watch.beat(0, 3)
    watch.beat(0, "done")
    clock.now += 1000
    assert not watch.stalled()


@pytest.mark.parametrize("line, shown, beat", [
    (f"{HEARTBEAT_MARK} 2 17", None, (2, 17)),
    (f"{HEARTBEAT_MARK} 0 4\r", None, (0, 4)),  # ssh -tt ends lines with \r
    (f"step 10/100 | loss 2.1{HEARTBEAT_MARK} 1 10", "step 10/100 | loss 2.1", (1, 10)),
    ("step     10/100 | loss 2.1000", "step     10/100 | loss 2.1000", None),
])
def test_feed_hides_heartbeats_and_passes_everything_else(line, shown, beat):
    watch = StallWatch(5.0, clock=Clock(1000.0))
    assert watch.feed(line) == shown
    assert watch.armed is (beat is not None)
    if beat:
        assert watch.steps == {beat[0]: beat[1]}


# ---------------------------------------------------------------- reading the hosts

WAITING = """Thread 0x00007f295ea1c6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f295f65bb80 (most recent call first):
  File "/work/reference_train/train.py", line 412 in train_step
  File "/work/reference_train/train.py", line 460 in run
  File "/work/reference_train/train.py", line 590 in main
  File "/work/reference_train/train.py", line 604 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in run_module
  File "/work/mlxcluster/rank_wrapper.py", line 76 in run_program
  File "/work/mlxcluster/rank_wrapper.py", line 97 in main
"""

EVALUATING = WAITING.replace("line 412 in train_step", "line 333 in evaluate")


def test_stacks_are_split_per_thread_and_the_main_one_is_found():
    threads = split_threads(WAITING)
    assert [t[0].function for t in threads] == ["wait", "train_step"]
    state = RankState(0, "labhost1", 10, "Sl", 1.0, 1.0, WAITING)
    assert state.where.short == "train_step at train.py:412"


@pytest.mark.parametrize("text, seconds", [
    ("ticks:523", 5.23), ("ps:00:01:02", 62.0), ("ps:1-02:03:04", 93784.0), ("ps:0:05.23", 5.23),
    ("ps:none", None), ("none", None), ("ticks:x", None),
])
def test_cpu_time_from_proc_ticks_or_ps(text, seconds):
    got = cpu_seconds(text, 100.0)
    assert got == (pytest.approx(seconds) if seconds is not None else None)


COLLECTED = f"""TCK 100
R 0 4101 ticks:900 Sl 00:00:09
R 2 4103 ticks:700 Sl 00:00:07
C 0 4101 ticks:950 Sl 00:00:09
==> 0
{WAITING}<== 0
C 2 4103 ticks:700 T 00:00:07
==> 2
<== 2
"""


def test_the_collect_output_is_read_back_per_rank():
    got = parse_collect(COLLECTED)
    assert [(r, pid, stat) for r, pid, stat, *_ in got] == [(0, 4101, "Sl"), (2, 4103, "T")]
    assert got[0][3:5] == (9.0, 9.5) and got[1][3:5] == (7.0, 7.0)
    assert "train_step" in got[0][5] and got[1][5] == ""


# ---------------------------------------------------------------- the diagnosis


def three(stopped_rank=1, stacks=(WAITING, "", WAITING)):
    hosts = ["labhost1", "labhost2", "labhost3"]
    return [RankState(r, hosts[r], 4100 + r, "T" if r == stopped_rank else "Sl",
                      5.0, 5.0 if r == stopped_rank else 5.0, stacks[r]) for r in range(3)]


def test_a_stopped_rank_is_named_with_its_host_and_the_others_place():
    text = diagnose(three())
    assert text == ("rank 1 on labhost2 is stopped (state T, CPU time not advancing); "
                    "ranks 0 and 2 wait in train_step at train.py:412")


def test_a_rank_elsewhere_than_the_others_is_named():
    states = [RankState(r, f"h{r}", 10 + r, "Rl" if r == 2 else "Sl", 1.0, 2.0 if r == 2 else 1.0,
                        EVALUATING if r == 2 else WAITING) for r in range(4)]
    text = diagnose(states)
    assert text == ("rank 2 on h2 is in evaluate at train.py:333 (running); "
                    "ranks 0, 1 and 3 wait in train_step at train.py:412")


def test_every_rank_in_one_place_says_no_single_rank_stands_out():
    states = [RankState(r, f"h{r}", 10 + r, "Sl", 1.0, 1.0, WAITING) for r in range(3)]
    assert diagnose(states).startswith("every rank (ranks 0, 1 and 2) waits in "
                                       "train_step at train.py:412: no single rank stands out")


def test_gone_and_unreachable_ranks_are_said_so():
    states = [RankState(0, "h0", 10, "Sl", 1, 1, WAITING),
              RankState(1, "h1", 11, None, 1, None, ""),
              RankState(2, "h2", error="ssh: connect to host h2 port 22: Connection timed out")]
    text = diagnose(states)
    assert "rank 1 on h1 is gone (the process no longer exists)" in text
    assert "rank 2 on h2 is unknown (ssh: connect to host h2 port 22: Connection timed out)" in text
    assert text.endswith("rank 0 waits in train_step at train.py:412")


def test_a_rank_that_never_registered_is_said_not_to_have_started():
    """Seen with a fish login shell on labhost2: mlx.launch's command never ran."""
    states = [RankState(0, "labhost1", 10, "Sl", 1, 1, WAITING), RankState(1, "labhost2")]
    assert diagnose(states) == ("rank 1 on labhost2 is not started (no process registered; "
                                "mlxcluster doctor checks that host); rank 0 waits in train_step "
                                "at train.py:412")


def test_two_ranks_in_two_places_are_both_listed():
    states = [RankState(0, "h0", 10, "Sl", 1, 1, WAITING), RankState(1, "h1", 11, "Sl", 1, 1, EVALUATING)]
    assert diagnose(states) == ("rank 0 on h0 in train_step at train.py:412; "
                                "rank 1 on h1 in evaluate at train.py:333")


def test_the_report_holds_every_rank_and_its_full_stacks(tmp_path):
    states = three()
    folder = save_report(tmp_path / "stall", diagnose(states), states, "stalled: no progress for 21 s")
    summary = (folder / "summary.txt").read_text()
    assert "rank 1 on labhost2 is stopped" in summary
    assert rank_lines(states)[1] in summary
    assert rank_lines(states)[0] == ("rank 0 on labhost1: pid 4100, sleeping (state Sl, CPU time not "
                                     "advancing), in train_step at train.py:412")
    assert "File \"/work/mlxcluster/rank_wrapper.py\"" in (folder / "rank0.txt").read_text()
    assert "dumps only once continued" in (folder / "rank1.txt").read_text()


# ---------------------------------------------------------------- the collect script, for real


class LocalHost:
    def __init__(self, name):
        self.name, self.ssh = name, "127.0.0.1"


class Result:
    def __init__(self, proc):
        self.ok, self.output, self.error = proc.returncode == 0, proc.stdout, proc.stderr


def test_collect_script_reads_real_processes_on_this_host(tmp_path):
    """Two wrapped ranks here, one stopped with SIGSTOP: the script finds both
    by their pid files, the stopped one as T, the other with its stack."""
    import os
    import signal
    import socket
    import sys
    import time

    run_id = f"mlxtrain-t{os.getpid():x}"
    repo = Path(__file__).resolve().parents[1]
    script = tmp_path / "waiter.py"
    script.write_text("import time\ndef wait_in_collective():\n    time.sleep(60)\n"
                      "print('ready', flush=True)\nwait_in_collective()\n")
    procs = []
    try:
        for rank in (0, 1):
            env = {**os.environ, "PYTHONPATH": str(repo), "MLX_RANK": str(rank)}
            procs.append(subprocess.Popen([sys.executable, "-X", f"mlxcluster_run={run_id}", "-m",
                                           "mlxcluster.jobs.rank_wrapper", str(script)],
                                          env=env, stdout=subprocess.PIPE, text=True))
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        os.kill(procs[1].pid, signal.SIGSTOP)
        time.sleep(0.2)
        hosts = [LocalHost(socket.gethostname()), LocalHost(socket.gethostname())]
        states = collect_states(
            hosts, run_id,
            run_script=lambda h, s: Result(waits.run(["bash", "-c", s])),
            for_each_host=lambda hs, fn: [fn(h) for h in hs])
        assert [s.pid for s in states] == [procs[0].pid, procs[1].pid]
        assert states[0].stat[0] == "S" and states[0].where.function == "wait_in_collective"
        assert states[1].stat[0] == "T" and states[1].stacks == ""
        assert diagnose(states).startswith(f"rank 1 on {hosts[1].name} is stopped (state T")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        subprocess.run(["rm", "-rf", f"/tmp/mlxcluster-stacks/{run_id}"], check=False)


def test_the_run_id_never_appears_literally_in_the_collect_script():
    assert "mlxtrain-abc123" not in collect_script("mlxtrain-abc123")


# ---------------------------------------------------------------- the launcher's loop


def test_run_streaming_hides_heartbeats_and_stops_a_stalled_launcher():
    """A 'launcher' that beats twice, prints a line, then hangs: the watch
    (1 s) fires, on_stall runs once, the launcher's group is stopped, and
    on_stall's error is raised; the user saw only the ordinary line."""
    import sys
    import time

    from mlxcluster.jobs.stall import Stalled
    from mlxcluster.jobs.watch import run_streaming

    program = (f"import time\nprint('{HEARTBEAT_MARK} 0 1', flush=True)\n"
               f"print('step 1 | loss 2.0', flush=True)\nprint('{HEARTBEAT_MARK} 0 2', flush=True)\n"
               "time.sleep(120)\n")
    shown, calls = [], []

    def on_stall():
        calls.append(time.monotonic())
        return Stalled("stalled for the test")

    watch = StallWatch(1.0)
    started = time.monotonic()
    with pytest.raises(Stalled, match="stalled for the test"):
        run_streaming([sys.executable, "-c", program], lambda _s, line: shown.append(line),
                      watch=watch, on_stall=on_stall, timeout=60)
    assert time.monotonic() - started < 10
    assert len(calls) == 1 and shown == ["step 1 | loss 2.0"]
    assert watch.steps == {0: 2}


def test_run_streaming_without_a_stall_returns_the_exit_code():
    import sys

    from mlxcluster.jobs.watch import run_streaming

    program = f"print('{HEARTBEAT_MARK} 0 1', flush=True)\nprint('{HEARTBEAT_MARK} 0 done')\n"
    outcome = run_streaming([sys.executable, "-c", program], lambda *_: None,
                            watch=StallWatch(1.0), on_stall=lambda: AssertionError("no stall"))
    assert outcome.exit_code == 0 and outcome.lines == ()


def test_without_the_wrapper_the_main_thread_is_the_one_from_a_module():
    """The smoke worker runs as a script: its main thread's outermost frame is
    <module>; the progress thread, dumped first here, starts in threading."""
    dump = """Current thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f0000000002 (most recent call first):
  File "/tmp/mlxsmoke-1/worker.py", line 446 in run_rank
  File "/tmp/mlxsmoke-1/worker.py", line 418 in main
  File "/tmp/mlxsmoke-1/worker.py", line 500 in <module>
"""
    assert RankState(0, "h", 1, "S", 0, 0, dump).where.short == "run_rank at worker.py:446"


def test_a_frame_at_a_collective_is_named_by_it(tmp_path):
    """Read from the file where it is (lab: shared filesystem): a statement
    over several lines counts from its first line."""
    from mlxcluster.jobs.stall import Frame

    source = tmp_path / "train.py"
    source.write_text("def run():\n"
                      "    loss = (mx.distributed.all_sum(loss_sum, group=g)\n"
                      "            / (size * steps)).item()\n"
                      "    mx.eval(model.parameters())\n")
    assert Frame(str(source), 3, "run").short == "all_sum at train.py:3 (in run)"
    assert Frame(str(source), 2, "run").short == "all_sum at train.py:2 (in run)"
    assert Frame(str(source), 4, "run").short == "run at train.py:4"
    assert Frame(str(tmp_path / "elsewhere.py"), 3, "run").short == "run at elsewhere.py:3"


def test_beside_a_stopped_rank_the_others_are_placed_not_blamed():
    """MPI: with rank 1 stopped mid all-reduce, rank 0 may have finished its
    part and wait in the next collective while rank 2 still waits in this one
    (seen in CI). Both wait on rank 1; neither is a suspect."""
    text = diagnose(three(stacks=(EVALUATING, "", WAITING)))
    assert text == ("rank 1 on labhost2 is stopped (state T, CPU time not advancing); "
                    "ranks 0 and 2 wait at different places: rank 0 in evaluate at train.py:333, "
                    "rank 2 in train_step at train.py:412")
