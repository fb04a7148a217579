"""The training loop, handed its parts, as mlx-lm's `train()` is: `train_loop`.

    record = train_loop(model, optimizer, data, step, callback, plan=LoopPlan(...),
                        group=group, evaluate=evaluate, save=save, stop=stop)

The loop knows nothing of how a step is computed (data_parallel.py's step
function; a pipeline's is another), nor of what becomes of what it measures
(callbacks.py: the log lines, the metrics record, the heartbeats). What it is
handed:

- ``model``, ``optimizer``: passed to every call of ``step`` and ``evaluate``;
  the loop itself reads only ``optimizer.learning_rate`` (logged).
- ``data`` (`TrainData`): ``batch(i)``, this rank's rows of global batch i;
  ``trained_tokens(i)``, the targets global batch i trains (tokens/s).
- ``step`` (`StepFunction`, below): one optimizer step.
- ``callback`` (callbacks.TrainingCallback): told of each step, logged record,
  evaluation and checkpoint.
- ``plan`` (`LoopPlan`): from which step to which, how often to log, evaluate and
  checkpoint, and what the record's mfu is measured against.
- ``group``: the ranks; the logged loss is averaged over them, and every rank's
  peak memory gathered.
- ``evaluate(model) -> float``: the validation loss, the same on every rank (a
  collective: every rank calls it at the same steps).
- ``save(i)``: write a checkpoint of step i (collective).
- ``objective`` (objectives.py): the names of the metrics a step reports besides
  its loss, and how a logged record summarizes the interval's steps of them.
- ``stop() -> bool``: whether the ranks agreed to stop now (collective; asked at
  logged steps only, where a resumed run's logged losses stay an uninterrupted
  run's); then the loop saves and raises stopping.Stopped (the caller has the
  ranks part together: stopping.part_together).

It returns the last logged record (with ``val_loss`` when an evaluation followed
it). The last checkpoint and the export are the caller's (train.py).

The step function's contract (`StepFunction`)
---------------------------------------------
``step(model, optimizer, batch, timed) -> StepResult``, called once per
optimizer step, on every rank, in step order:

- ``model``: the float32 master model, whose trainable parameters the step
  updates (it may run its passes on a compute copy it holds: --dtype bfloat16).
- ``optimizer``: updates them (``optimizer.update(model, grads)``); its own step
  count drives the learning-rate schedule.
- ``batch``: this rank's rows of the global batch, ``(x, y, *weights)`` numpy
  arrays: ``x`` and ``y`` (rows, block_size) token ids, inputs and targets; for
  rows data also ``weights`` (rows, block_size) float32, each target's weight in
  the loss (data.py). The rows are what data.ShardedBatches gives this rank (its
  share of the global batch); splitting them into micro-batches is the step's.
- ``timed``: True at logged steps: evaluate between the phases and report their
  seconds; the values computed must be the same as untimed.

It computes the loss and the gradients over the rows, averages the gradients
over the ranks that hold copies of the same parameters (data-parallel: every
rank), clips them to --grad_clip by their global norm, applies the update, and
evaluates the model's parameters and the optimizer state before it returns. It
does not read data, count steps, log or checkpoint: the loop does.

It returns `StepResult`:

- ``loss``: an evaluated float32 scalar mx.array, such that the mean of it over
  every rank of ``group`` is the global batch's mean loss (the loop all-sums the
  interval's losses at each logged step and divides by ranks x steps).
  Data-parallel: this rank's mean loss over its rows. A pipeline: its replica's
  loss on every stage (e.g. sent back from the last stage), or the loss x stages
  on the last stage and 0 on the others.
- ``grad_norm``: the global gradient norm before clipping (over every
  parameter, whichever rank holds it), the same on every rank; 0 when
  --grad_clip is 0 (nothing measured it). The record logs rank 0's.
- ``metrics``: None, or the objective's metrics (a vector, one value per name of
  ``objective.metrics``), averaged over ranks like the loss: the loop gathers
  each step's at a logged step and the record has ``objective.summarize`` of them.
- ``phases``: {} when not timed; when timed the seconds of "compute_s",
  "comm_s" (gradient communication) and "optimizer_s" (the log line shows the
  three), and any other phase it measures (the record keeps them).

A step function also has ``loss(model, batch) -> mx.array``: the mean loss of
``batch``'s rows, forwards only (a pipeline's through its stages: every stage
calls it), from which `validation` makes the loop's ``evaluate``.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .callbacks import TrainingCallback
from .collectives import all_gather, all_sum
from .data import validation_batches
from .stopping import Stopped

Batch = tuple[np.ndarray, ...]  # (x, y, *weights): this rank's rows of one global batch


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step reports (see the contract above)."""

    loss: mx.array
    grad_norm: mx.array
    phases: dict[str, float] = field(default_factory=dict)
    metrics: mx.array | None = None  # the objective's, one a name (objectives.py); None: none


class StepFunction(Protocol):
    def __call__(self, model: nn.Module, optimizer, batch: Batch, timed: bool) -> StepResult: ...

    def loss(self, model: nn.Module, batch: Batch) -> mx.array: ...


class TrainData(Protocol):
    def batch(self, step: int) -> Batch: ...

    def trained_tokens(self, step: int) -> int: ...


@dataclass(frozen=True)
class LoopPlan:
    """Which steps the loop runs (``start`` up to ``last``), what it does when, and
    what a logged record's mfu is measured against (mfu.py)."""

    start: int
    last: int
    log_every: int
    eval_every: int = 0  # 0: never
    checkpoint_every: int = 0  # 0: only the caller's, at the end
    flops_per_token: float = 0.0
    peak_flops: float = 1.0  # per rank
    dtype: str = "float32"  # the compute dtype, in the record


def peak_memory_mb() -> tuple[float, float]:
    """(MLX allocator peak, process peak RSS) in MiB for this process."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB
    return mx.get_peak_memory() / 2**20, rss_bytes / 2**20


def gather_memory(group) -> tuple[list[float], list[float]]:
    """Every rank's (MLX peak, RSS peak) in MiB, gathered on all ranks."""
    mine = mx.array([peak_memory_mb()], dtype=mx.float32)
    every = all_gather(mine, group) if group.size() > 1 else mine
    every = np.array(every).reshape(-1, 2)
    return [round(float(v), 1) for v in every[:, 0]], [round(float(v), 1) for v in every[:, 1]]


def train_loop(model: nn.Module, optimizer, data: TrainData, step: StepFunction,
               callback: TrainingCallback, *, plan: LoopPlan, group,
               evaluate: Callable[[nn.Module], float], save: Callable[[int], None],
               stop: Callable[[], bool], objective=None) -> dict:
    """Steps plan.start+1 .. plan.last; the last logged record (see the module's docstring)."""
    size = group.size()
    callback.on_train_start(plan.start)
    record: dict = {}
    done = plan.start
    loss_sum, interval_steps, t0 = mx.array(0.0), 0, time.perf_counter()
    interval_tokens = 0  # trained targets: every position for text data
    interval_metrics: list[mx.array] = []  # each step's, this rank's (objectives.py)
    while done < plan.last:
        interval_tokens += data.trained_tokens(done)
        logged = (done + 1) % plan.log_every == 0 or done + 1 == plan.last
        result = step(model, optimizer, data.batch(done), logged)
        done += 1
        callback.on_step(done)
        loss_sum = loss_sum + result.loss
        if result.metrics is not None:
            interval_metrics.append(result.metrics)
        interval_steps += 1
        if done % plan.log_every == 0 or done == plan.last:
            elapsed = time.perf_counter() - t0
            loss = (all_sum(loss_sum, group) / (size * interval_steps)).item()
            mem, rss = gather_memory(group)
            record = {"step": done, "loss": loss,
                      "tokens_per_s": round(interval_tokens / elapsed, 1),
                      "lr": float(optimizer.learning_rate.item()),
                      "grad_norm": float(result.grad_norm.item()), "peak_mem_mb": mem,
                      "peak_rss_mb": rss, "ranks": size}
            record["mfu"] = round(plan.flops_per_token * record["tokens_per_s"]
                                  / (plan.peak_flops * size), 6)
            if interval_metrics:
                record.update(summarize(objective, interval_metrics, group))
            record.update(result.phases)  # this step's: compute, gradient communication, optimizer
            record["dtype"] = plan.dtype
            callback.on_log(record)
            loss_sum, interval_steps, interval_tokens = mx.array(0.0), 0, 0
            interval_metrics = []
        if plan.eval_every and (done % plan.eval_every == 0 or done == plan.last):
            val = evaluate(model)
            callback.on_eval(done, val)
            record["val_loss"] = val
        if plan.checkpoint_every and done % plan.checkpoint_every == 0 and done < plan.last:
            save(done)
            callback.on_checkpoint(done)
        if interval_steps == 0 and done < plan.last and stop():
            save(done)  # every rank at this logged step (stopping.py)
            raise Stopped(done)  # the ranks part together after rank 0's last lines (stopping.py)
        if interval_steps == 0:
            t0 = time.perf_counter()  # time only training, not logging or evaluation
    return record


def summarize(objective, per_step: list[mx.array], group) -> dict:
    """The record's entries of the objective's metrics: each step's averaged over the
    ranks (one all-sum of them all), then summarized over the interval's steps."""
    steps = mx.stack(per_step)  # (steps, metrics)
    if group.size() > 1:
        steps = all_sum(steps, group)
    steps = np.array(steps / group.size(), dtype=np.float64)
    return objective.summarize(dict(zip(objective.metrics, steps.T, strict=True)))


def validation(split, global_batch: int, group, batches: int,
               loss: Callable[[nn.Module, Batch], mx.array]) -> Callable[[nn.Module], float]:
    """evaluate(model): the validation loss averaged over every rank's share of
    ``batches`` global batches of ``split`` (the same on every rank: a collective).
    ``group``: the ranks sharing each batch's rows; ``loss(model, rows)``: one share's
    mean loss (the step function's ``loss``)."""

    def evaluate(model: nn.Module) -> float:
        total, n = mx.array(0.0), 0
        model.eval()  # no dropout (LoRA's)
        for batch in validation_batches(split, global_batch, group, batches):
            total = total + loss(model, batch)
            n += 1
        mx.eval(total)
        model.train()
        if n == 0:
            return float("nan")
        if group.size() > 1:
            total = all_sum(total, group)
        return (total / (n * group.size())).item()

    return evaluate
