"""Pipeline-parallel training: the model's blocks split over N ranks, one stage each.

    --pipeline N --micro_batches M   (stages.py plans which blocks each rank holds)

Each rank (stage) holds only its blocks (stage_load.py loads them), the first the
embedding, the last the final norm and head. A step runs the global batch as M
micro-batches of global_batch / M rows, on the GPipe schedule: every stage runs
the M forwards, sending each micro-batch's activations to the next stage and
receiving them from the previous one (mx.distributed.send / recv, which every
backend has; on ring only neighbours talk, and stage s's neighbours are s - 1 and
s + 1, the last's the first), then the M backwards, each the vjp of the stage's
forward with the gradient the next stage sent back as its cotangent, sending the
gradient of its input to the previous stage. The forward of each micro-batch is
built as one mx.vjp whose cotangent is a receive not yet evaluated: evaluating
the output runs the forward only and keeps what the backward needs, so nothing
is computed twice (with --grad_checkpoint only each block's input is kept).

    stage 0  F0 F1 F2 F3 .. .. .. B0 B1 B2 B3
    stage 1  .. F0 F1 F2 F3 B0 B1 B2 B3 .. ..      (N = 2, M = 4)

Each stage idles (N - 1) of the M + N - 1 slots (the bubble): (N - 1) / (M + N - 1),
1/5 here; more micro-batches shrink it, each holding its activations until its
backward (GPipe keeps all M; 1F1B, which would keep at most N, is not built).

The loss is computed on the last stage as each micro-batch's share of the mean
over the whole global batch (cross-entropy x rows / global_batch), so their sum,
and the gradients, are those of one process on the same batch. The loss is
all-summed to every stage for logging, the gradient norm (for --grad_clip) from
each stage's sum of squares, and each stage's optimizer updates its own
parameters.

Tied embeddings: the first stage owns the matrix (its optimizer state too); the
last stage holds a copy for its head. When the matrix trains (full
fine-tuning), the last stage sends its gradient of the copy to the first, which
adds it to its own (the gradient one process would have), and after the update
sends the new matrix back: the copy is always the first stage's matrix, bit for bit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from . import kernels
from .errors import DataError
from .model import Llama, head_logits, run_blocks
from .precision import collective_stream, refresh
from .sharded_optimizer import clip_grad_norm_over
from .stages import StagePlan, check_micro_batches

TIED = "tok_embeddings.weight"


class Absent(nn.Module):
    """A block another stage holds: no parameters here, never called."""


class Stage(nn.Module):
    """One stage of a Llama: its blocks, and the embedding / final norm and head when
    it holds them. Parameter names are the whole model's (layers.5.attention.wq...;
    the blocks it does not hold are empty), so checkpoints, adapters and the
    optimizer name them as one process does.

    `__call__` maps the first stage's token ids, or another's incoming activations
    (B, L, D), to the activations it sends on, or on the last stage to logits."""

    def __init__(self, model: Llama, plan: StagePlan):
        super().__init__()
        self.args, self.plan = model.args, plan
        if plan.embedding:
            self.tok_embeddings = model.tok_embeddings
        self.layers = [model.layers[i] if i in plan.blocks else Absent()
                       for i in range(len(model.layers))]
        if plan.head:
            self.norm = model.norm
            if not model.args.tie_embeddings:
                self.output = model.output
        self.grad_checkpoint = False

    def __call__(self, h: mx.array) -> mx.array:
        if self.plan.first:
            h = self.tok_embeddings(h)
        h = run_blocks([self.layers[i] for i in self.plan.blocks], h,
                       self.grad_checkpoint and self.training)
        return head_logits(self, h) if self.plan.head else h


class SingleReplica:
    """The data-parallel group of a pipeline without copies: one replica, which reads
    the whole global batch (every stage reads it: the first uses the inputs, the
    last the targets)."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


@dataclass
class StepResult:
    """What a pipeline step tells the loop, the same on every stage."""

    loss: float  # mean over the global batch's trained targets (one process's loss)
    tokens: int  # trained targets in the global batch
    grad_norm: float  # before clipping (0.0 when --grad_clip is 0, as train.py logs it)
    # this stage's seconds: compute_s (forwards and backwards, waits included),
    # wait_s (of those, waiting for a neighbour: the bubble and the transfers),
    # comm_s (the tied matrix and the collectives), optimizer_s
    split: dict = field(default_factory=dict)


class PipelineStep:
    """One optimizer step of one stage, called by every stage with the same global batch.

    `stage` holds the master (float32) weights the optimizer updates (its state is
    initialised here, for this stage's own parameters); `compute`, when
    given, is the stage's bfloat16 copy the passes run on (precision.py), refreshed
    from the master before each step. `group` is the pipeline: stage i is rank i."""

    def __init__(self, stage: Stage, optimizer, group, micro_batches: int,
                 grad_clip: float = 0.0, compute: Stage | None = None,
                 compute_dtype: mx.Dtype = mx.float32):
        plan = stage.plan
        if group.size() != plan.count or group.rank() != plan.index:
            raise DataError(f"stage {plan.index + 1} of {plan.count} runs as rank "
                            f"{group.rank()} of {group.size()}",
                            "launch one rank per stage, stage i as rank i")
        check_micro_batches(micro_batches, micro_batches)
        self.stage, self.compute = stage, compute if compute is not None else stage
        self.optimizer, self.group, self.plan = optimizer, group, plan
        self.micro_batches, self.grad_clip = micro_batches, grad_clip
        self.compute_dtype = compute_dtype
        trainable = [n for n, _ in tree_flatten(stage.trainable_parameters())]
        # The last stage's copy of a tied matrix is differentiated but not updated here.
        self.copy = TIED if (plan.embedding and not plan.first and TIED in trainable) else None
        self.owned = [n for n in trainable if n != self.copy]  # what this stage's optimizer updates
        self.differentiated = self.owned + ([self.copy] if self.copy else [])
        self.exchange_tied = (stage.args.tie_embeddings and plan.count > 1
                              and TIED in trainable)
        params = dict(tree_flatten(stage.parameters()))
        optimizer.init(tree_unflatten([(n, params[n]) for n in self.owned]))
        self.waited = self.computed = 0.0  # the last step's: seconds waited, when computed

    # ------------------------------------------------------------ the schedule

    def gradients(self, x, y, weights=None) -> tuple[mx.array, dict[str, mx.array]]:
        """(this stage's share of the loss: the loss on the last stage, 0 elsewhere;
        the float32 gradients of its trainable parameters, the tied copy's included),
        for the global batch (x, y, weights: B rows each). Every stage calls it."""
        plan, compute, group, M = self.plan, self.compute, self.group, self.micro_batches
        rows_total, length = x.shape[0], x.shape[1]
        check_micro_batches(M, rows_total)
        rows = rows_total // M
        if compute is not self.stage:
            refresh(compute, self.stage, self.compute_dtype)
        params = dict(tree_flatten(compute.parameters()))
        primals = [params[n] for n in self.differentiated]
        k = len(primals)
        shape = (rows, length, self.stage.args.dim)
        self.waited = 0.0
        loss, pending = mx.array(0.0), []
        for m in range(M):
            part = slice(m * rows, (m + 1) * rows)
            inputs = primals if plan.first else [*primals, self._received(shape)]
            tokens = mx.array(x[part]) if plan.first else None
            if plan.last:
                targets = mx.array(y[part])
                trained = None if weights is None else mx.array(weights[part])
                cotangent = mx.array(1.0)
            else:
                targets = trained = None
                cotangent = mx.distributed.recv(shape, self.compute_dtype, plan.index + 1,
                                                group=group, stream=collective_stream())

            def forward(*args, tokens=tokens, targets=targets, trained=trained):
                compute.update(tree_unflatten(list(zip(self.differentiated, args[:k], strict=True))))
                out = compute(tokens if plan.first else args[k])
                if not plan.last:
                    return out.astype(self.compute_dtype)
                logits = out if out.dtype == mx.float32 else out.astype(mx.float32)
                # this micro-batch's share of the global batch's mean
                return kernels.cross_entropy(logits, targets, trained) * (rows / rows_total)

            (out,), grads = mx.vjp(forward, inputs, [cotangent])
            mx.eval(out)  # the forward only: the backward waits for its cotangent
            if plan.last:
                loss = loss + out
            else:
                mx.eval(mx.distributed.send(out, plan.index + 1, group=group,
                                            stream=collective_stream()))
            pending.append((cotangent, grads))
        compute.update(tree_unflatten(list(zip(self.differentiated, primals, strict=True))))
        total = None
        for m in range(M):
            cotangent, grads = pending[m]
            pending[m] = None  # this micro-batch's activations go once its backward ran
            if not plan.last:
                self._wait_for(cotangent)
            mine = [g.astype(mx.float32) for g in grads[:k]]
            total = mine if total is None else [a + b for a, b in zip(total, mine, strict=True)]
            sent = [] if plan.first else [mx.distributed.send(
                grads[k], plan.index - 1, group=group, stream=collective_stream())]
            mx.eval(*sent, *total)
        mx.eval(loss)
        self.computed = time.perf_counter()
        return loss, dict(zip(self.differentiated, total or [], strict=True))

    def _received(self, shape) -> mx.array:
        h = mx.distributed.recv(shape, self.compute_dtype, self.plan.index - 1,
                                group=self.group, stream=collective_stream())
        self._wait_for(h)
        return h

    def _wait_for(self, received: mx.array) -> None:
        start = time.perf_counter()
        mx.eval(received)
        self.waited += time.perf_counter() - start

    # ------------------------------------------------------------ the step

    def step_gradients(self, x, y, weights=None) -> tuple[mx.array, dict[str, mx.array]]:
        """(the global batch's loss, on every stage; the gradients of the parameters this
        stage updates, float32, before clipping): one process's gradients, each on the
        stage that holds its parameter (a tied matrix's on the first stage, both uses
        summed). Every stage calls it."""
        loss, grads = self.gradients(x, y, weights)
        plan, group, stream = self.plan, self.group, collective_stream()
        if self.exchange_tied and plan.last:  # the copy's gradient to the matrix's owner
            mx.eval(mx.distributed.send(grads.pop(self.copy), 0, group=group, stream=stream))
        elif self.exchange_tied and plan.first:
            grads[TIED] = grads[TIED] + mx.distributed.recv_like(
                grads[TIED], plan.count - 1, group=group, stream=stream)
        if plan.count > 1:
            loss = mx.distributed.all_sum(loss, group=group, stream=stream)
        mx.eval(loss, *grads.values())
        return loss, grads

    def __call__(self, x, y, weights=None) -> StepResult:
        """One optimizer step on the global batch (x, y, weights), every stage alike."""
        start = time.perf_counter()
        loss, grads = self.step_gradients(x, y, weights)
        reduced = time.perf_counter()
        plan, group, stream = self.plan, self.group, collective_stream()
        if self.grad_clip > 0:
            grads, norm = clip_grad_norm_over(grads, self.grad_clip, group)
        else:
            norm = mx.array(0.0)
        self.optimizer.update(self.stage, tree_unflatten(list(grads.items())))
        mx.eval(norm, self.stage.parameters(), self.optimizer.state)
        updated = time.perf_counter()
        if self.exchange_tied and plan.first:  # the updated matrix to the last stage's copy
            mx.eval(mx.distributed.send(self.stage.tok_embeddings.weight, plan.count - 1,
                                        group=group, stream=stream))
        elif self.exchange_tied and plan.last:
            copy = mx.distributed.recv_like(self.stage.tok_embeddings.weight, 0, group=group,
                                            stream=stream)
            self.stage.update(tree_unflatten([(TIED, copy)]))
            mx.eval(self.stage.parameters())
        done = time.perf_counter()
        tokens = x.size if weights is None else int((weights > 0).sum())
        return StepResult(float(loss.item()), int(tokens), float(norm.item()), {
            "compute_s": round(self.computed - start, 6), "wait_s": round(self.waited, 6),
            "comm_s": round(reduced - self.computed + done - updated, 6),
            "optimizer_s": round(updated - reduced, 6)})
