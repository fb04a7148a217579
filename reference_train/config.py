"""A run's settings: `TrainConfig`, from defaults, a YAML file and `--field value` flags.

`build_config(argv)` is the trainer's command line: defaults, then the --config
file (configs/NAME.yaml or a path), then the flags, every value converted to its
field's type and checked (ranges, the dtypes, a model shape that divides), so a
mistake is one ValueError naming the field before anything starts.
`mlxcluster train` calls it too, on its own machine, before it launches any
rank: the same code the ranks run. Nothing it imports imports mlx (tests/test_layers.py
checks): `mlxcluster train` parses the trainer's arguments without loading MLX.
"""

from __future__ import annotations

import argparse
import difflib
import math
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from . import fine_tune, stages
from .choices import DPO_LOSSES, DTYPES, EXPORT_DTYPES, KERNELS, OBJECTIVES
from .errors import DataError
from .shape import ModelArgs

CONFIG_DIR = Path(__file__).parent / "configs"
# What `python -m reference_train.train --help` shows: the command and the first
# line of train.py's docstring.
PROG = "python -m reference_train.train"
ABOUT = "Sharded data-parallel Llama training with MLX: the same script on 1 process or N hosts."


@dataclass
class TrainConfig:
    """Every setting of a run; YAML configs and `--field value` flags set these."""

    # data
    data: str = ""  # token directory from reference_train.prepare; "" = bundled offline corpus
    block_size: int = 128  # tokens per training sequence
    # model (vocab_size comes from the data's meta.json)
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 0  # 0 = n_heads; fewer = grouped-query attention
    hidden_dim: int = 512
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    # a Hugging Face / mlx-lm Llama folder to start from: its config.json sets the model
    # (the shape fields above are then not used) and its weights the initial ones
    init_from: str = ""
    # fine-tuning (fine_tune.py, lora.py; the defaults are mlx-lm's): full = every weight
    # trains; lora = adapters on the frozen --init_from model, written to OUT/adapters;
    # dora = the same adapters and a magnitude vector per adapted layer (mlx-lm's DoRA)
    fine_tune: str = "full"
    lora_rank: int = 8
    lora_scale: float = 20.0  # multiplies the low-rank update as is (mlx-lm's scale, not alpha)
    lora_dropout: float = 0.0
    lora_layers: int = 16  # the last N blocks get adapters; -1 = all
    lora_keys: str = ""  # comma-separated mlx-lm names (self_attn.q_proj,...); "" = every linear
    # what a run minimises (objectives.py): sft = next-token cross-entropy; dpo and orpo
    # = preference pairs (prepare's prompt/chosen/rejected rows), as mlx-lm-lora computes them
    objective: str = "sft"
    beta: float = 0.1  # DPO's temperature, ORPO's weight of the odds ratio (mlx-lm-lora's --beta)
    dpo_loss: str = "sigmoid"  # sigmoid, hinge, ipo or dpop (mlx-lm-lora's --dpo-loss-type)
    dpo_delta: float = 50.0  # dpop's penalty weight (mlx-lm-lora's --delta)
    # pipeline parallelism (stages.py, pipeline.py): the model's blocks split over
    # --pipeline ranks (stages), each holding only its own; 1 = off (data-parallel)
    pipeline: int = 1
    pipeline_split: str = ""  # blocks per stage, "a,b,..." in order; "" = balanced by bytes
    micro_batches: int = 0  # per global batch; 0 = the fewest, at least --pipeline, that divide it
    pipeline_schedule: str = "1f1b"  # or gpipe (stages.schedule)
    # optimization
    steps: int = 100  # total optimizer steps (the learning-rate schedule spans these)
    stop_after: int = 0  # stop (with a checkpoint) after this step; 0 = run to `steps`
    global_batch: int = 16  # sequences per optimizer step, summed over ranks
    grad_accum: int = 1  # micro-batches per rank per step
    lr: float = 3e-4
    min_lr: float = 3e-5  # end of the cosine decay
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping
    dtype: str = "float32"  # compute: float32, or bfloat16 on float32 master weights (precision.py)
    comm_dtype: str = "float32"  # the gradient all-reduce: float32 or bfloat16 (half the bytes)
    shard_optimizer: bool = False  # ZeRO-1: AdamW state for 1/N of the parameters per rank
    seed: int = 0
    compile: bool = True
    # recompute each block in the backward pass instead of keeping its activations
    # (mx.checkpoint): less memory at long block sizes, about one more forward's time
    grad_checkpoint: bool = False
    # auto: silu built from multiply-adds on Linux's CPU, where MLX's exp is slow
    # (kernels.py), MLX's own elsewhere; mlx: MLX's own everywhere
    kernels: str = "auto"
    # output
    out: str = "runs/reference"
    log_every: int = 10
    eval_every: int = 50  # 0 = no validation
    eval_batches: int = 4  # global batches of validation per evaluation
    checkpoint_every: int = 0  # 0 = only at the end
    keep_checkpoints: int = 2  # newest checkpoints kept; 0 = all
    resume: str = ""  # "auto" = latest in --out if any, or a checkpoint path
    # With --resume: only checkpoints before this step (0: any). mlxcluster
    # train passes the first step its record lacks, so that a restart redoes
    # the steps whose records were lost with rank 0's host.
    resume_before: int = 0
    sample_tokens: int = 200  # text sampled at the end; 0 = none
    sample_prompt: str = "Once upon a time"
    export_dtype: str = "float32"  # OUT/model's weights: float32 (the master weights), bfloat16, float16
    progress: bool = True  # progress bar, only when stdout is a terminal


def parse_bool(text: str) -> bool:
    low = str(text).lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def field_types() -> dict[str, type]:
    """TrainConfig field name -> its Python type (annotations are strings here)."""
    types = {"int": int, "float": float, "str": str, "bool": bool}
    return {f.name: types[str(f.type)] for f in fields(TrainConfig)}


def coerce(name: str, value, kind: type):
    """A config value converted to its field's type, with the field named on failure."""
    try:
        if kind is bool:
            return value if isinstance(value, bool) else parse_bool(value)
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{value} is not a whole number")
        return kind(value)
    except (TypeError, ValueError) as e:
        if kind in (int, float) and ("literal" in str(e) or "could not convert" in str(e)):
            words = "a whole number" if kind is int else "a number"
            raise ValueError(f"--{name} {value}: not {words}") from None
        raise ValueError(f"{name}: {e}") from None


def load_config_file(name_or_path: str) -> dict:
    """A config by path or by name (configs/NAME.yaml), as a dict of TrainConfig fields.

    A file at that path wins over a bundled config of that name. A directory is
    never a config: it is refused, and when a bundled config has its name the
    error says how to ask for either. Every problem is a ValueError naming the file.
    """
    path = Path(name_or_path)
    bundled = CONFIG_DIR / f"{name_or_path}.yaml"
    if path.is_dir():
        if bundled.is_file():
            raise ValueError(
                f"--config {name_or_path} is ambiguous: {name_or_path} is a directory here and "
                f"also the name of a bundled config; for the bundled one pass --config {bundled}, "
                f"for one of your own pass the YAML file's path")
        raise ValueError(f"config {name_or_path} is a directory, not a YAML file")
    if not path.exists():
        path = bundled
    if not path.exists():
        names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise ValueError(f"no config {name_or_path!r}: not a file, and not one of {names}")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as e:
        raise ValueError(f"config {path} cannot be read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"config {path} is not UTF-8 text") from None
    except yaml.YAMLError as e:
        raise ValueError(f"config {path} is not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of field: value")
    not_names = [k for k in values if not isinstance(k, str)]
    if not_names:
        raise ValueError(f"{path}: field names must be text, got {not_names!r}")
    unknown = sorted(set(values) - set(field_types()))
    if unknown:
        meant = [f"{name} -> {close[0]}" for name in unknown
                 for close in [difflib.get_close_matches(name, sorted(field_types()), n=1)] if close]
        raise ValueError(f"{path}: unknown fields {unknown}"
                         + (f" (did you mean: {', '.join(meant)}?)" if meant else ""))
    return values


def yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's error in one line: what and where ('found unhashable key at line 1, column 2')."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


# Allowed values of the numeric fields: (lowest, highest (excluded), lowest included);
# None = no bound.
# Floats must also be finite (NaN passes every comparison and trained a NaN loss).
RANGES: dict[str, tuple[float | None, float | None, bool]] = {
    "block_size": (1, None, True), "dim": (1, None, True), "n_layers": (1, None, True),
    "n_heads": (1, None, True), "n_kv_heads": (0, None, True), "hidden_dim": (1, None, True),
    "rope_theta": (0, None, False), "steps": (1, None, True), "stop_after": (0, None, True),
    "global_batch": (1, None, True), "grad_accum": (1, None, True), "lr": (0, None, False),
    "min_lr": (0, None, True), "warmup_steps": (0, None, True), "weight_decay": (0, None, True),
    "beta1": (0, 1, True), "beta2": (0, 1, True), "grad_clip": (0, None, True),
    "seed": (0, 2**63, True), "log_every": (1, None, True), "eval_every": (0, None, True),
    "eval_batches": (1, None, True), "checkpoint_every": (0, None, True),
    "keep_checkpoints": (0, None, True), "sample_tokens": (0, None, True),
    "resume_before": (0, None, True), "lora_rank": (1, None, True),
    "lora_scale": (None, None, True), "lora_dropout": (0, 1, True), "lora_layers": (-1, None, True),
    "pipeline": (1, None, True), "micro_batches": (0, None, True),
    "beta": (0, None, False), "dpo_delta": (0, None, True),
}


def range_problem(name: str, value, low, high, low_included: bool) -> str | None:
    """Why ``value`` is not allowed for field ``name``, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name} {value}: must be a finite number"
    if low is not None and (value < low if low_included else value <= low):
        return f"{name} {value}: must be {'at least' if low_included else 'above'} {low}"
    if high is not None and value >= high:
        return f"{name} {value}: must be below {high}"
    return None


def check_config(cfg: TrainConfig) -> None:
    """ValueError naming every value out of range, and a model shape that does not
    divide (the checks the ranks would otherwise hit only after launch)."""
    problems = [p for name, bounds in RANGES.items()
                if (p := range_problem(name, getattr(cfg, name), *bounds))]
    for name in ("dtype", "comm_dtype"):
        if getattr(cfg, name) not in DTYPES:
            problems.append(f"{name} {getattr(cfg, name)}: must be one of {', '.join(DTYPES)}")
    if cfg.kernels not in KERNELS:
        problems.append(f"kernels {cfg.kernels}: must be one of {', '.join(KERNELS)}")
    if cfg.objective not in OBJECTIVES:
        problems.append(f"objective {cfg.objective}: must be one of {', '.join(OBJECTIVES)}")
    if cfg.dpo_loss not in DPO_LOSSES:
        problems.append(f"dpo_loss {cfg.dpo_loss}: must be one of {', '.join(DPO_LOSSES)}")
    if cfg.export_dtype not in EXPORT_DTYPES:
        problems.append(f"export_dtype {cfg.export_dtype}: must be one of {', '.join(EXPORT_DTYPES)}")
    problems += fine_tune.config_problems(cfg)
    problems += pipeline_problems(cfg)
    if problems:
        raise ValueError("; ".join(problems))
    model_args(cfg, vocab_size=2)  # ModelArgs checks dim / n_heads / n_kv_heads


def pipeline_problems(cfg: TrainConfig) -> list[str]:
    """What is wrong with a config's pipeline fields, as far as the config alone tells
    (the model's blocks and the world size are the trainer's checks: train.py)."""
    problems = []
    if cfg.pipeline_schedule not in stages.SCHEDULES:
        problems.append(f"pipeline_schedule {cfg.pipeline_schedule}: must be one of "
                        f"{', '.join(stages.SCHEDULES)}")
    if cfg.pipeline_split:
        try:
            split = stages.parse_split(cfg.pipeline_split)
        except DataError as e:
            problems.append(str(e))
        else:
            if len(split) != cfg.pipeline:
                problems.append(f"--pipeline_split {cfg.pipeline_split} names {len(split)} "
                                f"stages, but --pipeline is {cfg.pipeline} (give one number "
                                "of blocks per stage)")
    if cfg.pipeline > 1:
        if cfg.micro_batches and cfg.global_batch % cfg.micro_batches:
            problems.append(f"--micro_batches {cfg.micro_batches} does not divide global_batch "
                            f"{cfg.global_batch} (give a divisor of global_batch)")
        if cfg.grad_accum > 1:
            problems.append(f"grad_accum {cfg.grad_accum} with --pipeline {cfg.pipeline}: a "
                            "pipeline accumulates over its micro-batches (give --micro_batches "
                            "instead)")
        if cfg.shard_optimizer:
            problems.append(f"shard_optimizer with --pipeline {cfg.pipeline}: each stage keeps "
                            "the optimizer state of its own blocks only already (drop "
                            "--shard_optimizer)")
    elif cfg.pipeline_split or cfg.micro_batches:
        problems.append("--pipeline_split and --micro_batches split a pipeline: give "
                        "--pipeline N (2 or more stages) with them")
    return problems


# Every flag's --help: its group, then what it is (units, what 0 means); the
# default and the choices are added from TrainConfig and choices.py. A flag
# mlxcluster sets for itself is HIDDEN (tests/test_train_help.py: none without help).
HIDDEN = {"resume_before"}
FLAG_HELP: dict[str, tuple[str, str]] = {
    "data": ("data", "token folder from `python -m reference_train.prepare` ('': the bundled "
                     "offline corpus)"),
    "block_size": ("data", "tokens per training sequence"),
    "dim": ("model", "model width (ignored with --init_from)"),
    "n_layers": ("model", "transformer blocks (ignored with --init_from)"),
    "n_heads": ("model", "attention heads (ignored with --init_from)"),
    "n_kv_heads": ("model", "key/value heads; 0 = n_heads, fewer = grouped-query attention"),
    "hidden_dim": ("model", "feed-forward width (ignored with --init_from)"),
    "tie_embeddings": ("model", "the output head shares the embedding's weights (true/false)"),
    "rope_theta": ("model", "RoPE base frequency"),
    "init_from": ("model", "a Hugging Face / mlx-lm Llama folder to start from: its config.json "
                           "sets the model, its weights the start"),
    "fine_tune": ("fine-tuning", "full: every weight trains; lora: adapters on the frozen "
                                 "--init_from model (QLoRA on a quantized one); dora: LoRA and a "
                                 "magnitude per adapted layer"),
    "lora_rank": ("fine-tuning", "rank of each adapter"),
    "lora_scale": ("fine-tuning", "multiplies the low-rank update (mlx-lm's scale, not alpha)"),
    "lora_dropout": ("fine-tuning", "dropout on the adapters' input, 0 to 1"),
    "lora_layers": ("fine-tuning", "the last N blocks get adapters; -1 = all"),
    "lora_keys": ("fine-tuning", "comma-separated mlx-lm layer names (self_attn.q_proj,...); "
                                 "'' = every linear layer"),
    "objective": ("objective", "sft: next-token cross-entropy; dpo, orpo: preference pairs "
                               "(prompt/chosen/rejected rows), as mlx-lm-lora computes them"),
    "beta": ("objective", "dpo: the temperature of the log-probability ratios; orpo: the weight "
                          "of the odds-ratio term"),
    "dpo_loss": ("objective", "dpo's loss of the preference logit (mlx-lm-lora's loss types)"),
    "dpo_delta": ("objective", "dpo_loss dpop: the weight of its penalty"),
    "pipeline": ("parallelism", "ranks per pipeline: the model's blocks split over them, each "
                                "holding its own; 1 = off (data-parallel)"),
    "pipeline_split": ("parallelism", "blocks per stage, 'a,b,...' in order; '' = balanced by "
                                      "bytes"),
    "micro_batches": ("parallelism", "micro-batches per global batch through the pipeline; 0 = "
                                     "the fewest, at least --pipeline, that divide it"),
    "pipeline_schedule": ("parallelism", "the order of the micro-batches' passes"),
    "shard_optimizer": ("parallelism", "ZeRO-1: each rank keeps AdamW's state for 1/N of the "
                                       "parameters (true/false)"),
    "comm_dtype": ("parallelism", "the gradient all-reduce's type (bfloat16: half the bytes)"),
    "steps": ("optimization", "optimizer steps in all (the learning-rate schedule spans them)"),
    "stop_after": ("optimization", "stop with a checkpoint after this step; 0 = run to --steps"),
    "global_batch": ("optimization", "sequences per optimizer step, summed over every rank"),
    "grad_accum": ("optimization", "micro-batches per rank per step"),
    "lr": ("optimization", "peak learning rate"),
    "min_lr": ("optimization", "learning rate at the end of the cosine decay"),
    "warmup_steps": ("optimization", "steps of linear warm-up"),
    "weight_decay": ("optimization", "AdamW's decoupled weight decay"),
    "beta1": ("optimization", "AdamW's beta1"),
    "beta2": ("optimization", "AdamW's beta2"),
    "grad_clip": ("optimization", "largest global gradient norm; 0 = no clipping"),
    "dtype": ("optimization", "compute type (bfloat16: on float32 master weights)"),
    "seed": ("optimization", "random seed (weights, data order, dropout)"),
    "compile": ("optimization", "compile the step with mx.compile (true/false)"),
    "grad_checkpoint": ("optimization", "recompute each block in the backward pass: less memory, "
                                        "about one more forward's time (true/false)"),
    "kernels": ("optimization", "auto: silu from multiply-adds on Linux's CPU, MLX's own "
                                "elsewhere; mlx: MLX's own everywhere"),
    "out": ("checkpoints", "the run's folder: checkpoints, metrics.jsonl, the exported model"),
    "checkpoint_every": ("checkpoints", "steps between checkpoints; 0 = only at the end"),
    "keep_checkpoints": ("checkpoints", "newest checkpoints kept; 0 = all"),
    "resume": ("checkpoints", "auto (also --resume alone): the newest checkpoint in --out, if "
                              "any; or a checkpoint's path"),
    "export_dtype": ("checkpoints", "OUT/model's weights"),
    "log_every": ("logging", "steps between logged losses"),
    "eval_every": ("logging", "steps between validations; 0 = none"),
    "eval_batches": ("logging", "global batches of validation data per evaluation"),
    "sample_tokens": ("logging", "tokens of text sampled at the end; 0 = none"),
    "sample_prompt": ("logging", "the sample's prompt"),
    "progress": ("logging", "a progress bar, when stdout is a terminal (true/false)"),
}
GROUPS = ("data", "model", "fine-tuning", "objective", "parallelism", "optimization", "checkpoints", "logging")
FLAG_CHOICES = {"fine_tune": fine_tune.FINE_TUNES, "pipeline_schedule": stages.SCHEDULES,
                "dtype": DTYPES, "comm_dtype": DTYPES, "kernels": KERNELS,
                "export_dtype": EXPORT_DTYPES, "objective": OBJECTIVES, "dpo_loss": DPO_LOSSES}


def flag_help(name: str) -> str:
    """A flag's --help line: what it is, its choices and its default."""
    _, text = FLAG_HELP[name]
    default = next(f.default for f in fields(TrainConfig) if f.name == name)
    choices = f"; one of {', '.join(FLAG_CHOICES[name])}" if name in FLAG_CHOICES else ""
    return f"{text}{choices} (default: {default!r})".replace("%", "%%")


def build_config(argv: list[str]) -> TrainConfig:
    """Defaults, then the --config file, then `--field value` flags."""
    parser = argparse.ArgumentParser(prog=PROG, description=ABOUT)
    parser.add_argument("--config", default=None,
                        help="tiny, demo, blog (configs/NAME.yaml) or a YAML path; its values "
                             "first, then the flags")
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    types = field_types()
    for name, kind in types.items():
        if name in HIDDEN:
            parser.add_argument(f"--{name}", default=None, help=argparse.SUPPRESS)
            continue
        group = groups[FLAG_HELP[name][0]]
        if name == "resume":  # `--resume` alone means auto, as the docs and messages teach it
            group.add_argument("--resume", nargs="?", const="auto", default=None,
                               metavar="auto|PATH", help=flag_help(name))
            continue
        group.add_argument(f"--{name}", default=None, metavar=kind.__name__.upper(),
                           help=flag_help(name))
    args = parser.parse_args(argv)
    values = load_config_file(args.config) if args.config else {}
    values.update({k: v for k, v in vars(args).items() if k in types and v is not None})
    for listed in ("lora_keys", "pipeline_split"):  # YAML may list them
        if isinstance(values.get(listed), list):
            values[listed] = ",".join(str(k) for k in values[listed])
    cfg = TrainConfig(**{k: coerce(k, v, types[k]) for k, v in values.items()})
    check_config(cfg)
    return cfg


def model_args(cfg: TrainConfig, vocab_size: int) -> ModelArgs:
    """The model a run builds from scratch: the config's shape, the data's vocabulary."""
    return ModelArgs(vocab_size=vocab_size, dim=cfg.dim, n_layers=cfg.n_layers,
                     n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads or None,
                     hidden_dim=cfg.hidden_dim, rope_theta=cfg.rope_theta,
                     tie_embeddings=cfg.tie_embeddings)
