"""Verdicts from event streams: who caused a failure, who hung, who was only
stopped. Worker lines are fed by hand with a fake clock (a unit of logic; the
real streams are exercised by test_smoke_local.py and the lab tests)."""

from __future__ import annotations

import json

from mlxcluster.errors import EXIT_FAILED, EXIT_OK, EXIT_STALLED
from mlxcluster.jobs.hosts import local_hosts
from mlxcluster.smoke.launch import WorkerOptions, plan_mlx_launch
from mlxcluster.smoke.run import SmokeReport, exit_code_for
from mlxcluster.smoke.watch import Watch, blame_hang, outcomes
from tests.fakes import Clock


def watch_of(n: int) -> tuple[Watch, Clock, object]:
    clock = Clock()
    # Ports nobody listens on: every probe answers "refused", i.e. no evidence.
    plan = plan_mlx_launch("ring", local_hosts(n), WorkerOptions(), {}, run_id="mlxsmoke-t",
                           port=1)
    return Watch(plan, clock), clock, plan


def say(watch: Watch, **event) -> None:
    watch.on_stdout("MLXSMOKE " + json.dumps(event))


def test_the_rank_that_exits_is_the_cause_not_the_one_that_lost_it():
    watch, clock, _ = watch_of(3)
    for r in range(3):
        say(watch, event="ready", rank=r, size=3)
    clock.now += 0.1  # rank 2 notices first that its peer is gone ...
    say(watch, event="error", rank=2, message="RuntimeError: [ring] connection to a peer was lost")
    clock.now += 0.1  # ... then rank 1's own exit arrives
    say(watch, event="exit", rank=1, code=3)
    watch.on_stderr("\x1b[33m[WARN] Node with rank 0 exited with code -15 \x1b[0m")
    result = outcomes(watch, [], {1: "test hook"})
    assert [(o.status, o.cause) for o in result] == [
        ("stopped", False), ("exited", True), ("stopped", False)]
    assert result[1].detail == "exited with code 3 in phase ready"
    assert result[1].stderr_tail == "test hook"
    assert "after rank 1 failed" in result[2].detail


def test_wrong_results_stay_failures_wherever_seen():
    watch, clock, _ = watch_of(2)
    bad = dict(event="check", op="all_gather", dtype="int32", size=7, bytes=28, ok=False,
               bad_index=3, got=9.0, expected=8.0)
    say(watch, **bad, rank=1)
    clock.now += 0.2
    say(watch, **bad, rank=0)
    result = outcomes(watch, [], {})
    assert [o.status for o in result] == ["failed", "failed"]
    assert result[1].cause and not result[0].cause
    assert result[1].detail == ("wrong result in all_gather int32 size 7: first bad index 3, "
                                "got 9.0, expected 8.0")


def test_hang_blames_the_rank_that_fell_behind():
    watch, clock, plan = watch_of(3)
    for r in range(3):
        say(watch, event="ready", rank=r, size=3)
    for r in (0, 2):  # ranks 0 and 2 enter all_sum and wait there; rank 1 never does
        say(watch, event="phase", rank=r, phase="correctness")
        say(watch, event="heartbeat", rank=r, phase="correctness", step="all_sum float32 1")
    say(watch, event="heartbeat", rank=1, phase="ready", step="")
    clock.now += 2
    for r in range(3):
        say(watch, event="heartbeat", rank=r, phase="?", step="all_sum float32 1" if r != 1 else "")
    clock.now += 10
    assert [s.rank for s in watch.overdue(10)] == [0, 1, 2]
    blamed = blame_hang(watch, plan, 10)
    assert [(o.rank, o.status) for o in blamed] == [(1, "hung")]
    assert blamed[0].detail.startswith("no progress for 10 s in phase ready")
    assert [o.status for o in outcomes(watch, blamed, {})] == ["stopped", "hung", "stopped"]


def test_a_launcher_that_dies_leaves_every_unfinished_rank_suspect():
    watch, _, _ = watch_of(2)
    say(watch, event="ready", rank=0, size=2)
    say(watch, event="done", rank=0, ok=True)
    result = outcomes(watch, [], {})
    assert result[0].status == "passed"
    assert result[1].status == "exited"
    assert result[1].detail.startswith("exited before finishing (phase init)")


def test_open_mpi_exit_report_names_the_rank():
    watch, _, _ = watch_of(3)
    for line in ("prterun detected that one or more processes exited with non-zero status,",
                 "   Process name: [prterun-vm-4304@1,2]", "   Exit code:    3"):
        watch.on_stderr(line)
    assert watch.first_failure().rank == 2
    assert outcomes(watch, [], {})[2].detail == "exited with code 3 in phase init"


def test_ssh_s_exit_code_is_explained_as_a_lost_connection():
    """mlx.launch passes on ssh's 255 when a host stops answering (keepalive)."""
    watch, _, _ = watch_of(3)
    watch.on_stderr("[WARN] Node with rank 2 exited with code 255 ")
    detail = outcomes(watch, [], {})[2].detail
    assert detail.startswith("its ssh connection failed or was lost in phase init (exit 255")


def test_bench_rows_need_every_rank():
    watch, _, _ = watch_of(2)
    say(watch, event="bench", rank=0, op="all_sum", dtype="float32", bytes=1024, times=[1e-4, 2e-4])
    from mlxcluster.smoke.watch import bench_rows
    assert bench_rows(watch) == []
    say(watch, event="bench", rank=1, op="all_sum", dtype="float32", bytes=1024, times=[3e-4, 1e-4])
    [row] = bench_rows(watch)
    assert (row.op, row.ranks, row.p50_s) == ("all_sum", 2, 2.5e-4)


def test_each_soak_report_restarts_the_deadline_so_it_bounds_one_iteration():
    watch, clock, _ = watch_of(2)
    for rank in (0, 1):
        say(watch, event="phase", rank=rank, phase="soak")
    for _ in range(5):  # 40 s of soak, a report from each rank every 8 s
        clock.now += 8
        for rank in (0, 1):
            say(watch, event="soak", rank=rank, elapsed=0.0, ops={"all_sum": {"iterations": 1}})
        assert watch.overdue(10) == []
    clock.now += 9
    say(watch, event="soak", rank=0, elapsed=0.0, ops={"all_sum": {"iterations": 2}})
    clock.now += 2  # rank 1 has reported nothing for 11 s
    assert [s.rank for s in watch.overdue(10)] == [1]
    assert watch.soak.latest[0]["ops"]["all_sum"]["iterations"] == 2


def hung_behind(watch: Watch, clock: Clock, plan) -> list:
    """Ranks 0 and 2 wait in all_sum; rank 1 never gets there: the deadline blames it."""
    for r in range(3):
        say(watch, event="ready", rank=r, size=3)
    for r in (0, 2):
        say(watch, event="heartbeat", rank=r, phase="ready", step="all_sum float32 1")
    clock.now += 11
    return blame_hang(watch, plan, 10)


def report_of(backend: str, ranks: list) -> SmokeReport:
    return SmokeReport(backend, "passed" if all(o.status == "passed" for o in ranks) else "failed",
                       ranks=ranks)


def test_a_hang_found_by_the_deadline_exits_4_a_failure_1():
    """Exit 4 (stalled, as train and run) when the cause is a rank that made
    no progress within its deadline; 1 when a rank failed, exited or gave a
    wrong result, even if another rank was blamed for a hang after it."""
    watch, clock, plan = watch_of(3)
    stalled = report_of("ring", outcomes(watch, hung_behind(watch, clock, plan), {}))
    assert stalled.stalled and stalled.failed_ranks[0].rank == 1
    assert exit_code_for([stalled], single_backend=True) == EXIT_STALLED

    watch, clock, plan = watch_of(3)
    blamed = hung_behind(watch, clock, plan)
    say(watch, event="exit", rank=2, code=3)  # a rank that exited is a failure, whatever hung
    exited = report_of("ring", outcomes(watch, blamed, {}))
    assert not exited.stalled and exit_code_for([exited], True) == EXIT_FAILED

    watch, _, _ = watch_of(2)
    say(watch, event="check", rank=1, op="all_sum", dtype="float32", size=1, bytes=4, ok=False,
        bad_index=0, got=4.0, expected=3.0)
    wrong = report_of("mpi", outcomes(watch, [], {}))
    assert not wrong.stalled and exit_code_for([wrong], True) == EXIT_FAILED

    passed = SmokeReport("mpi", "passed")
    unavailable = SmokeReport("jaccl", "unavailable", reason="local-0 runs Linux, not macOS")
    # Every backend tried: a stall beside a pass or an unavailable one is still a stall;
    # beside a failure, the failure's 1 wins (the more definite verdict).
    assert exit_code_for([stalled, passed, unavailable], single_backend=False) == EXIT_STALLED
    assert exit_code_for([stalled, wrong], single_backend=False) == EXIT_FAILED
    assert exit_code_for([passed, unavailable], single_backend=False) == EXIT_OK
