"""What the trainer's heartbeat line costs per training step (goal: < 1%).

    python bench/heartbeat_cost.py                 # demo config, ~1 minute on 2 cores
    python bench/heartbeat_cost.py --rounds 9 --steps 5

Under `mlxcluster train` every rank prints `@@mlxcluster-heartbeat RANK STEP`
(flushed) after each step, into a pipe the launcher reads. This measures, in
one process with the OpenBLAS preload when the system has it (as `mlxcluster
train` sets it) and stdout and stderr (where the heartbeat goes) pipes drained by a
thread (as under a launcher):

1. the heartbeat call alone (`Trainer.beat()`, 20,000 calls): microseconds
   per call;
2. the `demo` config's training step with the heartbeat off and on, in
   alternating chunks of `--steps` steps for `--rounds` rounds (same load for
   both on a shared machine); medians of the per-step times.

The cost is (1) / the median step time; (2) shows that the difference is lost
in the step's own noise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlxcluster.facts.blas import find_openblas, with_openblas  # noqa: E402

REEXEC = "MLXCLUSTER_BENCH_REEXEC"


def drained_stdout():
    """Point fds 1 and 2 at a pipe that a thread empties; returns a file for our own output."""
    ours = os.fdopen(os.dup(1), "w", buffering=1)
    read, write = os.pipe()
    os.dup2(write, 1)
    os.dup2(write, 2)
    os.close(write)

    def drain():
        while os.read(read, 65536):
            pass

    threading.Thread(target=drain, daemon=True).start()
    return ours


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="demo")
    parser.add_argument("--steps", type=int, default=5, help="steps per chunk")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()

    openblas = find_openblas()
    if openblas and not os.environ.get(REEXEC):  # LD_PRELOAD acts at start-up only
        env = with_openblas({**os.environ, REEXEC: "1", "OPENBLAS_NUM_THREADS": "1"}, openblas)
        os.execve(sys.executable, [sys.executable, *sys.argv], env)

    import mlx.core as mx

    from reference_train.callbacks import Heartbeats, TrainingCallback
    from reference_train.config import build_config
    from reference_train.prepare import prepare_offline
    from reference_train.train import Trainer

    out = drained_stdout()
    with tempfile.TemporaryDirectory(prefix="heartbeat-bench.") as tmp:
        data = Path(tmp) / "data"
        prepare_offline(data, n_stories=600)
        cfg = build_config(["--config", args.config, "--data", str(data), "--out", str(Path(tmp) / "out"),
                            "--steps", "100000", "--progress", "false"])
        trainer = Trainer(cfg, mx.distributed.init(), log=lambda _m: None)
        for _ in range(args.warmup):
            trainer.train_step()

        # the callbacks the training loop tells after each step: heartbeats, or none
        told = {True: Heartbeats(0), False: TrainingCallback()}
        start = time.perf_counter()
        for _ in range(args.calls):
            told[True].on_step(trainer.step)
        beat_us = (time.perf_counter() - start) / args.calls * 1e6

        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for on in (False, True):
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    trainer.train_step()
                    told[on].on_step(trainer.step)
                    times[on].append(time.perf_counter() - t0)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    out.write(f"config {args.config}, 1 process, OpenBLAS preload: {openblas or 'none'}\n")
    out.write(f"heartbeat call: {beat_us:.1f} us (mean of {args.calls} calls into a drained pipe)\n")
    out.write(f"step: {off * 1e3:.1f} ms without, {on * 1e3:.1f} ms with heartbeat "
              f"(medians of {len(times[False])} steps each, alternating chunks of {args.steps})\n")
    out.write(f"heartbeat cost per step: {beat_us / (off * 1e6) * 100:.4f}% of the step "
              f"(A/B difference of medians: {(on - off) / off * 100:+.2f}%, step noise)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
