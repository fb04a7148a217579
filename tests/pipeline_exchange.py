"""Two ranks sending each other 64 MiB at once through collectives.Exchange, then each
checking what it received: run under mlx.launch by tests/test_pipeline.py. One
stream for the sends and the receives hangs here (each send waits for a reader that
is itself sending); the Exchange's two streams must not."""

from __future__ import annotations

import sys

import mlx.core as mx

from reference_train.collectives import Exchange
from reference_train.launch_env import init_group


def main() -> int:
    group = init_group()
    rank, peer = group.rank(), 1 - group.rank()
    mine = mx.full((16, 1024, 1024), float(rank + 1))  # 64 MiB: beyond the sockets' buffers
    link = Exchange(group)
    link.send(mine, peer)
    got = link.wait_for(link.receive(mine.shape, mine.dtype, peer))
    assert mx.all(got == peer + 1).item()
    print(f"rank {rank} received {got.nbytes >> 20} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
