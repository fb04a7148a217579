"""The soak's planning and summary: seeded random sizes every rank agrees on,
iterations and the slowest iteration per op over every rank, wrong results
with their rank, op, size and first bad element; the loop itself on a real
MLX group of one; the flags."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.cli.smoke import render_soak, soak_progress_line
from mlxcluster.jobs.cleanup import kill_local_marked
from mlxcluster.smoke import worker
from mlxcluster.smoke.launch import WorkerOptions, worker_args
from mlxcluster.smoke.soak import SoakWatch, WrongResult, wrong_result
from tests.interrupt_helpers import SmokeWorkersRunning, interrupt_when, processes_with


def take(seed, n=60, ops=worker.OPS, dtypes=("float32", "float16", "int32"), lo=1024, hi=1 << 20):
    return list(itertools.islice(worker.soak_schedule(seed, ops, dtypes, lo, hi), n))


def test_the_same_seed_gives_the_same_sizes_and_another_seed_others():
    assert take(7) == take(7)  # every rank, and a replay, call the same collectives
    assert take(7) != take(8)


def test_sizes_stay_within_the_range_and_every_op_gets_its_turn():
    schedule = take(3, n=300)
    assert [op for op, _, _ in schedule[:6]] == list(worker.OPS) * 2
    nbytes = [count * worker.DTYPES[dtype].size for _, dtype, count in schedule]
    assert all(1024 - 4 <= b <= 1 << 20 for b in nbytes), (min(nbytes), max(nbytes))
    # Drawn on a log scale: small and large sizes both come up.
    assert min(nbytes) < 4096 and max(nbytes) > 256 << 10
    assert {dtype for _, dtype, _ in schedule} == {"float32", "float16", "int32"}


def soak_event(rank, elapsed, **ops):
    return {"event": "soak", "rank": rank, "elapsed": elapsed,
            "ops": {op: {"iterations": n, "slowest_bytes": b, "slowest_s": s}
                    for op, (n, b, s) in ops.items()}}


def test_summary_takes_the_latest_tally_of_every_rank_and_the_slowest_anywhere():
    watch = SoakWatch()
    watch.add(soak_event(0, 1.0, all_sum=(5, 64, 9.0)))  # superseded by rank 0's next event
    watch.add(soak_event(0, 20.0, all_sum=(40, 4096, 0.02), all_gather=(39, 512, 0.5)))
    watch.add(soak_event(1, 20.5, all_sum=(41, 8192, 0.07), all_gather=(39, 512, 0.1)))
    watch.add(soak_event(2, 19.0, all_sum=(40, 4096, 0.03)))  # never finished an all_gather
    watch.add({"event": "soak", "rank": 3})  # no tally: ignored
    summary = watch.summary(seed=11, duration_s=20.0)
    assert summary.seed == 11 and summary.elapsed_s == 20.5
    by_op = {o.op: o for o in summary.ops}
    assert [o.op for o in summary.ops] == ["all_sum", "all_gather"]
    assert (by_op["all_sum"].iterations, by_op["all_sum"].slowest_bytes,
            by_op["all_sum"].slowest_s, by_op["all_sum"].slowest_rank) == (40, 8192, 0.07, 1)
    assert by_op["all_gather"].iterations == 0  # rank 2 completed none
    assert (by_op["all_gather"].slowest_rank, by_op["all_gather"].slowest_s) == (0, 0.5)
    assert summary.iterations == 40 and summary.wrong == []


def test_wrong_results_carry_rank_op_size_and_first_mismatch():
    check = {"event": "check", "rank": 2, "op": "send_recv", "dtype": "int32", "size": 1001,
             "bytes": 4004, "ok": False, "peer": 1, "bad_index": 517, "got": 7.0, "expected": 6.0}
    summary = SoakWatch().summary(1, 60.0, [check])
    assert summary.wrong == [WrongResult(2, "send_recv", "int32", 1001, 4004, 517, 7.0, 6.0, 1)]
    text = render_soak("ring", summary)
    assert ("wrong result: rank 2, send_recv int32 size 1001 (4004) from rank 1: first bad "
            "index 517, got 7.0, expected 6.0") in text
    assert "seed 1 (replay: --soak 60s --seed 1)" in text
    assert json.loads(json.dumps(summary.to_dict()))["wrong"][0]["bad_index"] == 517
    assert wrong_result({"rank": 0, "op": "all_sum"}).bad_index is None


def test_progress_line_names_the_ops_and_their_iterations():
    watch = SoakWatch()
    watch.add(soak_event(0, 12.4, all_sum=(30, 64, 0.1), send_recv=(29, 64, 0.1)))
    assert soak_progress_line("mpi", watch.summary(3, 60.0)) == \
        "soak mpi: 12/60 s, all_sum 30, send_recv 29"


@pytest.fixture(scope="module")
def group():
    return mx.distributed.init()  # the singleton group: no launcher needed


def soak_args(seconds, lo=1024, hi=8192):
    return argparse.Namespace(soak=seconds, seed=4, ops=list(worker.OPS),
                              dtypes=["float32", "int32"], lo=lo, hi=hi)


def events(capsys, kind):
    return [json.loads(line[len(worker.PREFIX):]) for line in capsys.readouterr().out.splitlines()
            if line.startswith(worker.PREFIX) and f'"event": "{kind}"' in line]


def test_the_soak_loop_runs_for_its_duration_on_a_real_group(group, capsys):
    reported = []
    ticks = itertools.count()
    clock = lambda: next(ticks) * 0.01  # noqa: E731 - every call 10 ms later
    progress = worker.Progress(0)
    ok = worker.run_soak(worker.Collectives(group), soak_args(2.0), progress, reported.append,
                         clock=clock)
    assert ok and reported == []
    last = events(capsys, "soak")[-1]
    # A group of one has no peer for send/recv: all_sum and all_gather only, in turn.
    assert set(last["ops"]) == {"all_sum", "all_gather"}
    counts = [last["ops"][op]["iterations"] for op in ("all_sum", "all_gather")]
    assert counts[0] > 5 and counts[0] - counts[1] in (0, 1)
    assert all(1024 - 4 <= last["ops"][op]["slowest_bytes"] <= 8192 for op in last["ops"])


def test_a_wrong_result_is_reported_and_ends_the_soak(group, capsys):
    reported = []
    ok = worker.run_soak(worker.Corrupting(group, index=0), soak_args(60.0),
                         worker.Progress(0), reported.append)
    assert not ok
    assert len(reported) == 1 and reported[0]["op"] == "all_sum" and reported[0]["bad_index"] == 0
    assert events(capsys, "soak")[-1]["ops"]["all_sum"]["iterations"] == 1


def test_the_worker_is_told_the_soak_and_its_seed():
    args = worker_args("ring", 3, "mlxsmoke-1", "/tmp/x", WorkerOptions(soak_s=90.0, seed=42))
    assert args[-4:] == ["--soak", "90", "--seed", "42"]
    parsed = worker.parse_args(args)
    assert (parsed.soak, parsed.seed) == (90.0, 42)
    assert "--soak" not in worker_args("ring", 3, "mlxsmoke-1", "/tmp/x", WorkerOptions())


@pytest.mark.parametrize("flags, said", [
    (["--soak", "ten"], "is not a duration"),
    (["--soak", "0.5s"], "below the minimum of 1 s"),
    (["--soak", "30s", "--bench"], "--soak and --bench are two runs"),
    (["--seed", "5"], "--seed chooses a soak's sizes"),
    (["--phase-timeout", "2h"], "above the maximum of 3600 s"),  # a duration too, as people write it
])
def test_bad_soak_flags_are_refused_before_anything_runs(flags, said):
    result = CliRunner().invoke(main, ["smoke", "--local", "2", *flags])
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output


def test_ctrl_c_during_a_soak_stops_every_rank_and_prints_the_summary_so_far(tmp_path):
    """Real local ranks (ring), a real SIGINT to the process group as a
    terminal sends it, some seconds into a 10-minute soak."""
    workers = SmokeWorkersRunning(2)
    seen = []  # stderr so far: the progress lines (one every 10 s)

    def soaking(proc) -> bool:
        """Once a progress line counts iterations of every op (init may take
        long on a loaded machine: wait for the soak itself, not a time)."""
        if not workers(proc):
            return False
        os.set_blocking(proc.stderr.fileno(), False)
        try:  # below the text wrapper: what is read here is not read again
            seen.append(os.read(proc.stderr.fileno(), 1 << 16).decode(errors="replace"))
        except BlockingIOError:
            pass
        return re.search(r"soak ring: \d+/600 s, all_sum [1-9]\d*, all_gather [1-9]\d*, "
                         r"send_recv [1-9]", "".join(seen)) is not None

    try:
        run = interrupt_when([sys.executable, "-m", "mlxcluster", "smoke", "--local", "2", "--backend",
                              "ring", "--soak", "10m", "--seed", "5", "--sizes", "1K:16K",
                              "--dtypes", "float32", "--phase-timeout", "60"],
                             soaking, signal.SIGINT, cwd=str(tmp_path), ready_timeout=240)
        left, alive = processes_with(workers.run_id), workers.family_alive()  # before any help
    finally:  # a failed test must not leave its ranks: the launcher has a session of its own
        if workers.run_id:
            kill_local_marked(workers.run_id)
    assert run.returncode == 130, run.stderr
    assert f"interrupted (SIGINT): smoke ring run {workers.run_id} stopped on every host" in run.stderr
    summary = re.search(r"ring soak: \d+ s of 600 s, (\d+) iterations, seed 5 \(replay: --soak "
                        r"600s --seed 5\)", run.stdout)
    assert summary and int(summary.group(1)) > 0, run.stdout + run.stderr
    assert re.search(r"^all_sum +[1-9]\d* ", run.stdout, re.M), run.stdout
    assert "Traceback" not in run.stdout + run.stderr
    assert left == [] and alive == []
    assert not Path("/tmp", workers.run_id).exists()
