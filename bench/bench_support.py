"""What several benchmarks share: OpenBLAS preloaded as the trainer runs it, and
running our trainer and mlx-lm's `lora` each in its own process, with their reports."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlxcluster.facts.blas import find_openblas, with_openblas  # noqa: E402


def rerun_with_openblas(threads: int) -> Path | None:
    """Re-exec this script with OpenBLAS preloaded (LD_PRELOAD acts only at
    start-up), OPENBLAS_NUM_THREADS defaulting to ``threads``; returns the
    library once it is (None where this machine has none)."""
    blas = find_openblas()
    if blas and str(blas) not in os.environ.get("LD_PRELOAD", ""):
        env = with_openblas(os.environ, blas)
        env.setdefault("OPENBLAS_NUM_THREADS", str(threads))
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    return blas


def trainer_env(threads: int = 2) -> dict[str, str]:
    """The environment both trainers run in: this checkout importable, OpenBLAS
    preloaded where Linux has it, ``threads`` OpenBLAS threads."""
    return with_openblas({**os.environ, "PYTHONPATH": str(REPO),
                          "OPENBLAS_NUM_THREADS": str(threads)}, find_openblas())


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... exit {proc.returncode}:\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


def run_ours(out: Path, env: dict[str, str], *args: str) -> tuple[list[dict], str]:
    """`python -m reference_train.train --out OUT ARGS`: (OUT/metrics.jsonl's records, its log)."""
    proc = run([sys.executable, "-m", "reference_train.train", "--out", str(out), *args], env)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return records, proc.stdout


def ours_speed_and_peak(records: list[dict]) -> tuple[float, float]:
    """(median tokens/s of the reports after the first (compilation, warm-up),
    peak MLX memory in MiB) from our metrics.jsonl records."""
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r][1:]
    peak = max(max(r["peak_mem_mb"]) for r in records if "peak_mem_mb" in r)
    return statistics.median(speeds), peak


# mlx-lm's own `lora` main (parser, -c YAML config, defaults, run), with a callback that
# prints each training report (mlx-lm 0.32.2 shows them as a table meant for people).
MLX_LM_DRIVER = """
import json
from mlx_lm import lora
from mlx_lm.tuner.callbacks import TrainingCallback

class Report(TrainingCallback):
    def on_train_loss_report(self, info):
        print("BENCH " + json.dumps(info), flush=True)

# run() replaces the callback it is given with get_reporting_callbacks(--report-to): ours instead
lora.get_reporting_callbacks = lambda *a, **k: Report()
lora.main()
"""


def run_mlx_lm(env: dict[str, str], *args: str) -> list[dict]:
    """`python -m mlx_lm lora ARGS` (its main, through MLX_LM_DRIVER): its training
    reports ({"iteration", "tokens_per_second", "trained_tokens", "peak_memory" (GB)...})."""
    proc = run([sys.executable, "-c", MLX_LM_DRIVER, *args], env)
    reports = [json.loads(line[6:]) for line in proc.stdout.splitlines() if line.startswith("BENCH ")]
    if len(reports) < 2:
        raise SystemExit(f"mlx-lm reported {len(reports)} times:\n{proc.stdout[-3000:]}")
    return reports


def mlx_lm_peak_mib(reports: list[dict]) -> float:
    """mlx-lm's peak MLX memory (it reports mx.get_peak_memory() / 1e9) in MiB."""
    return max(r["peak_memory"] for r in reports) * 1e9 / 2**20


def mlx_lm_step(folder: Path, lora: dict | None = None, num_layers: int = -1):
    """mlx-lm's model from ``folder`` and its trainer's step (mlx_lm.tuner.trainer.train:
    value_and_grad of its default loss, average_gradients, optimizer.update, one
    mx.compile with the state, evaluated as it does), as ``run(batch, lengths) -> (loss,
    tokens)``. With ``lora`` (mlx-lm's lora_parameters: rank, scale, dropout, keys) the
    model is frozen and its last ``num_layers`` blocks adapted first, as mlx_lm.lora's
    train_model does (linear_to_lora_layers; a quantized folder stays quantized: QLoRA)."""
    from functools import partial

    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.nn.utils import average_gradients
    from mlx_lm.tuner.trainer import default_loss
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load

    model, _ = load(str(folder))
    if lora is not None:
        model.freeze()
        linear_to_lora_layers(model, num_layers, lora)
    model.train()
    optimizer = optim.AdamW(learning_rate=1e-5)
    state = [model.state, optimizer.state, mx.random.state]
    loss_and_grad = nn.value_and_grad(model, default_loss)

    @partial(mx.compile, inputs=state, outputs=state)
    def step(batch, lengths):
        (loss, tokens), grad = loss_and_grad(model, batch, lengths)
        optimizer.update(model, average_gradients(grad))
        return loss, tokens

    def run(batch, lengths):
        loss, tokens = step(batch, lengths)
        mx.eval(state, loss, tokens)
        return loss, tokens

    run.model = model
    return run
