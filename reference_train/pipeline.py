"""Pipeline-parallel training: the model's blocks split over N ranks, one stage each.

    --pipeline N --micro_batches M   (stages.py plans which blocks each rank holds)

Each rank (stage) holds only its blocks (stage_load.py loads them), the first the
embedding, the last the final norm and head. A step runs the global batch as M
micro-batches of global_batch / M rows. A forward (F) receives a micro-batch's
activations from the previous stage and sends its own to the next
(mx.distributed.send / recv, which every backend has; on ring only neighbours
talk, and stage s's neighbours are s - 1 and s + 1, the last's the first); a
backward (B) is the vjp of the stage's forward with the gradient the next stage
sent back as its cotangent, and sends the gradient of its input to the previous
stage. The forward of each micro-batch is built as one mx.vjp whose cotangent
is a receive not yet evaluated: evaluating the output runs the forward only and
keeps what the backward needs, so nothing is computed twice (with
--grad_checkpoint only each block's input is kept). With --compile (the
default, as data_parallel.py's step) that forward-and-vjp is one mx.compile'd
function, traced at the first micro-batch and replayed for every other
(PipelineStep.passes); the sends and receives stay outside it, on the
Exchange's streams, and the micro-batches' gradients are summed outside it
in the backwards' order.

The schedule (stages.schedule, --pipeline_schedule) orders each stage's passes:

    1F1B (default)                        GPipe
    stage 0  F0 F1 B0 F2 B1 F3 B2 B3      F0 F1 F2 F3 .. .. .. B0 B1 B2 B3
    stage 1  .. F0 B0 F1 B1 F2 B2 F3 B3   .. F0 F1 F2 F3 B0 B1 B2 B3 .. ..
                                          (N = 2 stages, M = 4 micro-batches)

Both idle (N - 1) of the M + N - 1 slots (the bubble): (N - 1) / (M + N - 1),
1/5 here, and more micro-batches shrink it; GPipe holds all M micro-batches'
activations until their backwards, 1F1B at most N - s on stage s.
The order of the backwards, and so the sums, are the same in both: the same
losses to the bit.

The loss is computed on the last stage as each micro-batch's share of the mean
over the whole global batch (cross-entropy x rows / global_batch), so their sum,
and the gradients, are those of one process on the same batch. The loss is
all-summed to every stage for logging, the gradient norm (for --grad_clip) from
each stage's sum of squares, and each stage's optimizer updates its own
parameters.

Preference pairs (--objective dpo or orpo; `pair_gradients`): a micro-batch is a slice
of the pairs, its chosen and rejected rows stacked through the stages; the last stage
adds each pair's loss and metrics x 1 / pairs (objectives.pair_sums), the metrics
all-summed beside the loss. DPO first runs its reference model forwards only through the
stages (`reference_pass`: the adapters off, or a frozen copy of the stage's blocks).
Supervised training's passes are not touched by it (`pair_passes` is apart).

Tied embeddings: the first stage owns the matrix (its optimizer state too); the
last stage holds a copy for its head. When the matrix trains (full
fine-tuning), the last stage sends its gradient of the copy to the first, which
adds it to its own (the gradient one process would have), and after the update
sends the new matrix back: the copy is always the first stage's matrix, bit for bit.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from . import kernels, lora
from .collectives import Exchange, all_sum, average_gradients, recv_like, send
from .errors import DataError
from .loop import Batch, StepResult
from .model import Llama, head_logits, run_blocks
from .objectives import SFT, logits_logps, pair_sums
from .precision import refresh
from .stages import StagePlan, check_micro_batches, check_schedule, schedule

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


def tied_copy(stage: Stage) -> str | None:
    """TIED when `stage` holds the last stage's copy of a tied, trained embedding (its
    gradient goes to the first stage; its value comes from it), else None."""
    plan = stage.plan
    trainable = dict(tree_flatten(stage.trainable_parameters()))
    return TIED if (plan.embedding and not plan.first and TIED in trainable) else None


def owned_parameters(stage: Stage) -> dict:
    """The parameters `stage`'s optimizer updates (the tree `optimizer.init` takes):
    its trainable ones but the tied copy."""
    copy = tied_copy(stage)
    params = dict(tree_flatten(stage.parameters()))
    trainable = [n for n, _ in tree_flatten(stage.trainable_parameters())]
    return tree_unflatten([(n, params[n]) for n in trainable if n != copy])


class PipelineStep:
    """One optimizer step of one stage (a loop.StepFunction), called by every stage of
    a pipeline with the same rows: its replica's share of the global batch.

    `stage`: this rank's stage, whose plan and parameter names the step is built for;
    each call steps the stage and optimizer it is handed (loop.py's contract), as
    data_parallel.DataParallelStep does: the master (float32) weights, and the
    optimizer initialised for the stage's own parameters (`owned_parameters`).
    `compute`, when given, is the stage's bfloat16 copy the passes run on
    (precision.py), refreshed from the master before each step. `group` is the
    pipeline: stage i is rank i. `replicas`: the ranks holding the same stage in the
    other copies of the pipeline (their gradients averaged, in `comm_dtype`); None:
    one pipeline. `compile` (--compile): each micro-batch's forward and backward
    run as one mx.compile'd function, built at the first call and reused (see
    `passes`); `random_state`: the passes draw from mlx's global random state
    (LoRA's dropout), which compiling must then carry. `objective` (objectives.py): sft,
    or preference pairs (dpo, orpo: `pair_gradients`); `reference`: DPO's reference with
    full fine-tuning, a frozen copy of this stage's blocks (None: the stage itself with
    its adapters off, lora.adapters_off)."""

    def __init__(self, stage: Stage, group, micro_batches: int,
                 grad_clip: float = 0.0, compute: Stage | None = None,
                 compute_dtype: mx.Dtype = mx.float32, schedule: str = "1f1b",
                 replicas=None, comm_dtype: mx.Dtype = mx.float32, compile: bool = True,
                 random_state: bool = False, objective=None, reference: Stage | None = None):
        plan = stage.plan
        if group.size() != plan.count or group.rank() != plan.index:
            raise DataError(f"stage {plan.index + 1} of {plan.count} runs as rank "
                            f"{group.rank()} of {group.size()}",
                            "launch one rank per stage, stage i as rank i")
        check_micro_batches(micro_batches, micro_batches)  # at least 1 (each batch: it divides)
        self.stage, self.compute = stage, compute  # compute None: the passes run on the stage
        self.group, self.plan = group, plan
        self.micro_batches, self.grad_clip = micro_batches, grad_clip
        self.compute_dtype, self.comm_dtype = compute_dtype, comm_dtype
        self.replicas = replicas if replicas is not None and replicas.size() > 1 else None
        check_schedule(schedule)
        self.schedule = schedule
        self.link = Exchange(group)
        trainable = [n for n, _ in tree_flatten(stage.trainable_parameters())]
        # The last stage's copy of a tied matrix is differentiated but not updated here.
        self.copy = tied_copy(stage)
        self.owned = [n for n in trainable if n != self.copy]  # what this stage's optimizer updates
        self.differentiated = self.owned + ([self.copy] if self.copy else [])
        self.exchange_tied = (stage.args.tie_embeddings and plan.count > 1
                              and TIED in trainable)
        self.computed = 0.0  # when the last step's passes ended
        self.compile, self.random_state = compile, random_state
        self._passes: tuple | None = None  # (compute, names, forward_backward, accumulate)
        self._update: tuple | None = None  # (model, optimizer, squared, apply)
        self._traced = [0]  # times a micro-batch's pass was built in Python (`traced`)
        self.objective = objective or SFT()
        self.pairs = bool(self.objective.metrics)  # preference pairs: a loss and metrics
        self.reference = reference
        self._pair_passes: tuple | None = None  # as _passes, preference pairs' (pair_passes)
        # (module, dtype, compiled) -> (names, forward): training's and validation's (reference_pass)
        self._reference_fns: dict = {}

    @property
    def traced(self) -> int:
        """How many times a micro-batch's pass was built in Python: compiled, once per
        traced shape; eager, once per micro-batch."""
        return self._traced[0]

    # ------------------------------------------------------------ the schedule

    def gradients(self, x, y, weights=None, stage: Stage | None = None
                  ) -> tuple[mx.array, dict[str, mx.array]]:
        """(this stage's share of the loss: the loss on the last stage, 0 elsewhere;
        the float32 gradients of its trainable parameters, the tied copy's included),
        for the global batch (x, y, weights: B rows each), on `stage` (default the one
        it was built for). Every stage calls it.

        The stage runs its forwards (F) and backwards (B) in the schedule's order
        (stages.schedule), its activations and gradients moved by an Exchange."""
        stage, compute = self.refreshed(stage)
        plan, M = self.plan, self.micro_batches
        rows_total, length = x.shape[0], x.shape[1]
        check_micro_batches(M, rows_total)
        rows = rows_total // M
        share = mx.array(rows / rows_total, dtype=mx.float32)

        def data(m):
            part = slice(m * rows, (m + 1) * rows)
            return ([mx.array(x[part])] if plan.first else []) + (
                [mx.array(y[part]), share] if plan.last else []) + (
                [mx.array(weights[part])] if plan.last and weights is not None else [])

        self.link.waited = 0.0
        loss, _, grads = self.run_schedule(compute, self.passes(compute), data,
                                           (rows, length, stage.args.dim))
        return loss, grads

    def pair_gradients(self, batch: Batch, stage: Stage | None = None
                       ) -> tuple[mx.array, mx.array, dict[str, mx.array]]:
        """`gradients` of preference pairs (DPO, ORPO): (this stage's share of the loss and
        of the metrics, its gradients), for `batch` = (chosen inputs, targets, mask,
        rejected inputs, targets, mask), P pairs each (data.PairSplit).

        A micro-batch is P / M pairs: its chosen and rejected rows run through the stages
        together (stacked on the batch axis: one message per hop, one pass of 2P / M rows
        on each stage), and the last stage takes the pairs apart again (objectives.pair_sums):
        each pair's loss and metrics summed, scaled by 1 / P, so that the micro-batches'
        shares add up to the means over the step's pairs, as cross-entropy's do for `gradients`.
        DPO first runs a forward-only pass of the reference model through every stage
        (`reference_pass`), whose row scores on the last stage are data of the policy's pass."""
        stage, compute = self.refreshed(stage)
        plan, M = self.plan, self.micro_batches
        pairs_total, length = batch[0].shape[0], batch[0].shape[1]
        check_micro_batches(M, pairs_total)
        rows = pairs_total // M
        scale = mx.array(1 / pairs_total, dtype=mx.float32)
        inputs, targets, masks = (stacked(batch[i], batch[i + 3], rows) for i in range(3))
        self.link.waited = 0.0
        shape = (2 * rows, length, stage.args.dim)
        reference = None
        if self.objective.needs_reference:
            module = self.reference if self.reference is not None else compute
            reference = self.reference_pass(module, self.compute_dtype, inputs, targets,
                                            masks, shape, compiled=self.compile)

        def data(m):
            return ([inputs(m)] if plan.first else []) + (
                [targets(m), masks(m), scale] + ([reference[m]] if reference else [])
                if plan.last else [])

        return self.run_schedule(compute, self.pair_passes(compute), data, shape)

    def refreshed(self, stage: Stage | None) -> tuple[Stage, Stage]:
        """(the stage stepped: `stage` or the one the step was built for, the stage the
        passes run on: itself, or its compute copy refreshed from it)."""
        stage = self.stage if stage is None else stage
        compute = stage if self.compute is None else self.compute
        if compute is not stage:
            refresh(compute, stage, self.compute_dtype)
        return stage, compute

    def run_schedule(self, compute: Stage, passes, data, shape: tuple
                     ) -> tuple[mx.array, mx.array | None, dict[str, mx.array]]:
        """(this stage's share of the loss, of the metrics (preference pairs; else None),
        its gradients): every micro-batch's forward and backward on `compute` in the
        schedule's order (`gradients`), `passes` (`passes` or `pair_passes`) computing
        them, `data(m)` micro-batch m's data (the first stage's inputs, the last stage's
        targets and what its loss needs), `shape` that of the activations sent on.

        A stage that sends its input's gradient back computes a micro-batch's
        weights' gradients one backward late: after the next backward's input
        gradient is sent (as zero-bubble schedules split the backward). The sum keeps
        the backwards' order, so the gradients are the same; the stage holds one more
        micro-batch's activations for it. At the end of the step that is what
        counts: the last stage sends the last input gradient without first summing
        the weights' gradients of the micro-batch before, so the first stage
        starts its last backward that much sooner (the demo model's two stages,
        both orders alternating in the same ranks: 60.1-60.5 against 57.1-57.6 ms
        a step; docs/performance-runs.md 1f)."""
        plan, M = self.plan, self.micro_batches
        names, forward_backward, accumulate = passes
        params = dict(tree_flatten(compute.parameters()))
        held = [params[n] for n in names]  # every array the passes read, in `names`' order
        link = self.link
        link.waited = 0.0
        loss, in_flight, total, summed = mx.array(0.0), {}, None, None
        metrics = mx.zeros((len(self.objective.metrics),)) if self.pairs else None
        for kind, m in schedule(self.schedule, plan.index, plan.count, M):
            if kind == "F":
                received = [] if plan.first else [
                    link.wait_for(link.receive(shape, self.compute_dtype, plan.index - 1))]
                # the next stage's gradient: received when the backward needs it, not now
                cotangent = mx.array(1.0) if plan.last else link.receive(
                    shape, self.compute_dtype, plan.index + 1)
                out, grads = forward_backward(held, received, data(m), cotangent)
                link.evaluate(out)  # the forward only: the backward waits for its cotangent
                if plan.last and self.pairs:
                    loss, metrics = loss + out[0], metrics + out[1]
                elif plan.last:
                    loss = loss + out
                else:
                    link.send(out, plan.index + 1)
                in_flight[m] = (cotangent, grads)
            else:
                cotangent, grads = in_flight.pop(m)  # its activations go once its backward ran
                if not plan.last:
                    link.wait_for(cotangent)
                if not plan.first:  # the input's gradient first: the previous stage waits on it
                    link.send(grads[1][0], plan.index - 1)
                total = accumulate(total, grads[0])
                if plan.first:
                    link.evaluate(*total)
                else:  # the weights' gradients one backward late (see the docstring)
                    if summed is not None:
                        link.evaluate(*summed)
                    summed = total
        link.evaluate(*(total or []), loss, *([] if metrics is None else [metrics]))
        self.computed = time.perf_counter()
        return loss, metrics, dict(zip(self.differentiated, total or [], strict=True))

    def reference_pass(self, module: Stage, dtype: mx.Dtype, inputs, targets, masks,
                       shape: tuple, compiled: bool = False) -> list[mx.array]:
        """DPO's reference model through the stages, forwards only: on the last stage each
        micro-batch's row scores (2P / M, the chosen rows then the rejected), elsewhere [].
        `module`: a frozen copy of this stage's blocks (full fine-tuning), or the stage the
        policy runs on with its adapters off (LoRA, DoRA, QLoRA: no second copy); `dtype`:
        the activations sent on. Its cost: one more forward of every micro-batch per step
        (measured: 0.31 of a DPO step, docs/training-pipeline.md), its own bubble (N - 1 micro-batches' forwards
        on the last stage), and no activation kept (nothing is differentiated).
        `compiled`: one mx.compile'd function per stage, traced once (the SFT passes are
        untouched)."""
        plan, link = self.plan, self.link
        names, forward = self.reference_function(module, dtype, compiled)
        params = dict(tree_flatten(module.parameters()))
        held = [params[n] for n in names]
        scores = []
        for m in range(self.micro_batches):
            h = inputs(m) if plan.first else link.wait_for(
                link.receive(shape, dtype, plan.index - 1))
            out = forward(held, h, [targets(m), masks(m)] if plan.last else [])
            if plan.last:
                scores.append(out)
            else:
                link.send(out, plan.index + 1)
            link.evaluate(out)
        link.evaluate()
        return scores

    def reference_function(self, module: Stage, dtype: mx.Dtype, compiled: bool):
        """(names, forward(held, h, data)): the reference model's forward on this stage
        (`reference_pass`), built once for `module` (compiled or not)."""
        key = (id(module), dtype, compiled)  # the modules live as long as the step
        if key in self._reference_fns:
            return self._reference_fns[key]
        # as `passes`: nothing below refers to the step itself
        plan, objective = self.plan, self.objective
        adapters = module is not self.reference  # the policy's stage: its adapters off
        names = [n for n, _ in tree_flatten(module.parameters())]

        def forward(held, h, data):
            before = module.parameters()
            module.update(tree_unflatten(list(zip(names, held, strict=True))))
            with lora.adapters_off(module) if adapters else nullcontext():
                out = module(h)
            module.update(before)
            if not plan.last:
                return out.astype(dtype)
            targets, mask = data
            return mx.stop_gradient(objective.row_scores(logits_logps(out, targets), mask))

        if compiled:
            forward = mx.compile(forward)
        self._reference_fns[key] = (names, forward)
        return names, forward

    def passes(self, compute: Stage):
        """(the names of every array of `compute` the passes read, `forward_backward`,
        `accumulate`), built once for `compute` (the stage, or its bfloat16 copy):

            forward_backward(held, received, data, cotangent) -> (out, [grads, [input's]])
                one micro-batch: its forward (activations to send on, or on the last
                stage its share of the loss) and the vjp of it with `cotangent`, the
                gradients of the differentiated parameters and of the input received;
            accumulate(total, grads) -> the float32 sum, in the backwards' order.

        Compiled (--compile), each is one mx.compile'd graph: traced once (`traced`
        counts), then replayed for every micro-batch, its elementwise chains fused.
        The sends and receives stay outside (the Exchange's own streams), and so does
        the sum over micro-batches: 1F1B runs forwards of later micro-batches before
        the backwards of earlier ones, so a sum carried through the forward-backward
        call would add them in another order. Evaluating `out` alone runs the forward
        only: MLX fuses an elementwise op only with consumers that are all fused
        with it, and nothing of the backward consumes the output, so the
        backward's cotangent (a receive not yet sent) is not waited for then (the
        pipeline tests would hang if it were)."""
        if self._passes is not None and self._passes[0] is compute:
            return self._passes[1:]

        def loss_share(out, data):  # the last stage: its share of the mean cross-entropy
            targets, share, *trained = data
            logits = out if out.dtype == mx.float32 else out.astype(mx.float32)
            return kernels.cross_entropy(logits, targets, trained[0] if trained else None) * share

        self._passes = (compute, *self.built_passes(compute, loss_share, 0))
        return self._passes[1:]

    def pair_passes(self, compute: Stage):
        """`passes` for preference pairs (`pair_gradients`), built once for `compute`: the
        same forward and vjp, but the last stage's output is [its share of the loss, of
        the metrics] (objectives.pair_sums) and the vjp's cotangents [1, zeros]: the
        metrics come out of the same pass as the loss, and carry no gradient. Kept apart
        from `passes` so that supervised training's compiled pass stays the graph it was."""
        if self._pair_passes is not None and self._pair_passes[0] is compute:
            return self._pair_passes[1:]
        objective = self.objective

        def pair_shares(out, data):  # [the loss's share, the metrics'] of these pairs
            targets, mask, scale, *reference = data
            return pair_sums(objective, logits_logps(out, targets), mask,
                             reference[0] if reference else None, scale)

        self._pair_passes = (compute, *self.built_passes(compute, pair_shares,
                                                         len(objective.metrics)))
        return self._pair_passes[1:]

    def built_passes(self, compute: Stage, last_out, n_metrics: int):
        """(names, forward_backward, accumulate) of `passes`, the last stage's output
        `last_out(output, data)`: its share of the loss, or with `n_metrics` > 0 [that
        share, the metrics' share] (whose cotangent is zeros: no gradient)."""
        # Nothing below refers to the step itself: MLX keeps a compiled function
        # until the process exits, and with it whatever it refers to; the step's
        # groups then outlive MPI (MPI_Comm_free after MPI_Finalize aborts the run).
        plan, k, dtype, traced = self.plan, len(self.differentiated), self.compute_dtype, self._traced
        names = [n for n, _ in tree_flatten(compute.parameters())]
        slots = {n: i for i, n in enumerate(names)}
        picked = [slots[n] for n in self.differentiated]

        def forward_backward(held, received, data, cotangent):
            traced[0] += 1
            before = compute.parameters()  # the module is left as it was found

            def forward(*args):
                values = list(held)
                for slot, value in zip(picked, args[:k], strict=True):
                    values[slot] = value
                compute.update(tree_unflatten(list(zip(names, values, strict=True))))
                out = compute(data[0] if plan.first else args[k])
                if not plan.last:
                    return out.astype(dtype)
                return last_out(out, data[1:] if plan.first else data)

            primals = [held[slot] for slot in picked]
            with_metrics = plan.last and n_metrics > 0
            cotangents = [cotangent, mx.zeros((n_metrics,))] if with_metrics else [cotangent]
            outs, grads = mx.vjp(forward, [*primals, *received], cotangents)
            compute.update(before)
            return (outs if with_metrics else outs[0]), [
                [g.astype(mx.float32) for g in grads[:k]], grads[k:]]

        def add(total, grads):
            return [a + b for a, b in zip(total, grads, strict=True)]

        def accumulate(total, grads):
            return grads if total is None else add(total, grads)

        if self.compile:
            random = [mx.random.state] if self.random_state else []
            forward_backward = mx.compile(forward_backward, inputs=random, outputs=random)
            add = mx.compile(add)
        return names, forward_backward, accumulate

    # ------------------------------------------------------------ the step

    def step_gradients(self, x, y, weights=None, stage: Stage | None = None
                       ) -> tuple[mx.array, dict[str, mx.array]]:
        """(the global batch's loss, on every stage; the gradients of the parameters this
        stage updates, float32, before clipping): one process's gradients, each on the
        stage that holds its parameter (a tied matrix's on the first stage, both uses
        summed). Every stage calls it."""
        loss, grads = self.gradients(x, y, weights, stage)
        loss, _, grads = self.combine(loss, None, grads)
        return loss, grads

    def combine(self, loss, metrics, grads) -> tuple[mx.array, mx.array | None, dict]:
        """`step_gradients` from this stage's shares: the loss (and metrics) all-summed to
        every stage, the tied copy's gradient added to the matrix's, the copies averaged."""
        plan, group = self.plan, self.group
        if self.exchange_tied and plan.last:  # the copy's gradient to the matrix's owner
            mx.eval(send(grads.pop(self.copy), 0, group))
        elif self.exchange_tied and plan.first:
            grads[TIED] = grads[TIED] + recv_like(grads[TIED], plan.count - 1, group)
        if plan.count > 1:
            loss = all_sum(loss, group)
            if metrics is not None:  # the last stage's; zeros elsewhere
                metrics = all_sum(metrics, group)
        if self.replicas is not None:  # the copies of this stage: one gradient
            nested = tree_unflatten(list(grads.items()))  # the tree nn.average_gradients takes
            grads = dict(tree_flatten(average_gradients(nested, self.replicas, self.comm_dtype)))
        mx.eval(loss, *([] if metrics is None else [metrics]), *grads.values())
        return loss, metrics, grads

    def __call__(self, model: nn.Module, optimizer, batch: Batch, timed: bool = False
                 ) -> StepResult:
        """One optimizer step on this replica's rows `batch` (loop.py's contract: `model`
        and `optimizer`: this rank's stage and the optimizer of its own parameters). The loss is the replica's
        on every stage; the phases: compute_s (forwards and backwards, waits included),
        wait_s (of those, waiting for a neighbour: the bubble and the transfers),
        comm_s (the tied matrix and the collectives), optimizer_s."""
        start = time.perf_counter()
        if self.pairs:
            loss, metrics, grads = self.combine(*self.pair_gradients(batch, model))
        else:
            x, y, *weights = batch
            loss, grads = self.step_gradients(x, y, weights[0] if weights else None, model)
            metrics = None
        reduced = time.perf_counter()
        plan, group = self.plan, self.group
        squared, apply = self.updates(model, optimizer)
        if self.grad_clip > 0:  # clip_grad_norm_over's norm: every stage's sum of squares
            summed = squared(grads)
            norm = mx.sqrt(all_sum(summed, group) if group.size() > 1 else summed)
            apply(grads, norm)
        else:
            norm = mx.array(0.0)
            apply(grads)
        mx.eval(norm, model.parameters(), optimizer.state)
        updated = time.perf_counter()
        if self.exchange_tied and plan.first:  # the updated matrix to the last stage's copy
            mx.eval(send(model.tok_embeddings.weight, plan.count - 1, group))
        elif self.exchange_tied and plan.last:
            copy = recv_like(model.tok_embeddings.weight, 0, group)
            model.update(tree_unflatten([(TIED, copy)]))
            mx.eval(model.parameters())
        done = time.perf_counter()
        phases = {"compute_s": round(self.computed - start, 6),
                  "wait_s": round(self.link.waited, 6),
                  "comm_s": round(reduced - self.computed + done - updated, 6),
                  "optimizer_s": round(updated - reduced, 6)} if timed else {}
        return StepResult(loss.astype(mx.float32), norm, phases, metrics)

    def updates(self, model: nn.Module, optimizer):
        """(squared(grads): the sum of the gradients' squares; apply(grads, norm=None):
        the gradients clipped by the global `norm` (sharded_optimizer.clip_grad_norm_over's
        arithmetic), then the optimizer's step on `model`), built for the model and
        optimizer of the first call (after a resume replaced the optimizer's state), as
        data_parallel.DataParallelStep builds its update. Compiled (--compile), each is
        one graph, the model's and optimizer's state captured. The all_sum of the
        squares over the stages stays outside: a compiled function lives until the
        process exits, and a group it held would be freed after MPI's finalize."""
        if self._update is not None and self._update[0] is model and self._update[1] is optimizer:
            return self._update[2:]
        clip = self.grad_clip

        def squared(grads):
            return sum((g.square().sum() for g in grads.values()), mx.array(0.0))

        def apply(grads, norm=None):
            if norm is not None:
                normalizer = mx.minimum(clip / (norm + 1e-6), 1.0)
                grads = {n: (g * normalizer).astype(g.dtype) for n, g in grads.items()}
            optimizer.update(model, tree_unflatten(list(grads.items())))

        if self.compile:
            state = [model.state, optimizer.state]
            squared = mx.compile(squared)
            apply = mx.compile(apply, inputs=state, outputs=state)
        self._update = (model, optimizer, squared, apply)
        return squared, apply

    # ------------------------------------------------------------ validation

    def loss(self, stage: Stage, batch: Batch) -> mx.array:
        """The loss of `batch` (this replica's rows) on `stage`'s master weights, forwards
        only, in micro-batches as a step runs them: the same on every stage (a collective
        of the pipeline: every stage calls it with the same rows). loop.validation's
        `loss(model, batch)`."""
        if self.pairs:
            return self.pair_loss(stage, batch)
        x, y, *weights = batch
        trained = weights[0] if weights else None
        rows_total, length = x.shape[0], x.shape[1]
        rows = rows_total // self.micro_batches

        def part(m):
            return slice(m * rows, (m + 1) * rows)

        def share(m, out):
            return kernels.cross_entropy(
                out.astype(mx.float32), mx.array(y[part(m)]),
                None if trained is None else mx.array(trained[part(m)])) * (rows / rows_total)

        return self.forward_losses(stage, lambda m: mx.array(x[part(m)]), share,
                                   (rows, length, stage.args.dim))

    def pair_loss(self, stage: Stage, batch: Batch) -> mx.array:
        """`loss` of preference pairs: DPO's reference pass, then the policy's forwards on
        the master weights, each micro-batch's share of the loss from the last stage
        (objectives.pair_sums), as data-parallel's validation computes it (the reference:
        the frozen copy, or the master stage with its adapters off)."""
        pairs_total, length = batch[0].shape[0], batch[0].shape[1]
        rows = pairs_total // self.micro_batches
        inputs, targets, masks = (stacked(batch[i], batch[i + 3], rows) for i in range(3))
        shape = (2 * rows, length, stage.args.dim)
        scale = mx.array(1 / pairs_total, dtype=mx.float32)
        reference = None
        if self.objective.needs_reference:
            module = self.reference if self.reference is not None else stage
            dtype = self.compute_dtype if self.reference is not None else mx.float32
            reference = self.reference_pass(module, dtype, inputs, targets, masks, shape)

        def share(m, out):
            return pair_sums(self.objective, logits_logps(out, targets(m)), masks(m),
                             reference[m] if reference else None, scale)[0]

        return self.forward_losses(stage, inputs, share, shape)

    def forward_losses(self, stage: Stage, inputs, share, shape: tuple) -> mx.array:
        """Validation's forwards (`loss`, `pair_loss`) through the stages, micro-batch m's
        input `inputs(m)` on the first stage, its share of the loss `share(m, output)` on
        the last: their sum, all-summed to every stage."""
        plan, link = self.plan, self.link
        total = mx.array(0.0)
        for m in range(self.micro_batches):
            h = inputs(m) if plan.first else link.wait_for(
                link.receive(shape, mx.float32, plan.index - 1))
            out = stage(h)
            if plan.last:
                total = total + share(m, out)
                link.evaluate(total)
            else:
                link.send(out.astype(mx.float32), plan.index + 1)
                link.evaluate(out)
        link.evaluate()
        if plan.count > 1:
            total = all_sum(total, self.group)
        mx.eval(total)
        return total


def stacked(chosen: np.ndarray, rejected: np.ndarray, rows: int):
    """part(m): micro-batch m's chosen rows then its rejected rows (2 x `rows`), one array."""
    def part(m: int) -> mx.array:
        cut = slice(m * rows, (m + 1) * rows)
        return mx.array(np.concatenate([chosen[cut], rejected[cut]]))
    return part
