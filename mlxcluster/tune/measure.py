"""Measure candidates: the smoke benchmark (all_sum, all_gather) under each
setting, and the raw TCP stream of the same link with as many streams, in
alternating rounds within a time budget.

The boundaries (one smoke run, one TCP stream, the clock) are injected, so
the round logic is tested without a network.
"""

from __future__ import annotations

import select
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlxcluster.jobs.hosts import RankHost, host_argv, run_script
from mlxcluster.smoke.launch import WorkerOptions
from mlxcluster.smoke.run import SmokeReport, run_backend
from mlxcluster.tune.candidates import Candidate
from mlxcluster.tune.select import Sample
from mlxcluster.tune.tcp_stream import parse_received

OPS = ("all_sum", "all_gather")
TCP_PORT = 45321
TCP_SECONDS = 2.0
STREAM_SOURCE = Path(__file__).with_name("tcp_stream.py")


@dataclass(frozen=True)
class Plan:
    """What to measure: ``sizes`` in bytes (powers of two), ``iters`` timed
    iterations per size (after ``warmup``), at most ``max_rounds`` rounds
    and ``budget_s`` seconds (at least one round always runs)."""

    sizes: tuple[int, ...]
    budget_s: float
    iters: int = 5
    warmup: int = 1
    max_rounds: int = 5
    timeout_s: float = 120.0  # per phase of one smoke run
    tcp_seconds: float = TCP_SECONDS


@dataclass
class Measurements:
    samples: list[Sample] = field(default_factory=list)
    tcp: dict[int, list[float]] = field(default_factory=dict)  # streams -> GB/s per round
    tcp_errors: dict[int, str] = field(default_factory=dict)
    failed: dict[Candidate, str] = field(default_factory=dict)  # first failure of each
    rounds: int = 0
    round_s: list[float] = field(default_factory=list)
    stopped_by: str = ""  # why no further round ran: budget | rounds

    def tcp_gbps(self, streams: int) -> float | None:
        values = sorted(self.tcp.get(streams, []))
        return values[len(values) // 2] if values else None


RunCandidate = Callable[[Candidate, Plan], SmokeReport]
RunStream = Callable[[int, float], float]  # (streams, seconds) -> GB/s (raises on failure)


def worker_options(candidate: Candidate, plan: Plan) -> WorkerOptions:
    """The smoke benchmark at the plan's sizes: float32, all_sum and
    all_gather, no correctness pass (smoke proves that)."""
    return WorkerOptions(dtypes=("float32",), lo_bytes=min(plan.sizes), hi_bytes=max(plan.sizes),
                         bench=True, check=False, warmup=plan.warmup, iters=plan.iters, ops=OPS,
                         connections_per_ip=candidate.connections if candidate.backend == "ring" else 1)


def mpi_args(candidate: Candidate) -> tuple[str, ...]:
    """The mpirun arguments of an MPI candidate (they replace the generated ones)."""
    if candidate.backend != "mpi":
        return ()
    return ("--mca", "btl_tcp_links", str(candidate.tcp_links), *candidate.allreduce_args())


def smoke_runner(hosts: tuple[RankHost, ...]) -> RunCandidate:
    """Run one candidate through smoke's launcher, watchdog and cleanup."""
    def run(candidate: Candidate, plan: Plan) -> SmokeReport:
        return run_backend(candidate.backend, candidate.hosts(hosts),
                           worker_options(candidate, plan), plan.timeout_s,
                           mpi_args=mpi_args(candidate))
    return run


def stream_runner(sender: RankHost, receiver: RankHost, port: int = TCP_PORT) -> RunStream:
    """A raw TCP stream from ``sender`` to ``receiver``'s first data IP."""
    def run(streams: int, seconds: float) -> float:
        return tcp_stream(sender, receiver, streams, seconds, port)
    return run


class StreamError(RuntimeError):
    pass


def tcp_stream(sender: RankHost, receiver: RankHost, streams: int, seconds: float,
               port: int = TCP_PORT) -> float:
    """GB/s of ``streams`` parallel TCP streams for ``seconds`` (the data IPs
    the collectives use); raises StreamError naming the host that failed."""
    source = STREAM_SOURCE.read_text()
    recv_cmd = f"{shlex.quote(receiver.python)} - recv {port} {streams}"
    argv = host_argv(receiver, recv_cmd)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write(source)
        proc.stdin.close()
        proc.stdin = None  # communicate() below must not flush it again
        if first_line(proc, 20.0) != "LISTENING":
            raise StreamError(f"tcp receiver on {receiver.name} did not start: "
                              f"{proc.stderr.read()[-300:] if proc.poll() is not None else 'no answer'}")
        sent = run_script(sender, f"{shlex.quote(sender.python)} - send "
                                          f"{shlex.quote(receiver.ips[0])} {port} {streams} {seconds}",
                                 stdin=source, timeout=seconds + 30)
        if not sent.ok:
            raise StreamError(f"tcp sender on {sender.name} failed: {sent.error}")
        out, _ = proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        raise StreamError(f"tcp receiver on {receiver.name} did not finish") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    try:
        total, elapsed = parse_received(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise StreamError(f"tcp receiver on {receiver.name} said {out.strip()[-200:]!r}") from None
    if elapsed <= 0:
        raise StreamError(f"tcp stream to {receiver.name} received nothing")
    return total / elapsed / 1e9


def first_line(proc: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline().strip() if ready else ""


def samples_of(candidate: Candidate, round_no: int, report: SmokeReport,
               sizes: tuple[int, ...]) -> list[Sample]:
    """The benchmark rows of one passed run at the plan's sizes. all_gather
    reports the gathered total, the size rounded down to a multiple of the
    ranks' elements (3 ranks at 1 MiB: 1048572 bytes): it counts as the size
    it was asked for."""
    out = []
    for b in report.bench:
        nominal = next((s for s in sizes if 0 <= s - b.bytes < 8 * max(b.ranks, 1)), None)
        if nominal is not None and b.op in OPS:
            out.append(Sample(candidate, round_no, b.op, nominal, b.busbw_gbps, b.p50_s, b.p90_s))
    return out


def round_order(candidates: list[Candidate], round_no: int) -> list[Candidate]:
    """Alternate: forward in even rounds, backward in odd ones, so no
    candidate always runs first (cold caches) or last (a drifting load)."""
    return list(candidates) if round_no % 2 == 0 else list(reversed(candidates))


def measure(candidates: list[Candidate], plan: Plan, run_candidate: RunCandidate,
            run_stream: RunStream | None, n_ips: int = 1,
            clock: Callable[[], float] = time.monotonic,
            on_progress: Callable[[str], None] | None = None) -> Measurements:
    """Rounds of every candidate (alternating order) and one raw TCP stream
    per distinct stream count, until ``max_rounds`` or until the next round
    would overrun ``budget_s`` (judged by the longest round so far). A
    candidate that fails once is not run again."""
    out = Measurements()
    started = clock()
    streams = sorted({c.streams(n_ips) for c in candidates})
    say = on_progress or (lambda _text: None)
    while True:
        if out.rounds >= plan.max_rounds:
            out.stopped_by = "rounds"
            break
        if out.rounds >= 1:
            left = plan.budget_s - (clock() - started)
            if max(out.round_s) > left:
                out.stopped_by = "budget"
                break
        round_started = clock()
        for candidate in round_order([c for c in candidates if c not in out.failed], out.rounds):
            report = run_candidate(candidate, plan)
            say(f"round {out.rounds + 1}: {candidate.label}: {report.status} "
                f"({report.duration_s:.1f} s)")
            if report.passed:
                out.samples += samples_of(candidate, out.rounds, report, plan.sizes)
            else:
                out.failed[candidate] = f"{report.status}: {report.reason}"
        if run_stream is not None:
            for n in round_order(streams, out.rounds):
                if n in out.tcp_errors:
                    continue
                say(f"round {out.rounds + 1}: raw TCP x{n}")
                try:
                    out.tcp.setdefault(n, []).append(run_stream(n, plan.tcp_seconds))
                except StreamError as err:
                    out.tcp_errors[n] = str(err)
        out.round_s.append(clock() - round_started)
        out.rounds += 1
        if not [c for c in candidates if c not in out.failed]:
            out.stopped_by = "every candidate failed"
            break
    return out
