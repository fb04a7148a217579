"""The smoke worker: one process per host, started by ``mlx.launch`` or ``mpirun``.

It runs under each host's own python, where mlxcluster may not be installed,
so it imports only mlx, numpy and the standard library.  The driver
(``mlxcluster.smoke.run``) starts it under the jobs layer's rank wrapper
(copied beside it, see ``mlxcluster.smoke.launch``), which registers its pid
and its SIGUSR1 stack dump and ends a failed rank at once::

    python -X mlxcluster_run=mlxsmoke-1a2b3c4d -m mlxcluster.jobs.rank_wrapper \\
        /tmp/mlxsmoke-1a2b3c4d/worker.py --backend ring --expect 3 --run-id mlxsmoke-1a2b3c4d \\
        --dtypes float32,int32 --sizes 1024:16777216 [--bench] [--stderr-dir /tmp]
        [--soak SECONDS --seed N]

Protocol: every line it writes to stdout starting with ``MLXSMOKE `` is one
JSON object (one ``write`` per line, so ranks sharing a pipe never split a
line).  Example lines::

    MLXSMOKE {"event": "start", "rank": 1, "host": "mac2", "pid": 4242}
    MLXSMOKE {"event": "ready", "rank": 1, "size": 3, "backend": "ring"}
    MLXSMOKE {"event": "phase", "rank": 1, "phase": "correctness"}
    MLXSMOKE {"event": "heartbeat", "rank": 1, "phase": "correctness", "step": "all_sum float32 1"}
    MLXSMOKE {"event": "check", "rank": 1, "op": "all_sum", "dtype": "float32", "size": 1,
              "bytes": 4, "ok": false, "bad_index": 0, "got": 5.0, "expected": 6.0}
    MLXSMOKE {"event": "bench", "rank": 1, "op": "all_sum", "dtype": "float32", "bytes": 1024,
              "times": [0.00011, ...]}
    MLXSMOKE {"event": "soak", "rank": 1, "elapsed": 12.0, "ops": {"all_sum":
              {"iterations": 840, "slowest_bytes": 5120, "slowest_s": 0.031}, ...}}
    MLXSMOKE {"event": "error", "rank": 1, "message": "...", "traceback": "..."}
    MLXSMOKE {"event": "done", "rank": 1, "ok": true}

Exit code: 0 when every check of this rank passed, 1 when one failed, 2 when
the group could not start or has the wrong size, 3 from the test hook.

Test hooks (environment, read by every rank):
  MLXCLUSTER_SMOKE_FAIL_RANK=R     rank R exits with code 3 right after init
  MLXCLUSTER_SMOKE_HANG_RANK=R     rank R sleeps instead of running the checks
  MLXCLUSTER_SMOKE_CORRUPT_RANK=R  rank R sees one wrong element in every result
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence

import mlx.core as mx
import numpy as np

PREFIX = "MLXSMOKE "
DTYPES = {
    "float32": mx.float32,
    "float16": mx.float16,
    "bfloat16": mx.bfloat16,
    "int32": mx.int32,
}
OPS = ("all_sum", "all_gather", "send_recv")
WARMUP = 5
ITERS = 20
HEARTBEAT_S = 1.0
EXIT_CHECK_FAILED = 1
EXIT_SETUP = 2
EXIT_HOOK = 3

_write_lock = threading.Lock()


def emit(event: str, **fields) -> None:
    """Write one protocol line to stdout in a single write, then flush."""
    line = PREFIX + json.dumps({"event": event, **fields}) + "\n"
    with _write_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def rank_from_env() -> int:
    """The rank the launcher assigned, known before init (for file names, events)."""
    for key in ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return -1


def hook_rank(name: str) -> int | None:
    """The rank a test hook targets, or None when the hook is not set."""
    value = os.environ.get(name, "")
    return int(value) if value.lstrip("-").isdigit() else None


class Collectives:
    """The four MLX operations the checks use, bound to one group.

    Tests subclass it to inject a wrong element; the worker uses it as is.
    """

    def __init__(self, group):
        self.group = group
        self.rank = group.rank()
        self.size = group.size()

    def all_sum(self, x: mx.array) -> mx.array:
        y = mx.distributed.all_sum(x, group=self.group)
        mx.eval(y)
        return y

    def all_gather(self, x: mx.array) -> mx.array:
        y = mx.distributed.all_gather(x, group=self.group)
        mx.eval(y)
        return y

    def send(self, x: mx.array, dst: int) -> None:
        mx.eval(mx.distributed.send(x, dst, group=self.group))

    def recv(self, shape: tuple[int, ...], dtype, src: int) -> mx.array:
        y = mx.distributed.recv(shape, dtype, src, group=self.group)
        mx.eval(y)
        return y


class Corrupting(Collectives):
    """Collectives whose results carry one wrong element (test hook)."""

    def __init__(self, group, index: int = 0):
        super().__init__(group)
        self.index = index

    def _corrupt(self, y: mx.array) -> mx.array:
        flat = np.array(y.astype(mx.float32)).reshape(-1)
        flat[min(self.index, flat.size - 1)] += 1
        return mx.array(flat).astype(y.dtype).reshape(y.shape)

    def all_sum(self, x):
        return self._corrupt(super().all_sum(x))

    def all_gather(self, x):
        return self._corrupt(super().all_gather(x))

    def recv(self, shape, dtype, src):
        return self._corrupt(super().recv(shape, dtype, src))


def tagged(rank: int, n: int, count: int) -> np.ndarray:
    """Rank ``rank``'s payload: its tag (rank+1) plus a short pattern so that a
    shifted or reordered buffer is caught.  Every value is a small integer,
    exact in float16 and bfloat16 for groups of up to 63 ranks."""
    return (rank + 1 + (n + 1) * (np.arange(count) % 4)).astype(np.float32)


def first_mismatch(got: np.ndarray, expected: np.ndarray) -> int | None:
    """Index of the first element of ``got`` that differs from ``expected``
    (or the first missing one when the lengths differ); None when equal."""
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    expected = np.asarray(expected, dtype=np.float64).reshape(-1)
    common = min(got.size, expected.size)
    bad = np.flatnonzero(got[:common] != expected[:common])
    if bad.size:
        return int(bad[0])
    if got.size != expected.size:
        return common
    return None


def verdict(op: str, dtype: str, count: int, itemsize: int, rank: int,
            got: np.ndarray, expected: np.ndarray, peer: int | None = None) -> dict:
    """The check event fields for one result: ok, and on failure the first bad
    index with the value found and the value expected there."""
    bad = first_mismatch(got, expected)
    fields = {"rank": rank, "op": op, "dtype": dtype, "size": count,
              "bytes": count * itemsize, "ok": bad is None}
    if peer is not None:
        fields["peer"] = peer
    if bad is not None:
        flat_got = np.asarray(got, dtype=np.float64).reshape(-1)
        flat_exp = np.asarray(expected, dtype=np.float64).reshape(-1)
        fields.update(
            bad_index=bad,
            got=float(flat_got[bad]) if bad < flat_got.size else None,
            expected=float(flat_exp[bad]) if bad < flat_exp.size else None,
        )
    return fields


def to_numpy(y: mx.array) -> np.ndarray:
    # numpy has no bfloat16; every test value is exact in float32.
    return np.array(y.astype(mx.float32))


def check_all_sum(c: Collectives, dtype: str, count: int) -> dict:
    """all_sum of buffers filled with rank+1 must be n(n+1)/2 everywhere."""
    n = c.size
    x = mx.full((count,), c.rank + 1, dtype=DTYPES[dtype])
    got = to_numpy(c.all_sum(x))
    expected = np.full(count, n * (n + 1) / 2)
    return verdict("all_sum", dtype, count, x.itemsize, c.rank, got, expected)


def check_all_gather(c: Collectives, dtype: str, count: int) -> dict:
    """all_gather of rank-tagged rows must hold every rank's row, in rank order."""
    n = c.size
    x = mx.array(tagged(c.rank, n, count)).astype(DTYPES[dtype])
    got = to_numpy(c.all_gather(x))
    expected = np.concatenate([tagged(r, n, count) for r in range(n)])
    return verdict("all_gather", dtype, count, x.itemsize, c.rank, got, expected)


def exchange(c: Collectives, x: mx.array, dst: int, src: int) -> mx.array:
    """Send ``x`` to ``dst`` and receive a like array from ``src``.

    Even ranks send first and odd ranks receive first, each in its own eval:
    a rank that sends and receives in one eval deadlocks when every rank does
    it.  Rank 1 always receives first, so the chain of waits always ends.
    """
    if c.rank % 2 == 0:
        c.send(x, dst)
        return c.recv(x.shape, x.dtype, src)
    y = c.recv(x.shape, x.dtype, src)
    c.send(x, dst)
    return y


def check_send_recv(c: Collectives, dtype: str, count: int) -> list[dict]:
    """Every rank exchanges with both ring neighbours, one direction at a time:
    first send to next / receive from previous, then the reverse."""
    n = c.size
    x = mx.array(tagged(c.rank, n, count)).astype(DTYPES[dtype])
    results = []
    for step in (1, -1):
        dst, src = (c.rank + step) % n, (c.rank - step) % n
        got = to_numpy(exchange(c, x, dst, src))
        results.append(verdict("send_recv", dtype, count, x.itemsize, c.rank,
                               got, tagged(src, n, count), peer=src))
    return results


def correctness_counts(n: int, lo_bytes: int, hi_bytes: int, itemsize: int) -> list[int]:
    """Element counts to check: 1, a count near ``lo_bytes`` that n does not
    divide, and one element more than ``hi_bytes`` holds (above 8 MiB when
    the sweep's top is)."""
    odd = max(lo_bytes // itemsize, 2) | 1
    while n > 1 and odd % n == 0:
        odd += 2
    big = hi_bytes // itemsize + 1
    if big % n == 0 and n > 1:
        big += 1
    return sorted({1, odd, big})


class Progress:
    """The current phase and step, reported by a heartbeat thread so the driver
    can tell a rank stuck inside a collective from one that died."""

    def __init__(self, rank: int):
        self.rank = rank
        self.phase = "init"
        self.step = ""
        self._stop = threading.Event()

    def set(self, phase: str, step: str = "") -> None:
        if phase != self.phase:
            emit("phase", rank=self.rank, phase=phase)
        self.phase, self.step = phase, step

    def beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            emit("heartbeat", rank=self.rank, phase=self.phase, step=self.step)

    def start(self) -> None:
        threading.Thread(target=self.beat, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def run_correctness(c: Collectives, dtypes: Sequence[str], lo: int, hi: int,
                    progress: Progress, report: Callable[[dict], None],
                    ops: Sequence[str] = OPS) -> bool:
    """Run the checks of ``ops``; report each verdict; True when all passed."""
    ok = True
    for dtype in dtypes:
        itemsize = DTYPES[dtype].size
        for count in correctness_counts(c.size, lo, hi, itemsize):
            for op, check in (("all_sum", check_all_sum),
                              ("all_gather", check_all_gather),
                              ("send_recv", check_send_recv)):
                if op not in ops or (op == "send_recv" and c.size < 2):
                    continue
                progress.set("correctness", f"{op} {dtype} {count}")
                results = check(c, dtype, count)
                for result in results if isinstance(results, list) else [results]:
                    report(result)
                    ok = ok and result["ok"]
    return ok



def soak_schedule(seed: int, ops: Sequence[str], dtypes: Sequence[str], lo: int, hi: int
                  ) -> Iterator[tuple[str, str, int]]:
    """The soak's endless (op, dtype, element count) sequence: the ops in
    turn (each gets its share), a random dtype and a size drawn evenly on a
    log scale between ``lo`` and ``hi`` bytes. The same seed gives the same
    sequence on every rank (they must call the same collective) and on a
    replay of a failure."""
    rng = random.Random(seed)
    lo_log, hi_log = math.log2(max(lo, 1)), math.log2(max(hi, lo, 1))
    while True:
        for op in ops:
            dtype = rng.choice(list(dtypes))
            nbytes = int(2 ** rng.uniform(lo_log, hi_log))
            yield op, dtype, max(nbytes // DTYPES[dtype].size, 1)


class SoakTally:
    """Iterations and the slowest one per op, as this rank saw them."""

    def __init__(self):
        self.ops: dict[str, dict] = {}

    def add(self, op: str, nbytes: int, seconds: float) -> None:
        entry = self.ops.setdefault(op, {"iterations": 0, "slowest_bytes": 0, "slowest_s": 0.0})
        entry["iterations"] += 1
        if seconds > entry["slowest_s"]:
            entry["slowest_bytes"], entry["slowest_s"] = nbytes, seconds


SOAK_CHECKS = {"all_sum": check_all_sum, "all_gather": check_all_gather,
               "send_recv": check_send_recv}


def keep_soaking(c: Collectives, go_on: bool) -> bool:
    """Whether every rank goes on: rank 0's clock decides, told to all in a
    one-element all_sum (outside any test hook), so no rank leaves the loop
    while its peers enter one more collective."""
    flag = mx.array([1.0 if (c.rank == 0 and go_on) else 0.0])
    total = mx.distributed.all_sum(flag, group=c.group)
    mx.eval(total)
    return total.item() > 0


def run_soak(c: Collectives, args: argparse.Namespace, progress: Progress,
             report: Callable[[dict], None], clock: Callable[[], float] = time.monotonic,
             go_on: Callable[[Collectives, bool], bool] = keep_soaking) -> bool:
    """Repeat the checks at the schedule's sizes for ``args.soak`` seconds;
    a soak event at most every heartbeat (and a last one), a check event for
    every wrong result. True when every result was right. Stops at the first
    wrong result (the driver stops the run then anyway)."""
    ops = [op for op in args.ops if op in SOAK_CHECKS and not (op == "send_recv" and c.size < 2)]
    tally, started = SoakTally(), clock()
    last_emit, ok = started, True
    schedule = soak_schedule(args.seed, ops, args.dtypes, args.lo, args.hi)
    while ok and go_on(c, clock() - started < args.soak):
        op, dtype, count = next(schedule)
        progress.set("soak", f"{op} {dtype} {count}")
        t0 = clock()
        results = SOAK_CHECKS[op](c, dtype, count)
        seconds = clock() - t0
        for result in results if isinstance(results, list) else [results]:
            if not result["ok"]:
                report(result)
                ok = False
        tally.add(op, count * DTYPES[dtype].size, seconds)
        if clock() - last_emit >= HEARTBEAT_S:
            emit("soak", rank=c.rank, elapsed=clock() - started, ops=tally.ops)
            last_emit = clock()
    emit("soak", rank=c.rank, elapsed=clock() - started, ops=tally.ops)
    return ok


def sweep_sizes(lo: int, hi: int) -> list[int]:
    """Powers of two from ``lo`` up to ``hi`` bytes (both rounded to powers of two)."""
    size = 1 << max(lo - 1, 0).bit_length()
    out = []
    while size <= hi:
        out.append(size)
        size *= 2
    return out or [1 << max(hi, 1).bit_length() - 1]


def time_op(fn: Callable[[], None], warmup: int, iters: int) -> list[float]:
    """Wall time of each of ``iters`` calls after ``warmup`` untimed ones.

    ``fn`` evaluates its result (mx.eval) itself, so each time covers the
    whole transfer."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def bench_op(c: Collectives, op: str, dtype: str, nbytes: int) -> tuple[Callable[[], None], int]:
    """The timed call for ``op`` at ``nbytes`` and the bytes it really moves
    (nccl-tests sizes: all_sum the buffer, all_gather the gathered total,
    send_recv one message)."""
    dt = DTYPES[dtype]
    n = c.size
    if op == "all_sum":
        count = max(nbytes // dt.size, 1)
        x = mx.ones((count,), dtype=dt)
        return (lambda: c.all_sum(x)), count * dt.size
    if op == "all_gather":
        count = max(nbytes // dt.size // n, 1)
        x = mx.ones((count,), dtype=dt)
        return (lambda: c.all_gather(x)), count * n * dt.size
    count = max(nbytes // dt.size, 1)
    x = mx.ones((count,), dtype=dt)
    dst, src = (c.rank + 1) % n, (c.rank - 1) % n
    return (lambda: exchange(c, x, dst, src)), count * dt.size


def run_bench(c: Collectives, dtype: str, lo: int, hi: int, warmup: int, iters: int,
              progress: Progress, ops: Sequence[str] = OPS) -> None:
    """Time each op of ``ops`` at every power-of-two size; one bench event per op and size."""
    for op in OPS:
        if op not in ops or (op == "send_recv" and c.size < 2):
            continue
        for nbytes in sweep_sizes(lo, hi):
            progress.set("bench", f"{op} {dtype} {nbytes}")
            fn, moved = bench_op(c, op, dtype, nbytes)
            times = time_op(fn, warmup, iters)
            emit("bench", rank=c.rank, op=op, dtype=dtype, bytes=moved, times=times)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="mlxcluster smoke worker (one per host)")
    p.add_argument("--backend", required=True)
    p.add_argument("--expect", type=int, required=True, help="expected group size")
    p.add_argument("--run-id", required=True, help="unique marker of this run")
    p.add_argument("--dtypes", default="float32,float16,bfloat16,int32")
    p.add_argument("--sizes", default="1024:16777216", help="LO:HI in bytes")
    p.add_argument("--ops", default=",".join(OPS), help="collectives to check and time")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--no-check", action="store_true", help="skip the correctness phase")
    p.add_argument("--warmup", type=int, default=WARMUP)
    p.add_argument("--iters", type=int, default=ITERS)
    p.add_argument("--stderr-dir", help="redirect stderr to DIR/<run-id>.rank<R>.err")
    p.add_argument("--soak", type=float, default=0.0,
                   help="seconds of checks at random sizes instead of the fixed ones")
    p.add_argument("--seed", type=int, default=0, help="the soak's sizes (same on every rank)")
    args = p.parse_args(argv)
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = [d for d in args.dtypes if d not in DTYPES]
    if unknown:
        p.error(f"unknown dtype(s) {unknown}; known: {sorted(DTYPES)}")
    args.ops = [o for o in args.ops.split(",") if o]
    if not args.ops or any(o not in OPS for o in args.ops):
        p.error(f"--ops {','.join(args.ops)!r}: choose among {', '.join(OPS)}")
    lo, _, hi = args.sizes.partition(":")
    args.lo, args.hi = int(lo), int(hi or lo)
    return args


def redirect_stderr(directory: str, run_id: str, rank: int) -> None:
    """Send this process's fd 2 (Python and native code alike) to a per-rank
    file the driver reads when this rank fails."""
    path = os.path.join(directory, f"{run_id}.rank{rank}.err")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env_rank = rank_from_env()
    if args.stderr_dir:
        redirect_stderr(args.stderr_dir, args.run_id, env_rank)
    emit("start", rank=env_rank, host=socket.gethostname(), pid=os.getpid())
    progress = Progress(env_rank)
    progress.start()
    try:
        return run_rank(args, env_rank, progress)
    finally:
        progress.stop()


def run_rank(args: argparse.Namespace, env_rank: int, progress: Progress) -> int:
    """Init the group, check its size, run the phases; this rank's exit code."""
    try:
        group = mx.distributed.init(strict=True, backend=args.backend)
    except Exception as err:  # noqa: BLE001 - any init failure is this rank's verdict
        emit("error", rank=env_rank, message=f"init({args.backend}) failed: {err}")
        print(f"init({args.backend}) failed: {err}", file=sys.stderr, flush=True)
        return EXIT_SETUP
    rank, size = group.rank(), group.size()
    progress.rank = rank
    if size != args.expect:
        # MLX silently returns a group of 1 when a backend cannot start.
        message = f"group size is {size}, expected {args.expect} (backend {args.backend})"
        emit("error", rank=rank, message=message)
        print(message, file=sys.stderr, flush=True)
        return EXIT_SETUP
    emit("ready", rank=rank, size=size, backend=args.backend)

    if hook_rank("MLXCLUSTER_SMOKE_FAIL_RANK") == rank:
        print(f"test hook: rank {rank} fails on purpose", file=sys.stderr, flush=True)
        return EXIT_HOOK
    if hook_rank("MLXCLUSTER_SMOKE_HANG_RANK") == rank:
        # Stuck before the first collective, as a rank blocked in a peer's
        # wait would be: its peers move on into all_sum and wait for it.
        while True:
            time.sleep(60)
    corrupt = hook_rank("MLXCLUSTER_SMOKE_CORRUPT_RANK") == rank
    c = Corrupting(group) if corrupt else Collectives(group)

    ok = True
    if args.soak > 0:
        ok = run_soak(c, args, progress, lambda fields: emit("check", **fields))
    elif not args.no_check:
        ok = run_correctness(c, args.dtypes, args.lo, args.hi, progress,
                             lambda fields: emit("check", **fields), args.ops)
    if args.bench:
        run_bench(c, args.dtypes[0], args.lo, args.hi, args.warmup, args.iters, progress,
                  args.ops)
    # A last barrier: no rank exits (closing its sockets) while a peer still reads.
    mx.eval(mx.distributed.all_sum(mx.array([1.0]), group=group))
    progress.set("done")
    emit("done", rank=rank, ok=ok)
    return 0 if ok else EXIT_CHECK_FAILED


def run() -> int:
    """main() with any crash reported as an error event and on stderr."""
    try:
        return main()
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 - report, then fail loudly
        tb = traceback.format_exc()
        emit("error", rank=rank_from_env(), message=f"{type(err).__name__}: {err}",
             traceback=tb[-2000:])
        sys.stderr.write(tb)
        sys.stderr.flush()
        return EXIT_SETUP


if __name__ == "__main__":
    code = run()
    emit("exit", rank=rank_from_env(), code=code)
    sys.stderr.flush()
    # 0: a normal exit lets MPI finalize (mpirun treats anything else as an
    # abort). Any other code: the rank wrapper writes its exit line and ends
    # the process at once, skipping MLX's distributed teardown, which can
    # block when a peer is gone.
    sys.exit(code)
