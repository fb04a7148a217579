"""Data-parallel training: its step function (loop.py's contract), which averages the
gradients over every rank, and the run's part (`DataParallel`, parallelism.py's
contract: the model, optimizer, step, checkpoints, resume and export of a run whose
every rank holds the whole model).

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
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_map

from . import lora
from .collectives import average_gradients, refuse_together
from .config import TrainConfig, model_args
from .data import split_batch
from .disk_room import said_when_full
from .export import export_adapters, export_model
from .fine_tune import trains_adapters
from .hf_io import model_from_folder
from .launch_env import has_sum_scatter
from .loop import Batch, StepResult
from .model import Llama, count_parameters, generate
from .objectives import SFT, make_objective
from .pipeline_outputs import other_layout
from .precision import compute_copy, dtype_of, refresh, to_float32
from .resume import HostLayout, Loaded, agree_on_checkpoint, load_folder, say_notes
from .sharded_optimizer import ShardedOptimizer


class DataParallelStep:
    """One optimizer step on every rank's rows, the gradients averaged over the
    group (a loop.StepFunction).

    ``compute``: the model the passes run on when it is not the master model (a
    bfloat16 copy, precision.compute_copy), else None; ``compute_dtype`` its
    dtype, ``comm_dtype`` the all-reduce's; ``grad_accum`` micro-batches of a
    rank's rows; ``grad_clip`` 0: no clipping; ``random_state``: the passes draw
    from mlx's global random state (LoRA's dropout), which compiling must then
    carry; ``objective`` (objectives.py): the loss differentiated, and the metrics it
    reports with it (preference training's rewards), each summed over micro-batches and
    averaged like the loss. Its compiled functions are built at the first call, for the
    model and optimizer given then (after any resume replaced the optimizer state).
    """

    def __init__(self, group, *, global_batch: int, grad_accum: int = 1, grad_clip: float = 0.0,
                 compute: nn.Module | None = None, compute_dtype: mx.Dtype = mx.float32,
                 comm_dtype: mx.Dtype = mx.float32, compile: bool = True,
                 random_state: bool = False, objective=None):
        self.group, self.grad_accum, self.grad_clip = group, grad_accum, grad_clip
        self.micro_batch = split_batch(global_batch, group.size(), grad_accum)
        self.compute, self.compute_dtype, self.comm_dtype = compute, compute_dtype, comm_dtype
        self.compile, self.random_state = compile, random_state
        self.objective = objective or SFT()
        self.with_metrics = bool(self.objective.metrics)  # the loss is (loss, metrics)
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
        loss_and_grad = nn.value_and_grad(compute, self.objective.loss)
        state = [model.state, optimizer.state] + ([compute.state] if compute is not model else [])
        state += self.objective.state  # a frozen reference model (full fine-tuning's DPO)
        if self.random_state:
            state.append(mx.random.state)  # dropout draws from mlx's global random state

        def grad_step(*batch):  # (x, y, *weights), or a preference batch (data.py)
            if compute is model:
                return loss_and_grad(model, *batch)
            refresh(compute, model, dtype)  # bfloat16 passes on the float32 master's values
            out, grads = loss_and_grad(compute, *batch)  # out: the loss (and the metrics)
            return tree_map(lambda a: a.astype(mx.float32), out), to_float32(grads)

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

        def whole_step(*batch):  # the three in one graph, as mlx-lm compiles its step
            out, grads = grad_step(*batch)
            return out, update_step(reduce_step(grads))

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
        if accum == 1 and not timed:
            out, norm = whole_step(*(mx.array(a) for a in batch))
            mx.eval(model.parameters(), optimizer.state, out, norm)
            return self.result(out, norm)
        step_out, grads = None, None  # the loss (and metrics), summed over micro-batches
        for m in range(accum):
            part = slice(m * rows, (m + 1) * rows)
            out, g = grad_step(*(mx.array(a[part]) for a in batch))
            grads = g if grads is None else tree_map(mx.add, grads, g)
            step_out = out if step_out is None else tree_map(mx.add, step_out, out)
            if accum > 1:
                mx.eval(grads, step_out)  # bound memory to one micro-batch of activations
        if accum > 1:
            grads = tree_map(lambda g: g / accum, grads)
        if timed:
            mx.eval(grads, step_out)
            computed = time.perf_counter()
        grads = reduce_step(grads)
        if timed:
            mx.eval(grads)
            reduced = time.perf_counter()
        norm = update_step(grads)
        step_out = tree_map(lambda a: a / accum, step_out)
        mx.eval(model.parameters(), optimizer.state, step_out, norm)
        phases = {}
        if timed:
            phases = {"compute_s": round(computed - start, 6),
                      "comm_s": round(reduced - computed, 6),
                      "optimizer_s": round(time.perf_counter() - reduced, 6)}
        return self.result(step_out, norm, phases)

    def result(self, out, norm: mx.array, phases: dict | None = None) -> StepResult:
        """The StepResult of a step whose objective gave `out`: the loss, or (the loss,
        its metrics)."""
        loss, metrics = out if self.with_metrics else (out, None)
        return StepResult(loss, norm, phases or {}, metrics)

    def loss(self, model: nn.Module, batch: Batch) -> mx.array:
        """The mean loss of this rank's rows ``batch`` on ``model``, forwards only."""
        out = self.objective.loss(model, *(mx.array(a) for a in batch))
        return out[0] if self.with_metrics else out


# ---------------------------------------------------------------- the run's part


def make_model(cfg: TrainConfig, meta: dict, data_dir: Path) -> Llama:
    """The run's model, from --init_from's folder or drawn from --seed, with its
    adapters when --fine_tune lora or dora (the base frozen, quantized or not)."""
    mx.random.seed(cfg.seed)  # every rank draws the same initial weights
    if cfg.init_from:  # the model's shape and weights from a Llama folder (hf_io.py)
        model = model_from_folder(cfg.init_from, meta, data_dir, cfg.fine_tune)
    else:
        model = Llama(model_args(cfg, meta["vocab_size"]))
    if trains_adapters(cfg.fine_tune):
        lora.check_base_dtype(cfg, model)
        lora.apply_config(model, cfg)
    return model


class DataParallel:
    """A data-parallel run (parallelism.Parallelism): every rank holds the whole model
    and reads its share of each global batch; one checkpoint writer per --out folder."""

    no_sample = None  # rank 0 holds the whole model: it samples

    def __init__(self, cfg: TrainConfig, group, backend: str, meta: dict, log):
        self.cfg, self.group, self.backend, self.meta, self.log = cfg, group, backend, meta, log
        self.data_group = group  # every rank reads its share of each global batch
        self.lora = trains_adapters(cfg.fine_tune)
        self.objective = make_objective(cfg, meta)  # refuses data of the other kind
        self.reduce_scatter = cfg.shard_optimizer and has_sum_scatter(backend, mx.__version__)
        self.layout: HostLayout | None = None

    def place(self, layout: HostLayout) -> HostLayout:
        """This rank's checkpoint writers: the world's layout (storage.py)."""
        self.layout = layout
        return layout

    def checkpoints(self, root: Path) -> Path:
        return root

    def build(self, data_dir: Path) -> tuple[nn.Module, nn.Module]:
        """(the model: float32 master weights, its compute copy: itself, or a bfloat16
        twin the passes run on)."""
        cfg = self.cfg
        model = make_model(cfg, self.meta, data_dir)

        def empty():  # a model of this shape, with its adapters frozen alike
            twin = Llama(model.args)
            return lora.apply_config(twin, cfg) if self.lora else twin

        compute = compute_copy(model, empty, dtype_of(cfg.dtype))
        for m in (model, compute):  # --grad_checkpoint: blocks recomputed (model.py)
            m.grad_checkpoint = cfg.grad_checkpoint
        return model, compute

    def init_optimizer(self, optimizer, model):
        """`optimizer` for `model`'s trainable parameters, or each rank's share of it
        (--shard_optimizer: sharded_optimizer.py)."""
        if self.cfg.shard_optimizer:
            return ShardedOptimizer(optimizer, model, self.group,
                                    reduce_scatter=self.reduce_scatter)
        optimizer.init(model.trainable_parameters())
        return optimizer

    def make_step(self, model: nn.Module, compute: nn.Module) -> DataParallelStep:
        cfg = self.cfg
        self.objective.attach(compute, self.lora)  # its reference model, before compiling
        return DataParallelStep(
            self.group, global_batch=cfg.global_batch, grad_accum=cfg.grad_accum,
            grad_clip=cfg.grad_clip, compute=None if compute is model else compute,
            compute_dtype=dtype_of(cfg.dtype), comm_dtype=dtype_of(cfg.comm_dtype),
            compile=cfg.compile, random_state=self.lora and cfg.lora_dropout > 0,
            objective=self.objective)

    def counts(self, model: nn.Module) -> tuple[int, int]:
        """(the model's parameters, its trainable ones), a tied matrix counted once."""
        return count_parameters(model), lora.trainable_count(model)

    # ------------------------------------------------------------ checkpoints

    def saved_optimizer(self, optimizer):
        """What a checkpoint saves of `optimizer`: a sharded one's state gathered whole
        (by every rank: a collective)."""
        if isinstance(optimizer, ShardedOptimizer):
            return SimpleNamespace(state=optimizer.gathered_state())
        return optimizer

    def state(self) -> dict:
        return {}

    def mirror(self, saved: Path) -> None:
        """Nothing: every host holding the model writes its own copy."""

    def find(self, root: Path, only: int | None, layout_of) -> Path | None:
        """The checkpoint under `root` every rank loads (collective); `layout_of(root)`:
        which ranks see it."""
        cfg = self.cfg
        path, own_notes, notes = agree_on_checkpoint(self.group, layout_of(root), root, only,
                                                     cfg.keep_checkpoints, before=cfg.resume_before)
        say_notes(own_notes, notes, self.log)
        # none of its own, but a pipeline's pieces there: refused, not started over
        refuse_together(other_layout(root, "data-parallel") if path is None else None, self.group)
        return path

    def load(self, found: Path, model, optimizer, check) -> Loaded:
        return load_folder(found, model, optimizer, self.lora, check)

    def export(self, model, args, saved: Path, data_dir: Path) -> None:
        """OUT/model (or OUT/adapters) from checkpoint `saved` just written, whose
        model.safetensors holds the float32 master weights; one writer per --out."""
        cfg, out, first = self.cfg, Path(self.cfg.out), self.group.rank() == 0
        if not self.layout.writes:
            return
        if self.lora:  # OUT/adapters, for mlx-lm with the --init_from model (lora.py)
            note = export_adapters(mx.load(str(saved / "model.safetensors")), cfg,
                                   args.n_layers, out, kept=first)
        else:
            with said_when_full(out, "the exported model"):
                note = export_model(mx.load(str(saved / "model.safetensors")), args,
                                    out / "model", data_dir=data_dir, init_from=cfg.init_from,
                                    dtype=cfg.export_dtype, need_tokenizer=False)
        if first:
            self.log(note)

    # ------------------------------------------------------------ the log

    def announce(self, model) -> None:
        """Nothing: every rank holds the same whole model."""

    def describe(self, micro_batch: int) -> tuple[str, list[str]]:
        """(how the global batch is split, the log's lines of this parallelism)."""
        return f"{self.group.size()} ranks x {self.cfg.grad_accum} accum x {micro_batch}", []

    def mirrors(self) -> list[str]:
        return []  # no checkpoint is mirrored

    def sample(self, model: nn.Module, ids: list[int], tokens: int, key: mx.array) -> list[int]:
        """`tokens` token ids the trained model draws after `ids` (with `key`)."""
        model.eval()
        return generate(model, ids, tokens, key, block_size=self.cfg.block_size)

    def reduction(self) -> str:
        """How the gradients are averaged, for the log."""
        cfg = self.cfg
        if not cfg.shard_optimizer:
            return f"gradients all-reduced in {cfg.comm_dtype}"
        if self.reduce_scatter:
            return (f"gradients reduce-scattered in {cfg.comm_dtype} ({self.backend}), "
                    "optimizer state sharded")
        return (f"gradients all-reduced in {cfg.comm_dtype}, optimizer state sharded (each rank "
                f"keeps its share: {self.backend} has no sum_scatter)")
