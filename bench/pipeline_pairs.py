"""`--pipeline 2` against data-parallel 2, both in the same two ranks, in turns: the
ratio of their steps with the machine's drift taken out.

    python bench/pipeline_pairs.py                        # the demo model, M=8: ~1 minute
    python bench/pipeline_pairs.py --size wide --rounds 20
    python bench/pipeline_pairs.py --quick                # the tiny model: a smoke run

bench/pipeline.py runs the real trainer, each case in a launch of its own; on this
shared 2-core machine one case's rounds spread by up to 25%
(docs/performance-runs.md 1e), more than most changes to the step. Here two local
ranks (ring, started as mlxcluster starts ranks that all run here) each build two
reference_train.train.Trainer: data-parallel, and `--pipeline 2 --micro_batches M`
(this rank's stage: the split by bytes, 1F1B, compiled), from the same flags (bench/
pipeline.py's SPEED_MODEL or WIDE_MODEL), seed and data (the offline corpus,
prepared in a temporary folder). A step is Trainer.train_step: the step function
the training loop runs, with the run's AdamW, its schedule and gradient clipping,
on the same global batches in both.
They alternate, --steps steps of one then of the other, for --rounds rounds
(the first round untimed: compilation), each step between two barriers. The
figures: each one's median step, and the median of the per-round ratios of
data-parallel's step to the pipeline's, which is the pipeline's tokens/s as a
share of data-parallel's (the same global batch): issue 49's measure, taken in
one run and the same processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline import QUICK_MODEL, SPEED_MODEL, WIDE_MODEL, local_ranks, rank_env  # noqa: E402

REPORT_FILE = "pairs_rank0.json"  # rank 0's times, in the run's folder (not a stdout line)


def rank_main(flags: list[str], micro_batches: int, rounds: int, steps: int, tmp: str) -> int:
    """One of the two ranks: both runs' Trainers built, their steps then run in turns;
    rank 0 writes the times into `tmp`."""
    import mlx.core as mx

    from reference_train.collectives import barrier
    from reference_train.config import build_config
    from reference_train.train import Trainer

    group = mx.distributed.init(backend="ring", strict=True)
    every = ["--data", str(Path(tmp) / "data"), "--steps", str(rounds * steps + 1)]
    cases = {"data_parallel": [], "pipeline": ["--pipeline", "2",
                                               "--micro_batches", str(micro_batches)]}
    trainers = {name: Trainer(build_config([*flags, *every, *extra,
                                            "--out", str(Path(tmp) / name)]),
                              group, log=lambda *_: None)
                for name, extra in cases.items()}
    times: dict[str, list[list[float]]] = {name: [] for name in trainers}
    for r in range(rounds):
        for name, trainer in trainers.items():
            taken = []
            for _ in range(steps):
                barrier(group)
                start = time.perf_counter()
                trainer.train_step()
                barrier(group)
                taken.append(time.perf_counter() - start)
            if r > 0:  # the first round compiles both steps
                times[name].append(taken)
    if group.rank() == 0:
        (Path(tmp) / REPORT_FILE).write_text(json.dumps(times))
    return 0


def summary(times: dict[str, list[list[float]]], tokens_per_step: int) -> dict:
    """Each step's median (ms) and tokens/s, the per-round ratios of data-parallel's
    median step to the pipeline's, and their median."""
    every = {name: [t for rnd in rounds for t in rnd] for name, rounds in times.items()}
    per_round = [statistics.median(dp) / statistics.median(pp)
                 for dp, pp in zip(times["data_parallel"], times["pipeline"], strict=True)]
    return {"step_ms": {n: statistics.median(v) * 1e3 for n, v in every.items()},
            "tokens_per_s": {n: tokens_per_step / statistics.median(v) for n, v in every.items()},
            "steps_timed": {n: len(v) for n, v in every.items()},
            "round_ratios": per_round, "ratio": statistics.median(per_round)}


def main() -> int:
    if sys.argv[1:2] == ["--as-rank"]:
        flags = json.loads(sys.argv[2])
        return rank_main(flags, *(int(a) for a in sys.argv[3:6]), sys.argv[6])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=("demo", "wide"), default="demo")
    p.add_argument("--micro_batches", type=int, default=8)
    p.add_argument("--rounds", type=int, default=31, help="the first one untimed")
    p.add_argument("--steps", type=int, default=3, help="steps of each, in turn, a round")
    p.add_argument("--quick", action="store_true", help="the tiny model, 3 rounds of 1 step")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    flags = WIDE_MODEL if args.size == "wide" else SPEED_MODEL
    if args.quick:
        flags, args.micro_batches, args.rounds, args.steps = QUICK_MODEL, 2, 3, 1
    from reference_train.config import build_config
    from reference_train.prepare import prepare_offline

    cfg = build_config(flags)
    env = rank_env(0)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(f"{started}, load average {os.getloadavg()[0]:.1f}: {' '.join(flags)}, "
          f"--pipeline 2 M={args.micro_batches} against data-parallel 2, {args.rounds} rounds "
          f"of {args.steps} steps each (the first untimed)", flush=True)
    with tempfile.TemporaryDirectory(prefix="pipeline_pairs.") as tmp:
        prepare_offline(Path(tmp) / "data")
        rank_cmd = [str(Path(__file__).resolve()), "--as-rank", json.dumps(flags),
                    str(args.micro_batches), str(args.rounds), str(args.steps), tmp]
        proc = subprocess.run(local_ranks(2, rank_cmd, env), cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=1800)
        report = Path(tmp) / REPORT_FILE
        if proc.returncode != 0 or not report.exists():
            print(f"the ranks failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
                  file=sys.stderr)
            return 1
        times = json.loads(report.read_text())
    result = summary(times, cfg.global_batch * cfg.block_size)
    result.update(started=started, flags=flags, micro_batches=args.micro_batches,
                  rounds=args.rounds, steps=args.steps, load_average_end=os.getloadavg())
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(rendered(result))
    return 0


def rendered(result: dict) -> str:
    ms, tps, ratios = result["step_ms"], result["tokens_per_s"], result["round_ratios"]
    return "\n".join([
        f"  data-parallel 2   {ms['data_parallel']:7.2f} ms a step  "
        f"{tps['data_parallel']:9,.0f} tokens/s",
        f"  pipeline 2, M={result['micro_batches']:<2} {ms['pipeline']:7.2f} ms a step  "
        f"{tps['pipeline']:9,.0f} tokens/s",
        f"  pipeline / data-parallel: {result['ratio']:.3f}x (median of {len(ratios)} rounds, "
        f"{min(ratios):.3f}-{max(ratios):.3f}); load average "
        f"{result['load_average_end'][0]:.1f} at the end"])


if __name__ == "__main__":
    sys.exit(main())
