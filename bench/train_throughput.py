"""Trainer throughput and memory, measured in one run.

    python bench/train_throughput.py                     # demo config, a few minutes on 2 cores
    python bench/train_throughput.py --steps 5 --rounds 9 --ranks 1,2,4,8

Prints, for the `demo` config (or --config):
  1. tokens/s of reference_train's training step (1 process; compiled, its
     default, and eager) against a minimal bare MLX loop of the same model and
     batch (eager, and with mx.compile), with the OpenBLAS preload (1 thread, as
     `mlxcluster train` sets it when ranks share cores, and OpenBLAS's default)
     and, on Linux, without it; and the ratio trainer / faster bare loop;
  2. per-rank peak memory (MLX allocator peak and process peak RSS) and tokens/s
     at 1, 2 and 4 ranks: the real trainer CLI under mlx.launch --backend ring
     on this machine, tokens/s from its metrics.jsonl (first interval dropped).

Part 1 runs in one process per BLAS setting (LD_PRELOAD acts at start-up): the
four variants are warmed up (`--warmup` steps, compilation), then run in
alternating chunks of `--steps` steps for `--rounds` rounds, so that all see the
same load on a shared machine; each figure is the median over rounds, the ratio
the median of the per-round ratios. Without OpenBLAS a step is ~15x slower, so
chunks are `--slow-steps` long.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlxcluster.facts.blas import find_openblas, with_openblas  # noqa: E402


class BareLoop:
    """The minimal loop: same model and batch shape, random tokens, AdamW, nothing else."""

    def __init__(self, cfg, compiled: bool):
        from functools import partial

        import mlx.core as mx
        import mlx.nn as nn
        import mlx.optimizers as optim

        from reference_train.config import model_args
        from reference_train.model import Llama, loss_fn

        mx.random.seed(0)
        self.model = model = Llama(model_args(cfg, 257))
        self.opt = opt = optim.AdamW(learning_rate=cfg.lr, weight_decay=cfg.weight_decay)
        loss_and_grad = nn.value_and_grad(model, loss_fn)

        def step(x, y):
            loss, grads = loss_and_grad(model, x, y)
            opt.update(model, grads)
            return loss

        if compiled:
            state = [model.state, opt.state]
            step = partial(mx.compile, inputs=state, outputs=state)(step)
        self.fn = step
        x = mx.random.randint(0, 257, (cfg.global_batch, cfg.block_size + 1))
        self.x, self.y = x[:, :-1], x[:, 1:]
        mx.eval(model.parameters(), self.x, self.y)

    def step(self) -> None:
        import mlx.core as mx

        loss = self.fn(self.x, self.y)
        mx.eval(self.model.parameters(), self.opt.state, loss)


def throughput_worker(config: str, data: str, steps: int, warmup: int, rounds: int) -> dict:
    """In one process: reference_train's Trainer.train_step (compiled and eager) against
    the bare loop (eager and compiled), in alternating chunks of `steps` steps.

    Alternating in one process exposes every variant to the same machine load;
    each variant's figure is its median over the rounds.
    """
    import statistics

    import mlx.core as mx

    from reference_train.config import build_config
    from reference_train.train import Trainer

    out = tempfile.mkdtemp(prefix="train_bench_out.")
    common = ["--config", config, "--data", data, "--out", out]
    group = mx.distributed.init()
    variants = {
        "trainer": Trainer(build_config(common), group, log=lambda _: None).train_step,
        "trainer_eager": Trainer(build_config([*common, "--compile", "false"]), group,
                                 log=lambda _: None).train_step,
        "bare_eager": BareLoop(build_config(common), compiled=False).step,
        "bare_compiled": BareLoop(build_config(common), compiled=True).step,
    }
    cfg = build_config(common)
    tokens = cfg.global_batch * cfg.block_size
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            rates[name].append(steps * tokens / (time.perf_counter() - t0))
    shutil.rmtree(out, ignore_errors=True)
    result = {name: statistics.median(r) for name, r in rates.items()}
    result["ratio"] = statistics.median(
        t / max(e, c) for t, e, c in zip(rates["trainer"], rates["bare_eager"],
                                         rates["bare_compiled"], strict=True))
    return result


def run(cmd: list[str], env: dict[str, str], timeout: float = 1800) -> str:
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or "error" in proc.stderr.lower():
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc.stdout


def trainer_run(config: str, steps: int, warmup: int, ranks: int, data: Path, out: Path,
                env: dict[str, str], port: int = 33300) -> list[dict]:
    """Run reference_train; return its per-interval training records, first interval dropped."""
    args = ["-m", "reference_train.train", "--config", config, "--data", str(data),
            "--out", str(out), "--steps", str(warmup + steps), "--log_every", str(warmup),
            "--eval_every", "0", "--checkpoint_every", "0", "--sample_tokens", "0"]
    if ranks == 1:
        cmd = [sys.executable, *args]
    else:
        launch = shutil.which("mlx.launch", path=str(Path(sys.executable).parent))
        cmd = [launch, "-n", str(ranks), "--backend", "ring", "--starting-port", str(port),
               "--python", sys.executable]
        cmd += [f"--env={k}={env[k]}" for k in ("PYTHONPATH", "LD_PRELOAD", "OPENBLAS_NUM_THREADS")
                if k in env]
        cmd += ["--", *args]
    run(cmd, env)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss" in r][1:]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="demo")
    p.add_argument("--steps", type=int, default=3, help="steps per chunk with OpenBLAS")
    p.add_argument("--slow-steps", type=int, default=1, help="steps per chunk without OpenBLAS")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps first (compilation)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians)")
    p.add_argument("--ranks", default="1,2,4", help="rank counts for the memory table")
    p.add_argument("--mem-steps", type=int, default=4, help="timed steps per rank count")
    p.add_argument("--worker-data", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker_data:
        print(json.dumps(throughput_worker(args.config, args.worker_data, args.steps,
                                           args.warmup, args.rounds)))
        return 0

    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    base["PYTHONPATH"] = str(REPO)
    openblas = find_openblas()
    settings = []
    if openblas:
        one = {**with_openblas(base, openblas), "OPENBLAS_NUM_THREADS": "1"}
        settings += [("OpenBLAS, 1 thread", one, args.steps),
                     ("OpenBLAS, default threads", with_openblas(base, openblas), args.steps)]
    if sys.platform.startswith("linux"):
        settings.append(("bundled reference BLAS", base, args.slow_steps))
    else:
        settings = [("default (Accelerate)", base, args.steps)]

    tmp = Path(tempfile.mkdtemp(prefix="train_bench."))
    from reference_train.prepare import prepare_offline

    data = tmp / "data"
    prepare_offline(data)
    print(f"config {args.config}; {args.warmup} warm-up steps; data: offline corpus; "
          f"OpenBLAS: {openblas or 'not found'}")
    print("\n1. tokens/s, 1 process")
    print(f"{'BLAS':<27}{'steps':>6}{'trainer':>10}{'(eager)':>10}{'bare eager':>12}"
          f"{'bare comp.':>12}{'ratio':>8}{'of medians':>12}")
    results: dict = {"config": args.config, "rounds": args.rounds, "throughput": [], "ranks": []}
    for label, env, steps in settings:
        out = run([sys.executable, __file__, "--worker-data", str(data), "--config", args.config,
                   "--steps", str(steps), "--warmup", str(min(args.warmup, steps)),
                   "--rounds", str(args.rounds)], env)
        r = json.loads(out.strip().splitlines()[-1])
        r["ratio_of_medians"] = r["trainer"] / max(r["bare_eager"], r["bare_compiled"])
        print(f"{label:<27}{steps:>6}{r['trainer']:>10,.0f}{r['trainer_eager']:>10,.0f}"
              f"{r['bare_eager']:>12,.0f}{r['bare_compiled']:>12,.0f}{r['ratio']:>7.2f}x"
              f"{r['ratio_of_medians']:>11.2f}x")
        results["throughput"].append({"blas": label, "steps_per_chunk": steps, **r})
    if len(results["throughput"]) == 3:
        fast, _, slow = results["throughput"]
        print(f"OpenBLAS speed-up: trainer {fast['trainer'] / slow['trainer']:.1f}x, "
              f"bare eager {fast['bare_eager'] / slow['bare_eager']:.1f}x")
    print("ratio: median over rounds of trainer / the faster bare loop of the same round; "
          "of medians: trainer median / faster bare median")
    env = settings[0][1]
    print(f"\n2. per rank, {args.mem_steps} timed steps, same global batch "
          f"({settings[0][0]}; mlx.launch ring, all ranks on this machine)")
    print(f"{'ranks':>5}{'tokens/s':>10}{'MLX peak MiB per rank':>28}{'peak RSS MiB per rank':>28}")
    for n in [int(r) for r in args.ranks.split(",")]:
        recs = trainer_run(args.config, args.mem_steps, args.warmup, n, data, tmp / f"r{n}", env,
                           port=33300 + 20 * n)
        last = recs[-1]
        mem = "/".join(f"{v:.0f}" for v in last["peak_mem_mb"])
        rss = "/".join(f"{v:.0f}" for v in last["peak_rss_mb"])
        print(f"{n:>5}{mean([r['tokens_per_s'] for r in recs]):>10,.0f}{mem:>28}{rss:>28}")
        results["ranks"].append({"ranks": n, "tokens_per_s": mean([r["tokens_per_s"] for r in recs]),
                                 "peak_mem_mb": last["peak_mem_mb"], "peak_rss_mb": last["peak_rss_mb"]})
    print("\n" + json.dumps(results))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
