"""The data-parallel step: a step function (loop.py's contract) that averages the
gradients over every rank, and the validation loss averaged over them.

Every rank holds the whole model and computes the loss and gradients of its
rows (--grad_accum micro-batches of them, summed); the gradients are averaged
over the ranks (nn.average_gradients, in --comm_dtype: precision.py) or, with
--shard_optimizer, each rank receives its share (sharded_optimizer.py); they are
clipped by their global norm and the update applied. Compiled (--compile), the
gradient, all-reduce and update functions are each one graph, and the step
that is neither timed nor accumulated runs the three as one, as mlx-lm
compiles its step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_map

from .collectives import all_sum, average_gradients
from .data import split_batch, validation_batches
from .loop import Batch, StepResult
from .model import loss_fn
from .precision import refresh, to_float32
from .sharded_optimizer import ShardedOptimizer


class DataParallelStep:
    """One optimizer step on every rank's rows, the gradients averaged over the
    group (a loop.StepFunction).

    ``compute``: the model the passes run on when it is not the master model (a
    bfloat16 copy, precision.compute_copy), else None; ``compute_dtype`` its
    dtype, ``comm_dtype`` the all-reduce's; ``grad_accum`` micro-batches of a
    rank's rows; ``grad_clip`` 0: no clipping; ``random_state``: the passes draw
    from mlx's global random state (LoRA's dropout), which compiling must then
    carry. Its compiled functions are built at the first call, for the model and
    optimizer given then (after any resume replaced the optimizer state).
    """

    def __init__(self, group, *, global_batch: int, grad_accum: int = 1, grad_clip: float = 0.0,
                 compute: nn.Module | None = None, compute_dtype: mx.Dtype = mx.float32,
                 comm_dtype: mx.Dtype = mx.float32, compile: bool = True,
                 random_state: bool = False):
        self.group, self.grad_accum, self.grad_clip = group, grad_accum, grad_clip
        self.micro_batch = split_batch(global_batch, group.size(), grad_accum)
        self.compute, self.compute_dtype, self.comm_dtype = compute, compute_dtype, comm_dtype
        self.compile, self.random_state = compile, random_state
        self._built: tuple | None = None  # (model, optimizer, the four functions)

    def functions(self, model: nn.Module, optimizer):
        """Compiled gradient, all-reduce and update functions (state captured, see
        mx.compile), and the three as one: the step that is not timed and has one
        micro-batch runs as one compiled graph, which MLX schedules without a stop
        between the phases."""
        if self._built is None or self._built[0] is not model or self._built[1] is not optimizer:
            self._built = (model, optimizer, self._build(model, optimizer))
        return self._built[2]

    def _build(self, model: nn.Module, optimizer):
        group, clip, comm, dtype = self.group, self.grad_clip, self.comm_dtype, self.compute_dtype
        compute = self.compute if self.compute is not None else model
        loss_and_grad = nn.value_and_grad(compute, loss_fn)
        state = [model.state, optimizer.state] + ([compute.state] if compute is not model else [])
        if self.random_state:
            state.append(mx.random.state)  # dropout draws from mlx's global random state

        def grad_step(x, y, *weights):  # weights: rows data's trained targets (data.py)
            if compute is model:
                return loss_and_grad(model, x, y, *weights)
            refresh(compute, model, dtype)  # bfloat16 passes on the float32 master's values
            loss, grads = loss_and_grad(compute, x, y, *weights)
            return loss.astype(mx.float32), to_float32(grads)

        # Sharded (sharded_optimizer.py): each rank receives, clips and updates its share only.
        sharded = isinstance(optimizer, ShardedOptimizer)
        clip_grad_norm = optimizer.clip_grad_norm if sharded else optim.clip_grad_norm

        def reduce_step(grads):  # the gradient all-reduce, apart: its time is measured
            if sharded:
                return optimizer.average_gradients(grads, comm)
            return average_gradients(grads, group, comm)

        def update_step(grads):
            if clip > 0:
                grads, norm = clip_grad_norm(grads, clip)
            else:
                norm = mx.array(0.0)
            optimizer.update(model, grads)
            return norm

        def whole_step(x, y, *weights):  # the three in one graph, as mlx-lm compiles its step
            loss, grads = grad_step(x, y, *weights)
            return loss, update_step(reduce_step(grads))

        if self.compile:
            # value_and_grad writes the parameters back into the model, so the
            # gradient step must declare the state as an output too.
            compile_ = partial(mx.compile, inputs=state, outputs=state)
            whole_step = compile_(whole_step)
            grad_step, update_step = compile_(grad_step), compile_(update_step)
            reduce_step = mx.compile(reduce_step)
        return grad_step, reduce_step, update_step, whole_step

    def __call__(self, model: nn.Module, optimizer, batch: Batch, timed: bool = False) -> StepResult:
        """One optimizer step on this rank's rows ``batch`` (loop.py's contract).
        ``timed``: evaluate between the phases and return their seconds (compute,
        gradient communication, optimizer); the values are the same, only the
        waits differ (logged steps only)."""
        grad_step, reduce_step, update_step, whole_step = self.functions(model, optimizer)
        accum, rows = self.grad_accum, self.micro_batch
        start = time.perf_counter()
        x_all, y_all, *w_all = batch  # w_all: rows data's weights
        if accum == 1 and not timed:
            step_loss, norm = whole_step(mx.array(x_all), mx.array(y_all),
                                         *(mx.array(w) for w in w_all))
            mx.eval(model.parameters(), optimizer.state, step_loss, norm)
            return StepResult(step_loss, norm)
        step_loss, grads = mx.array(0.0), None
        for m in range(accum):
            part = slice(m * rows, (m + 1) * rows)
            loss, g = grad_step(mx.array(x_all[part]), mx.array(y_all[part]),
                                *(mx.array(w[part]) for w in w_all))
            grads = g if grads is None else tree_map(mx.add, grads, g)
            step_loss = step_loss + loss
            if accum > 1:
                mx.eval(grads, step_loss)  # bound memory to one micro-batch of activations
        if accum > 1:
            grads = tree_map(lambda g: g / accum, grads)
        if timed:
            mx.eval(grads, step_loss)
            computed = time.perf_counter()
        grads = reduce_step(grads)
        if timed:
            mx.eval(grads)
            reduced = time.perf_counter()
        norm = update_step(grads)
        step_loss = step_loss / accum
        mx.eval(model.parameters(), optimizer.state, step_loss, norm)
        phases = {}
        if timed:
            phases = {"compute_s": round(computed - start, 6),
                      "comm_s": round(reduced - computed, 6),
                      "optimizer_s": round(time.perf_counter() - reduced, 6)}
        return StepResult(step_loss, norm, phases)


def validation(split, global_batch: int, group, batches: int,
               loss: Callable[[nn.Module, Batch], mx.array] | None = None
               ) -> Callable[[nn.Module], float]:
    """evaluate(model): the validation loss averaged over every rank's share of
    ``batches`` global batches of ``split`` (the same on every rank: a collective).
    ``group``: the ranks sharing each batch's rows; ``loss(model, rows)``: one share's
    mean loss (default the model's own; a pipeline's goes through its stages:
    pipeline.PipelineStep.loss)."""

    def own_loss(model: nn.Module, batch: Batch) -> mx.array:
        return loss_fn(model, *(mx.array(a) for a in batch))

    batch_loss = loss or own_loss

    def evaluate(model: nn.Module) -> float:
        total, n = mx.array(0.0), 0
        model.eval()  # no dropout (LoRA's)
        for batch in validation_batches(split, global_batch, group, batches):
            total = total + batch_loss(model, batch)
            n += 1
        mx.eval(total)
        model.train()
        if n == 0:
            return float("nan")
        if group.size() > 1:
            total = all_sum(total, group)
        return (total / (n * group.size())).item()

    return evaluate
