"""A checkpoint as a model folder mlx-lm opens: `python -m reference_train.export CKPT DIR`.

    python -m reference_train.export runs/demo DIR             # the run's latest checkpoint
    python -m reference_train.export runs/demo/checkpoints/step_000100 DIR --export_dtype bfloat16
    mlx_lm.generate --model DIR --prompt "Once upon a time"

DIR gets config.json (of the model's family: llama, mistral, qwen2 or qwen3),
model.safetensors (+ model.safetensors.index.json), in mlx-lm's layout and
names (reference_train/hf_io.py), and the tokenizer files:
those kept with the run's data (prepare --tokenizer DIR), else the --init_from
folder's, else a tokenizer.json equal to the byte tokenizer. The weights are the
float32 master weights unless --export_dtype asks for another: a bfloat16 copy
is half the size but its logits differ (2.0e-2 at most, measured on the tests'
tiny Llama, logits up to 4.5), so it is never made silently.
A run writes OUT/model this way at its end (train.py). Exit codes: 0 written,
2 bad input (no checkpoint there, a damaged one, no tokenizer found).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

from .checkpoint import checkpoint_problem, resolve_checkpoint
from .choices import EXPORT_DTYPES
from .data import load_meta
from .disk_room import said_when_full
from .errors import DataError
from .fine_tune import NAMES, adapter_config, trains_adapters
from .hf_io import (
    export_folder,
    exported_weights,
    read_config,
    tokenizer_source,
    write_frame,
    write_index,
)
from .lora import write_adapters
from .metrics import emit_folder, recording
from .prepare import default_data_dir
from .shape import ModelArgs
from .tokenizer import byte_tokenizer_json


def export_model(weights: dict[str, mx.array], args: ModelArgs, out: str | Path, *,
                 data_dir: Path | None, init_from: str = "", dtype: str = "float32",
                 tokenizer_dir: str | Path | None = None, need_tokenizer: bool = True) -> str:
    """Write the mlx-lm folder `out` for these weights (our names); return what was
    written, in one line for the log. Without tokenizer files to copy, a DataError,
    or (need_tokenizer False: the end of a run must not fail for it) a folder
    without them and the note says how to complete it."""
    frame = Frame.find(out, data_dir, init_from, tokenizer_dir, need_tokenizer)
    export_folder(weights, args, out, frame.source, dtype, frame.base, frame.byte_json)
    size = (Path(out) / "model.safetensors").stat().st_size / 2**20
    return frame.note(out, dtype, size)


class Frame:
    """What an exported folder holds around its weights: config.json's fields from
    the --init_from folder and the data, and where the tokenizer files come from."""

    def __init__(self, base: dict, source: Path | None, byte_json: dict | None, meta: dict):
        self.base, self.source, self.byte_json, self.meta = base, source, byte_json, meta

    @classmethod
    def find(cls, out: str | Path, data_dir: Path | None, init_from: str,
             tokenizer_dir: str | Path | None, need_tokenizer: bool) -> Frame:
        meta = {}
        if data_dir is not None:
            try:
                meta = load_meta(data_dir)
            except DataError:
                meta = {}
        base = read_config(Path(init_from)) if init_from and Path(init_from).is_dir() else {}
        if "eos_token_id" not in base and "eos_id" in meta:
            base = {**base, "eos_token_id": meta["eos_id"]}
        source = Path(tokenizer_dir) if tokenizer_dir else tokenizer_source(data_dir, init_from)
        byte_json = None
        if source is None:
            kind = (meta.get("tokenizer") or {}).get("kind")
            if kind == "byte":
                byte_json = byte_tokenizer_json()
            elif need_tokenizer:
                raise DataError(f"no tokenizer files found for {out} (data {data_dir}: tokenizer "
                                f"{meta.get('tokenizer', 'unknown')})",
                                "pass --tokenizer DIR, a folder holding the tokenizer.json the "
                                "data was prepared with")
        return cls(base, source, byte_json, meta)

    def note(self, out: str | Path, dtype: str, size_mib: float) -> str:
        """What was written, in one line for the log."""
        if dtype == "float32":
            kind = "the float32 master weights"
        else:
            kind = (f"a {dtype} copy of the float32 master weights, as --export_dtype asks "
                    f"(its logits differ from the float32 model's: by 2e-2 on a tiny Llama)")
        if self.byte_json is not None:
            tok = "byte tokenizer"
        elif self.source is not None:
            tok = f"tokenizer from {self.source}"
        else:
            tok = (f"NO tokenizer files: the data's tokenizer {self.meta.get('tokenizer')} left "
                   f"none; copy its tokenizer.json and tokenizer_config.json into {out}")
        return f"model for mlx-lm: {out} ({kind}, {size_mib:.1f} MiB; {tok})"


# ---------------------------------------------------------------- a pipeline's model, in shards

SHARD = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors$")


def export_adapters(adapters: dict[str, mx.array], cfg, n_layers: int, out: Path,
                    kept: bool) -> str:
    """OUT/adapters, mlx-lm's folder of `adapters` (lora.write_adapters), and the log's
    line naming it; `kept`: mlxcluster keeps a copy where it runs (rank 0 says so)."""
    with said_when_full(out, "the adapters"):
        folder = write_adapters(adapters, adapter_config(cfg, n_layers), out / "adapters")
    if kept and recording():
        emit_folder(folder, "adapters")
    return (f"adapters for mlx-lm: {folder} (mlx_lm.generate --model {cfg.init_from} "
            f"--adapter-path {folder})")


def shard_name(index: int, count: int) -> str:
    """mlx-lm's name of shard `index` (0-based) of `count`: model-00001-of-00002.safetensors."""
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def export_shard(weights: dict[str, mx.array], out: str | Path, index: int, count: int,
                 dtype: str = "float32") -> dict[str, list[int]]:
    """One pipeline stage's tensors (our names) as shard `index` of `count` in the
    model folder `out` (a temporary file renamed); weight files and an index of another
    export there are removed first. Returns {mlx-lm name: [bytes, elements]} for the
    index (export_index). Every stage of a pipeline calls it, then rank 0 export_index."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("model*.safetensors*"):
        m = SHARD.match(stale.name)
        if m is None or int(m.group(2)) != count or int(m.group(1)) > count:
            stale.unlink(missing_ok=True)
    cast = exported_weights(weights, dtype, None, out)
    final = out / shard_name(index, count)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".safetensors", dir=out)
    os.close(fd)
    try:
        mx.save_safetensors(tmp, cast, metadata={"format": "mlx"})
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {name: [v.nbytes, v.size] for name, v in cast.items()}


def export_index(shards: list[dict[str, list[int]]], args: ModelArgs, out: str | Path, *,
                 data_dir: Path | None, init_from: str = "", dtype: str = "float32",
                 need_tokenizer: bool = False) -> str:
    """The rest of a pipeline's model folder `out` (rank 0): config.json, the tokenizer
    files and model.safetensors.index.json naming every stage's shard (`shards[k]`:
    what export_shard of stage k returned). Returns the line for the log."""
    out = Path(out)
    frame = Frame.find(out, data_dir, init_from, None, need_tokenizer)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.frame.", dir=out))
    try:
        count = len(shards)
        write_index(tmp, {name: shard_name(k, count) for k, shard in enumerate(shards)
                          for name in shard},
                    sum(b for shard in shards for b, _ in shard.values()),
                    sum(n for shard in shards for _, n in shard.values()))
        write_frame(tmp, args, dtype, frame.base, None, frame.source, frame.byte_json)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(b for shard in shards for b, _ in shard.values()) / 2**20
    return (frame.note(out, dtype, size)
            + f" in {len(shards)} shards, {shard_name(0, len(shards))} onwards: each stage's "
              "written on its own host")


def export_checkpoint(checkpoint: str | Path, out: str | Path, dtype: str = "float32",
                      tokenizer_dir: str | Path | None = None) -> str:
    """Export a format-2 (or 1) checkpoint, found as reference_train finds one to resume."""
    path = resolve_checkpoint(checkpoint)
    if path is None:
        raise DataError(f"no checkpoint at {checkpoint}",
                        "give a checkpoints/step_NNNNNN directory or the run's --out")
    problem = checkpoint_problem(path)
    if problem:
        raise DataError(f"checkpoint {path} is damaged: {problem}",
                        "export an older checkpoint of the run (checkpoints/step_NNNNNN)")
    state = json.loads((path / "state.json").read_text())
    try:
        args = ModelArgs(**state["model_args"])
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{path}/state.json: model_args unreadable ({e})") from None
    config = state.get("config") or {}
    tuned = config.get("fine_tune", "full")
    if trains_adapters(tuned):  # model.safetensors: the adapters (lora.py)
        raise DataError(f"checkpoint {path} holds {NAMES[tuned]} adapters, not a whole model",
                        "its run wrote them for mlx-lm to OUT/adapters; a whole model: "
                        f"mlx_lm.fuse --model {config.get('init_from') or 'MODEL_DIR'} "
                        "--adapter-path OUT/adapters")
    data = config.get("data") or ""
    data_dir = Path(data) if data else default_data_dir()
    weights = mx.load(str(path / "model.safetensors"))
    return export_model(weights, args, out, data_dir=data_dir,
                        init_from=config.get("init_from", ""), dtype=dtype,
                        tokenizer_dir=tokenizer_dir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reference_train.export",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a checkpoints/step_NNNNNN directory, or a run's --out")
    p.add_argument("out", help="folder to write (replaced whole when it exists)")
    p.add_argument("--export_dtype", default="float32", choices=EXPORT_DTYPES,
                   help="dtype of the exported weights (default: the float32 master weights)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="take the tokenizer files from DIR instead of the run's data")
    args = p.parse_args(argv)
    try:
        print(export_checkpoint(args.checkpoint, args.out, args.export_dtype, args.tokenizer))
    except (DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
