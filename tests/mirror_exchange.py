"""Two (or more) ranks, each with a folder of its own standing for its host's disk,
writing a stage checkpoint per step and mirroring it on the next rank's folder
through mirror.mirror_checkpoint (real send and receive over ring): run under
mlx.launch by tests/test_resplit.py, which then compares the files byte for byte.
Local ranks share one --out, so the trainer itself never mirrors here; this
forces what mirror.mirrored_stages decides for hosts with their own disks.

    python -m tests.mirror_exchange BASE STEPS...   rank r writes BASE/rank_r/checkpoints

With MIRROR_NO_ROOM_RANK=R, rank R's disk reads as full (its free bytes 0: a
stand-in for a full disk, for the logic's sake) and the problems each rank's
mirror returns are printed, not asserted away.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim

from reference_train import mirror
from reference_train.checkpoint import save_checkpoint
from reference_train.launch_env import init_group
from reference_train.pipeline_outputs import stage_folder

CHUNK = 100  # bytes per send: every file goes in several chunks, the last a short one


def main(argv: list[str]) -> int:
    group = init_group()
    rank, size = group.rank(), group.size()
    base, steps = Path(argv[0]), [int(s) for s in argv[1:]]
    mirror.CHUNK_BYTES = CHUNK
    full = os.environ.get("MIRROR_NO_ROOM_RANK")
    if full is not None and int(full) == rank:
        mirror.free_bytes = lambda folder: 0
    mx.random.seed(rank)  # each stage's own weights, of another size on each rank
    model = nn.Linear(8 + 4 * rank, 16)
    optimizer = optim.AdamW(learning_rate=1e-3)
    optimizer.init(model.trainable_parameters())
    root = base / f"rank_{rank}" / "checkpoints" / stage_folder(rank, size)
    for step in steps:
        model.update({"bias": model.bias + step})
        state = {"pipeline": {"stages": size, "stage": rank, "blocks": [rank, rank + 1]}}
        saved = save_checkpoint(root, step, model, optimizer, state, keep=2)
        problem = mirror.mirror_checkpoint(group, saved, rank, [True] * size, keep=2)
        if problem is not None:
            print(f"rank {rank} step {step}: {problem}", flush=True)
        assert problem is None or full is not None, problem
    print(f"rank {rank} mirrored steps {steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
