"""`--pipeline 2` against data-parallel 2, both in the same two ranks, in turns: the
ratio of their steps with the machine's drift taken out.

    python bench/pipeline_pairs.py                        # the demo model, M=8: ~1 minute
    python bench/pipeline_pairs.py --size wide --rounds 20
    python bench/pipeline_pairs.py --quick                # the tiny model: a smoke run

bench/pipeline.py runs the real trainer, each case in a launch of its own; on this
shared 2-core machine one case's rounds spread by up to 25%
(docs/performance-runs.md 1e), more than most changes to the step. Here two local
ranks (ring, started as mlxcluster starts ranks that all run here) build both
steps as the trainer builds them: reference_train.data_parallel.DataParallelStep
on the whole model and reference_train.pipeline.PipelineStep on each rank's stage
(the split by bytes, 1F1B, compiled), the same model (bench/pipeline.py's
SPEED_MODEL or WIDE_MODEL), initial weights, batch, AdamW and gradient clipping.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline import QUICK_MODEL, SPEED_MODEL, WIDE_MODEL, local_ranks, rank_env  # noqa: E402

REPORT = "PAIRS_REPORT "
VOCAB = 257  # the byte-level vocabulary of the offline corpus bench/pipeline.py trains on


def rank_main(flags: list[str], micro_batches: int, rounds: int, steps: int) -> int:
    """One of the two ranks: both steps built, then run in turns; rank 0 prints the times."""
    import mlx.core as mx
    import mlx.optimizers as optim
    import numpy as np

    from reference_train.collectives import barrier
    from reference_train.config import build_config, model_args
    from reference_train.data_parallel import DataParallelStep
    from reference_train.model import Llama
    from reference_train.pipeline import PipelineStep, owned_parameters
    from reference_train.stage_load import model_bytes, new_stage
    from reference_train.stages import plan_stages

    group = mx.distributed.init(backend="ring", strict=True)
    rank, size = group.rank(), group.size()
    cfg = build_config(flags)
    args = model_args(cfg, VOCAB)
    tokens = np.random.default_rng(cfg.seed).integers(
        0, VOCAB, (cfg.global_batch, cfg.block_size + 1)).astype(np.int32)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def adamw():
        return optim.AdamW(learning_rate=cfg.lr, betas=[cfg.beta1, cfg.beta2],
                           weight_decay=cfg.weight_decay)

    mx.random.seed(cfg.seed)
    model = Llama(args)
    mx.eval(model.parameters())
    rows = cfg.global_batch // size
    data_parallel = (model, adamw(), DataParallelStep(group, global_batch=cfg.global_batch,
                                                      grad_clip=cfg.grad_clip),
                     (x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]))
    mx.random.seed(cfg.seed)
    stage = new_stage(args, plan_stages(model_bytes(args), size)[rank])
    optimizer = adamw()
    optimizer.init(owned_parameters(stage))
    pipelined = (stage, optimizer, PipelineStep(stage, group, micro_batches,
                                                grad_clip=cfg.grad_clip), (x, y))

    times: dict[str, list[list[float]]] = {"data_parallel": [], "pipeline": []}
    for r in range(rounds):
        for name, (module, opt, step, batch) in (("data_parallel", data_parallel),
                                                 ("pipeline", pipelined)):
            taken = []
            for _ in range(steps):
                barrier(group)
                start = time.perf_counter()
                mx.eval(step(module, opt, batch).loss)
                barrier(group)
                taken.append(time.perf_counter() - start)
            if r > 0:  # the first round compiles both steps
                times[name].append(taken)
    if rank == 0:
        print(REPORT + json.dumps(times), flush=True)
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
        return rank_main(flags, *(int(a) for a in sys.argv[3:6]))
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

    cfg = build_config(flags)
    env = rank_env(0)
    rank_cmd = [str(Path(__file__).resolve()), "--as-rank", json.dumps(flags),
                str(args.micro_batches), str(args.rounds), str(args.steps)]
    cmd = local_ranks(2, rank_cmd, env)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(f"{started}, load average {os.getloadavg()[0]:.1f}: {' '.join(flags)}, "
          f"--pipeline 2 M={args.micro_batches} against data-parallel 2, {args.rounds} rounds "
          f"of {args.steps} steps each (the first untimed)", flush=True)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    reports = [line.split(REPORT, 1)[1] for line in proc.stdout.splitlines() if REPORT in line]
    if proc.returncode != 0 or not reports:
        print(f"the ranks failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
              file=sys.stderr)
        return 1
    result = summary(json.loads(reports[0]), cfg.global_batch * cfg.block_size)
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
