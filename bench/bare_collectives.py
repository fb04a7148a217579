"""A bare MLX timing loop: the baseline `mlxcluster smoke --bench` is compared with.

Same ops, sizes, buffers and loop as the smoke worker's benchmark (5 warm-up,
20 timed, mx.eval inside the timed loop), with nothing else: no heartbeat
thread, no checks, no per-step events. It is staged as the run's script by
bench/collectives.py and reports its timings at the end, in the smoke
protocol, so the same driver collects both.
"""

import argparse
import json
import sys
import time

import mlx.core as mx

p = argparse.ArgumentParser()
p.add_argument("--backend", required=True)
p.add_argument("--expect", type=int, required=True)
p.add_argument("--sizes", required=True)
p.add_argument("--dtypes", default="float32")
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--iters", type=int, default=20)
args, _ = p.parse_known_args()

group = mx.distributed.init(strict=True, backend=args.backend)
rank, n = group.rank(), group.size()
assert n == args.expect, f"group size {n} != {args.expect}"
dt = getattr(mx, args.dtypes.split(",")[0])
lo, hi = (int(v) for v in args.sizes.split(":"))
sizes = []
size = 1 << max(lo - 1, 0).bit_length()
while size <= hi:
    sizes.append(size)
    size *= 2



def make_step(op, x):
    """The timed call: one op on ``x``, evaluated (each in its own eval for send/recv)."""
    dst, src = (rank + 1) % n, (rank - 1) % n
    if op == "all_sum":
        return lambda: mx.eval(mx.distributed.all_sum(x, group=group))
    if op == "all_gather":
        return lambda: mx.eval(mx.distributed.all_gather(x, group=group))

    def exchange():
        if rank % 2 == 0:
            mx.eval(mx.distributed.send(x, dst, group=group))
            mx.eval(mx.distributed.recv(x.shape, x.dtype, src, group=group))
        else:
            mx.eval(mx.distributed.recv(x.shape, x.dtype, src, group=group))
            mx.eval(mx.distributed.send(x, dst, group=group))

    return exchange


results = []
for op in ("all_sum", "all_gather", "send_recv"):
    for nbytes in sizes:
        count = max(nbytes // dt.size // (n if op == "all_gather" else 1), 1)
        x = mx.ones((count,), dtype=dt)
        moved = count * dt.size * (n if op == "all_gather" else 1)
        step = make_step(op, x)
        for _ in range(args.warmup):
            step()
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        results.append((op, moved, times))

out = [{"event": "ready", "rank": rank, "size": n, "backend": args.backend}]
out += [{"event": "bench", "rank": rank, "op": op, "dtype": args.dtypes.split(",")[0],
         "bytes": moved, "times": times} for op, moved, times in results]
mx.eval(mx.distributed.all_sum(mx.array([1.0]), group=group))
out.append({"event": "done", "rank": rank, "ok": True})
for event in out:
    sys.stdout.write("MLXSMOKE " + json.dumps(event) + "\n")
    sys.stdout.flush()
