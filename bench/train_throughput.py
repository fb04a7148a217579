"""Trainer throughput and memory, measured in one run.

    python bench/train_throughput.py                     # demo config, a few minutes on 2 cores
    python bench/train_throughput.py --steps 40 --ranks 1,2,4,8

Prints, for the `demo` config (or --config):
  1. tokens/s of reference_train (1 process) against a minimal bare MLX loop of
     the same model and batch (eager, and with mx.compile), with and (on Linux)
     without the OpenBLAS preload, and the ratio trainer / best bare loop;
  2. per-rank peak memory (MLX allocator peak and process peak RSS) and tokens/s
     at 1, 2 and 4 ranks (mlx.launch --backend ring on this machine).

Steps: the first `--warmup` steps (compilation) are not timed; the trainer's
tokens/s comes from its own metrics.jsonl, logged every `--warmup` steps, with
the first interval dropped. Without OpenBLAS a step is ~15x slower, so fewer
steps are timed (--slow-steps). On a shared machine the figures are noisy, so
the trainer and the bare loops run alternately for `--rounds` rounds and each
keeps its best round.
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

from mlxcluster.blas import find_openblas, with_openblas  # noqa: E402


def bare_worker(config: str, steps: int, warmup: int, compiled: bool) -> dict:
    """The minimal loop: same model and batch shape, random tokens, AdamW, no extras."""
    from functools import partial

    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    from reference_train.model import Llama, loss_fn
    from reference_train.train import build_config, model_args

    cfg = build_config(["--config", config])
    mx.random.seed(0)
    model = Llama(model_args(cfg, 257))
    opt = optim.AdamW(learning_rate=cfg.lr, weight_decay=cfg.weight_decay)
    loss_and_grad = nn.value_and_grad(model, loss_fn)

    def step(x, y):
        loss, grads = loss_and_grad(model, x, y)
        opt.update(model, grads)
        return loss

    if compiled:
        state = [model.state, opt.state]
        step = partial(mx.compile, inputs=state, outputs=state)(step)
    x = mx.random.randint(0, 257, (cfg.global_batch, cfg.block_size + 1))
    inputs, targets = x[:, :-1], x[:, 1:]
    mx.eval(model.parameters(), inputs, targets)
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.perf_counter()
        loss = step(inputs, targets)
        mx.eval(model.parameters(), opt.state, loss)
    elapsed = time.perf_counter() - t0
    return {"tokens_per_s": steps * cfg.global_batch * cfg.block_size / elapsed}


def run(cmd: list[str], env: dict[str, str], timeout: float = 1800) -> str:
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or "error" in proc.stderr.lower():
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc.stdout


def bare_tokens_per_s(config: str, steps: int, warmup: int, compiled: bool,
                      env: dict[str, str]) -> float:
    out = run([sys.executable, __file__, "--bare-worker", "--config", config, "--steps",
               str(steps), "--warmup", str(warmup), *(["--compiled"] if compiled else [])], env)
    return json.loads(out.strip().splitlines()[-1])["tokens_per_s"]


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
        cmd += [f"--env={k}={env[k]}" for k in ("PYTHONPATH", "LD_PRELOAD") if k in env]
        cmd += ["--", *args]
    run(cmd, env)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss" in r][1:]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="demo")
    p.add_argument("--steps", type=int, default=20, help="timed steps with OpenBLAS")
    p.add_argument("--slow-steps", type=int, default=4, help="timed steps without OpenBLAS")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps first (compilation)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; best kept")
    p.add_argument("--ranks", default="1,2,4", help="rank counts for the memory table")
    p.add_argument("--mem-steps", type=int, default=4, help="timed steps per rank count")
    p.add_argument("--bare-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.bare_worker:
        print(json.dumps(bare_worker(args.config, args.steps, args.warmup, args.compiled)))
        return 0

    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    base["PYTHONPATH"] = str(REPO)
    openblas = find_openblas()
    settings = [("OpenBLAS preloaded", with_openblas(base, openblas), args.steps)] if openblas else []
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
    print(f"{'BLAS':<24}{'steps':>6}{'trainer':>10}{'bare eager':>12}{'bare comp.':>12}{'ratio':>8}")
    results: dict = {"config": args.config, "rounds": args.rounds, "throughput": [], "ranks": []}
    for label, env, steps in settings:
        ours = eager = comp = 0.0
        for i in range(args.rounds):
            recs = trainer_run(args.config, steps, args.warmup, 1, data, tmp / f"t{i}-{label[:4]}", env)
            ours = max(ours, mean([r["tokens_per_s"] for r in recs]))
            eager = max(eager, bare_tokens_per_s(args.config, steps, args.warmup, False, env))
            comp = max(comp, bare_tokens_per_s(args.config, steps, args.warmup, True, env))
        ratio = ours / max(eager, comp)
        print(f"{label:<24}{steps:>6}{ours:>10,.0f}{eager:>12,.0f}{comp:>12,.0f}{ratio:>7.2f}x")
        results["throughput"].append({"blas": label, "steps": steps, "trainer": ours,
                                      "bare_eager": eager, "bare_compiled": comp, "ratio": ratio})

    if len(results["throughput"]) == 2:
        fast, slow = results["throughput"]
        print(f"OpenBLAS speed-up: trainer {fast['trainer'] / slow['trainer']:.1f}x, "
              f"bare eager {fast['bare_eager'] / slow['bare_eager']:.1f}x")
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
