"""A rank that fails alone (`python -m tests.rank_exit CODE`): rank 1 exits CODE, the
others 0, as a trainer rank that dies while the rest end well. For train_support's
reading of mlx.launch's exit (which is 0 either way)."""

import sys

import mlx.core as mx

if __name__ == "__main__":
    group = mx.distributed.init()
    sys.exit(int(sys.argv[1]) if group.rank() == 1 else 0)
