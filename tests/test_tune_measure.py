"""tune's rounds with injected smoke runs, streams and clock: alternation,
the budget, failures, the decision, the files written, and --budget values."""

from __future__ import annotations

import json

import click
import pytest

from mlxcluster.cli.params import Duration
from mlxcluster.inventory.inventory import Host, Inventory
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.smoke.run import SmokeReport
from mlxcluster.smoke.stats import BenchRow
from mlxcluster.tune.candidates import Candidate
from mlxcluster.tune.files import winner_files
from mlxcluster.tune.measure import Plan, StreamError, measure, mpi_args, worker_options
from mlxcluster.tune.result import to_dict
from mlxcluster.tune.run import run_tune, tune_sizes
from tests.fakes import Clock

M32 = 32 << 20
HOSTS = tuple(RankHost(f"h{i}", f"10.9.0.{i}", (f"10.9.0.{i}",), "/venv/bin/python") for i in (1, 2, 3))


class FakeCluster:
    """Smoke runs that take ``seconds`` of a fake clock and report the busbw
    given per candidate label (a list: one value per call)."""

    def __init__(self, busbw: dict[str, list[float]], seconds: float = 10.0, fail: str = "",
                 fail_from_call: int = 1, reason: str = "rank 1 on h2: hung"):
        self.busbw, self.seconds, self.fail = busbw, seconds, fail
        self.fail_from_call, self.reason = fail_from_call, reason
        self.clock = Clock(0.0)
        self.calls: list[str] = []
        self.streams: list[int] = []

    def run(self, candidate: Candidate, plan: Plan) -> SmokeReport:
        self.clock.now += self.seconds
        self.calls.append(candidate.label)
        if candidate.label == self.fail and self.calls.count(candidate.label) >= self.fail_from_call:
            return SmokeReport(candidate.backend, "failed", reason=self.reason)
        bw = self.busbw[candidate.label][self.calls.count(candidate.label) - 1]
        # all_gather reports the gathered total: a multiple of 3 ranks x 4 bytes.
        rows = [BenchRow(op, "float32", size if op == "all_sum" else size // 12 * 12, 3,
                         1 / bw, 1.1 / bw, bw, bw)
                for op in ("all_sum", "all_gather", "send_recv") for size in plan.sizes]
        return SmokeReport(candidate.backend, "passed", bench=rows)

    def stream(self, streams: int, seconds: float) -> float:
        self.clock.now += seconds
        self.streams.append(streams)
        if streams == 8:
            raise StreamError("tcp receiver on h2 did not start")
        return 0.5 * streams


def test_rounds_alternate_and_stop_before_the_budget_runs_out():
    cands = [Candidate("ring", connections=1), Candidate("ring", connections=2)]
    cluster = FakeCluster({"ring x1/ip": [1.0] * 9, "ring x2/ip": [2.0] * 9})
    # One round = 2 runs x 10 s + 2 streams x 1 s = 22 s; a 50 s budget holds 2 rounds.
    m = measure(cands, Plan((M32,), budget_s=50, tcp_seconds=1.0, max_rounds=9), cluster.run,
                cluster.stream, clock=cluster.clock)
    assert m.rounds == 2 and m.stopped_by == "budget" and m.round_s == [22.0, 22.0]
    assert cluster.calls == ["ring x1/ip", "ring x2/ip", "ring x2/ip", "ring x1/ip"]
    assert cluster.streams == [1, 2, 2, 1]
    assert m.tcp == {1: [0.5, 0.5], 2: [1.0, 1.0]} and m.tcp_gbps(2) == 1.0


def test_one_round_always_runs_and_max_rounds_stops():
    cands = [Candidate("ring")]
    cluster = FakeCluster({"ring x1/ip": [1.0] * 9})
    m = measure(cands, Plan((M32,), budget_s=1), cluster.run, None, clock=cluster.clock)
    assert m.rounds == 1 and m.stopped_by == "budget"
    m = measure(cands, Plan((M32,), budget_s=1e6, max_rounds=3), cluster.run, None, clock=cluster.clock)
    assert m.rounds == 3 and m.stopped_by == "rounds"


def test_a_failed_candidate_is_not_run_again_and_cannot_win():
    cluster = FakeCluster({"ring x1/ip": [1.0] * 9, "ring x2/ip": [1.5] * 9,
                           "ring x4/ip": [9.0] * 9}, fail="ring x4/ip")
    result = run_tune(HOSTS, ("ring",), Plan((M32,), budget_s=1e6, max_rounds=3, tcp_seconds=1),
                      cluster.run, cluster.stream, clock=cluster.clock)
    assert cluster.calls.count("ring x4/ip") == 1
    assert result.winner == Candidate("ring", connections=2)
    assert result.decision.confidence == "high"
    assert result.decision.failed == {Candidate("ring", connections=4): "failed: rank 1 on h2: hung"}
    doc = json.loads(json.dumps(to_dict(result)))
    assert doc["winner"]["connections_per_ip"] == 2 and doc["rounds"] == 3
    assert doc["failed"] == {"ring x4/ip": "failed: rank 1 on h2: hung"}
    # ring x2 opens 2 streams: its raw TCP is the 2-stream figure (0.5 GB/s per stream here).
    row = next(r for r in doc["decision"]["rows"] if r["candidate"] == "ring x2/ip")
    assert row["tcp_gbps"] == 1.0 and row["of_tcp"] == 1.5


# What smoke's watchdog reported for `mpi links=8` on the 200 Mbit/s lab link
# (bench/tune_slow_link.py, 2026-11-23, run A).
NO_PROGRESS = ("rank 0 on labhost1: no progress for 120 s in phase bench (step: all_sum float32 "
               "16777216); its process is sleeping (state Sl, CPU time advancing), in all_sum at worker.py:104")


def test_a_candidate_fastest_until_it_hangs_cannot_win_and_the_reason_is_shown():
    """mpi links=8 passed round 1 as the fastest, then made no progress in
    round 2: its round-1 figures must not make it the winner, it is not run
    in round 3, and the output names it with the watchdog's reason."""
    from mlxcluster.cli.tune import render

    cluster = FakeCluster({"mpi links=1": [1.0] * 9, "mpi links=8": [5.0] * 9},
                          fail="mpi links=8", fail_from_call=2, reason=NO_PROGRESS)
    result = run_tune(HOSTS, ("mpi",), Plan((M32,), budget_s=1e6, max_rounds=3, tcp_seconds=1),
                      cluster.run, cluster.stream, clock=cluster.clock, mpi_tcp_links=(1, 8),
                      mpi_allreduce=("default",))
    assert cluster.calls.count("mpi links=8") == 2 and cluster.calls.count("mpi links=1") == 3
    assert result.winner == Candidate("mpi", tcp_links=1)
    assert [s.candidate for s in result.decision.scores] == [Candidate("mpi", tcp_links=1)]
    text = render(result)
    assert f"failed, not run again, cannot win: mpi links=8: failed: {NO_PROGRESS}" in text
    assert any(line.startswith("✗ mpi links=8") for line in text.splitlines())


def test_the_decision_is_all_sum_at_32_mib_and_a_stream_failure_is_reported():
    cluster = FakeCluster({"mpi links=1": [1.0] * 9, "mpi links=2": [1.0] * 9,
                           "mpi links=4": [1.0] * 9, "mpi links=8": [1.0] * 9,
                           "mpi links=1 allreduce=ring": [1.0] * 9, "mpi links=4 allreduce=ring": [1.0] * 9})
    result = run_tune(HOSTS, ("mpi",), Plan(tune_sizes(16 << 20, 64 << 20), budget_s=1e6,
                                            max_rounds=2, tcp_seconds=1),
                      cluster.run, cluster.stream, clock=cluster.clock)
    assert [(c.op, c.bytes) for c in result.choices] == [
        ("all_sum", 16 << 20), ("all_sum", M32), ("all_sum", 64 << 20),
        ("all_gather", 16 << 20), ("all_gather", M32), ("all_gather", 64 << 20)]
    assert result.decision.bytes == M32 and result.decision.op == "all_sum"
    # All equal: a tie, and the simplest (one link, Open MPI's own allreduce) is chosen.
    assert result.decision.confidence == "tie" and result.winner == Candidate("mpi", tcp_links=1)
    assert result.measurements.tcp_errors == {8: "tcp receiver on h2 did not start"}
    assert result.measurements.tcp_gbps(8) is None


def test_candidates_reach_the_launchers():
    plan = Plan((1 << 20, M32), budget_s=60, iters=3)
    opts = worker_options(Candidate("ring", connections=4), plan)
    assert (opts.connections_per_ip, opts.lo_bytes, opts.hi_bytes, opts.iters) == (4, 1 << 20, M32, 3)
    assert opts.ops == ("all_sum", "all_gather") and opts.bench and not opts.check
    assert worker_options(Candidate("mpi", tcp_links=8), plan).connections_per_ip == 1
    assert mpi_args(Candidate("mpi", tcp_links=8)) == ("--mca", "btl_tcp_links", "8")
    assert mpi_args(Candidate("ring", connections=2)) == ()


INV = Inventory("c", "/venv/bin/python", tuple(
    Host(f"h{i}", f"10.9.0.{i}", (f"10.9.0.{i}", f"10.8.0.{i}"), python="/venv/bin/python")
    for i in (1, 2)), env={"A": "1"})


def test_the_winner_is_written_with_its_launcher_arguments(tmp_path):
    ring = winner_files(INV, Candidate("ring", connections=2, ip_index=1), "out.json")
    assert json.loads(ring["out.json"])["hosts"][1]["ips"] == ["10.8.0.2"]
    assert json.loads(ring["out.json"])["envs"] == ["A=1"]
    assert ring["out.json.args"] == "--connections-per-ip 2\n"
    mpi = winner_files(INV, Candidate("mpi", tcp_links=8), "out.txt")
    assert mpi["out.txt"] == "10.9.0.1 slots=1\n10.9.0.2 slots=1\n"
    args = mpi["out.txt.args"].split()
    assert args[args.index("btl_tcp_links") + 1] == "8" and "A=1" in args


def test_tunes_duration_flags_keep_their_bounds():
    # Durations are parsed by params.Duration (tests/test_duration.py); tune's flags bound them.
    assert Duration(1, 24 * 3600).convert("5m", None, None) == 300
    with pytest.raises(click.BadParameter, match="above the maximum"):
        Duration(1, 60).convert("2m", None, None)
    with pytest.raises(click.BadParameter, match="below the minimum"):
        Duration(1, 60).convert("0.5s", None, None)


def test_the_table_marks_the_winner_and_the_ties_and_names_failures():
    from mlxcluster.cli.tune import render

    cluster = FakeCluster({"ring x1/ip": [1.0] * 9, "ring x2/ip": [1.01] * 9,
                           "ring x4/ip": [0.5] * 9}, fail="ring x4/ip")
    result = run_tune(HOSTS, ("ring",), Plan((M32,), budget_s=1e6, max_rounds=3, tcp_seconds=1),
                      cluster.run, cluster.stream, clock=cluster.clock)
    text = render(result)
    assert "all_sum 32M:" in text and "all_gather 32M:" in text
    lines = text.splitlines()
    assert any(line.startswith("* ring x1/ip") and "200%" in line for line in lines)  # 1.0 / 0.5 GB/s
    assert any(line.startswith("= ring x2/ip") for line in lines)
    assert any(line.startswith("✗ ring x4/ip") and "hung" in line for line in lines)
    assert ("decision (all_sum 32M): tie within noise: ring x1/ip = ring x2/ip "
            "(best median: ring x2/ip); chose ring x1/ip: the simplest") in text
