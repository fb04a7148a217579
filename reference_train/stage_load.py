"""Each pipeline rank builds its own stage only: from a model folder, only its tensors read.

    plans = plan_stages(folder_bytes(DIR), N, split)     (stages.py: no tensor loaded)
    stage = load_stage(DIR, plans[rank], fine_tune="lora", adapt=...)
    stage = new_stage(model_args, plans[rank])           (a model from scratch)

How: every rank builds the whole model's skeleton, `Llama(args)`, lazily: MLX
computes an array only when it is evaluated, so the random initial weights of
the blocks another stage holds are drawn but never computed and take no memory.
The rank takes its stage's modules out of the skeleton (pipeline.Stage) and
fills them from the folder: the safetensors index says which file holds each
tensor, and `mx.load` of a file is lazy too (a tensor is read from disk when
evaluated), so only the stage's tensors are read. Building the whole skeleton
keeps mlx's random state where one process's is (the same draws in the same
order), so LoRA's adapters, drawn after it, are one process's adapters on every
stage: `adapt` (lora.apply_config, or another fine-tuning's) is applied to the
whole skeleton, whose blocks this stage holds being the stage's own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from .errors import DataError
from .hf_io import (
    check_data_fits,
    check_fine_tune,
    indexed_names,
    load_folder,
    load_into,
    quantization_of,
    quantize_like,
    read_config,
)
from .model import Llama, ModelArgs
from .pipeline import Stage
from .stages import ModelBytes, StagePlan, stage_tensor


def model_bytes(args: ModelArgs) -> ModelBytes:
    """The bytes of a model built from scratch (float32), from a lazy skeleton's shapes."""
    model = Llama(args)

    def size(module) -> int:
        return sum(v.nbytes for _, v in tree_flatten(module.parameters()))

    head = size(model.norm) + (0 if args.tie_embeddings else size(model.output))
    return ModelBytes(size(model.tok_embeddings), tuple(size(b) for b in model.layers), head,
                      args.tie_embeddings)


def held_bytes(stage: Stage) -> int:
    """The bytes of the weights (and adapters) a stage holds."""
    return sum(v.nbytes for _, v in tree_flatten(stage.parameters()))


def shaped_stage(args: ModelArgs, plan: StagePlan,
                 quantize: Callable[[Llama], None] | None = None,
                 fill: Callable[[Stage], None] | None = None,
                 adapt: Callable[[Llama], object] | None = None) -> Stage:
    """A stage taken from a lazy skeleton of the whole model. `quantize` turns the
    skeleton's layers into quantized ones (the whole skeleton, as one process quantizes
    its model: each quantized layer draws a random weight first, so the draws stay
    one process's), `fill` puts the stage's weights in (before any adapter), `adapt`
    (lora.apply_config...) is applied to the skeleton, the stage frozen first.
    Nothing is evaluated."""
    skeleton = Llama(args)
    if quantize is not None:
        quantize(skeleton)
    stage = Stage(skeleton, plan)
    if fill is not None:
        fill(stage)
    if adapt is not None:
        stage.freeze()  # the skeleton's modules are the stage's; apply_lora freezes them again
        adapt(skeleton)
    return stage


def new_stage(args: ModelArgs, plan: StagePlan) -> Stage:
    """A stage of a model built from scratch from mlx's random state (seed it first, as
    one process does): the same initial weights as one process's, its own evaluated."""
    stage = shaped_stage(args, plan)
    mx.eval(stage.parameters())
    return stage


def stage_names(plan: StagePlan, args: ModelArgs) -> Callable[[str], bool]:
    """Whether a parameter (our name) is one the stage holds."""
    prefixes = [f"layers.{i}." for i in plan.blocks]
    if plan.embedding:
        prefixes.append("tok_embeddings.")
    if plan.head:
        prefixes += ["norm."] + ([] if args.tie_embeddings else ["output."])
    return lambda name: name.startswith(tuple(prefixes))


def load_stage(folder: str | Path, plan: StagePlan, fine_tune: str = "full",
               adapt: Callable[[Llama], object] | None = None, meta: dict | None = None,
               data_dir: Path | None = None) -> Stage:
    """--init_from DIR for one stage: its modules, quantized as the folder's are, holding
    only its tensors from the folder; `adapt` (lora.apply_config...) adds the adapters
    one process would draw. `meta` / `data_dir`: the data, checked against the folder's
    tokenizer and vocabulary as one process checks it. Seed mlx's random state first.

    The folder's files are opened lazily (hf_io.load_folder: mx.load reads a file's
    header, and a tensor's bytes only when it is evaluated): the other stages'
    tensors are never read, their arrays never evaluated. Only the files holding the
    stage's tensors are opened (stages.stage_tensor, by the index): a pipeline host's
    copy of the folder holds no others (mlxcluster train sends it no more)."""
    check_fine_tune(folder, read_config(folder), fine_tune)
    args, lazy, config = load_folder(folder, lambda name: stage_tensor(name, plan))
    if meta is not None:
        check_data_fits(meta, data_dir, args, Path(folder))
    if plan.blocks.stop > args.n_layers:
        raise DataError(f"stage {plan.index + 1} of {plan.count} holds blocks up to "
                        f"{plan.blocks.stop - 1}, but {folder} has {args.n_layers}",
                        "plan the stages from this folder (stages.folder_bytes)")
    holds = stage_names(plan, args)
    quantized = quantization_of(config) is not None
    stage = shaped_stage(
        args, plan,
        quantize=(lambda skeleton: quantize_like(skeleton, config, lazy, indexed_names(Path(folder))))
        if quantized else None,
        fill=lambda stage: load_into(stage, {k: v for k, v in lazy.items() if holds(k)}, folder),
        adapt=adapt)
    mx.eval(stage.parameters())
    return stage
