"""Two ranks sending each other 64 MiB at once through collectives.Exchange, then each
checking what it received: run under mlx.launch by tests/test_pipeline.py. One
stream for the sends and the receives hangs here (each send waits for a reader that
is itself sending); the Exchange's two streams must not.

Then a send starts at once: rank 0 sends, and evaluates nothing for PAUSE seconds;
rank 1 says when it had it, rank 0 when its pause ended. A send started only at the
sender's next evaluation arrives after the pause (a pipeline stage's gradient then
waited for the weights' gradients computed before it)."""

from __future__ import annotations

import sys
import time

import mlx.core as mx

from reference_train.collectives import Exchange
from reference_train.launch_env import init_group

PAUSE = 5.0  # long beside any scheduling delay under a loaded suite


def main() -> int:
    group = init_group()
    rank, peer = group.rank(), 1 - group.rank()
    mine = mx.full((16, 1024, 1024), float(rank + 1))  # 64 MiB: beyond the sockets' buffers
    link = Exchange(group)
    link.send(mine, peer)
    got = link.wait_for(link.receive(mine.shape, mine.dtype, peer))
    assert mx.all(got == peer + 1).item()
    print(f"rank {rank} received {got.nbytes >> 20} MiB", flush=True)
    if rank == 0:
        link.send(mx.array([7.0]), 1)
        time.sleep(PAUSE)  # nothing evaluated: the send goes, or not, on its own
        print(f"rank 0 paused until {time.time():.3f}", flush=True)
        link.evaluate()
    else:
        got = link.wait_for(link.receive((1,), mx.float32, 0))
        assert got.item() == 7.0
        print(f"rank 1 received the small send at {time.time():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
