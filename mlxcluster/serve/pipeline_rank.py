"""mlx-lm's own server on one rank, running serve's split by memory.

mlx_lm.server has no flag for the split: its ``sharded_load`` calls
``model.model.pipeline(group)``, mlx-lm's even split. When serve placed the
layers by each host's memory (fit/split.py ``place_by_memory``) every rank
runs this module instead of ``-m mlx_lm server``, with the same arguments
and the split in ``MLXCLUSTER_PIPELINE_SPLIT`` (each rank's layer count,
rank 0 first: mlx-lm's order, rank 0 the last layers)::

    MLXCLUSTER_PIPELINE_SPLIT=10,20 python -m mlxcluster.serve.pipeline_rank --model DIR --pipeline ...

Why this way, the least that could break: the one thing changed is the
default of the argument mlx-lm itself offers for the split
(``PipelineMixin.pipeline(group, split=None)``, mlx-lm #1816), on the class,
so every family with ``pipeline()`` and both of sharded_load's calls (the
one choosing the files, the one loading) take it; the server, its flags,
its loading are mlx-lm's, unchanged, and an explicit split passed by mlx-lm
wins. A sitecustomize would reach every python the ranks start, unseen; a
copy of sharded_load or of the server would fork mlx-lm's code. An mlx-lm
whose ``pipeline()`` takes no split is refused (exit 2) rather than run with
the even split while serve said otherwise.

Each rank says what it loaded, once the weights are in memory (a line on
stderr, in its log): its layers and their bytes, measured on the loaded model::

    pipeline rank 1 of 2: layers 0-9 of 30, 1234567 bytes of weights loaded

Runs on the ranks: standard library and mlx-lm only (sent to the hosts with
the rank wrapper, launch/code.py).
"""

from __future__ import annotations

import inspect
import os
import sys

SPLIT_ENV = "MLXCLUSTER_PIPELINE_SPLIT"


def parse_split(text: str) -> list[int]:
    """'10,20' -> [10, 20]; ValueError for anything else."""
    split = [int(part) for part in text.split(",")]
    if not split or any(n < 1 for n in split):
        raise ValueError(f"{SPLIT_ENV}={text!r}: each rank's layer count, at least 1, comma separated")
    return split


def install(split: list[int]) -> None:
    """``PipelineMixin.pipeline`` with ``split`` as its default, and mlx-lm's
    server's ``sharded_load`` saying what this rank loaded."""
    from mlx_lm import server
    from mlx_lm.models import pipeline as mixin

    original = mixin.PipelineMixin.pipeline
    if "split" not in inspect.signature(original).parameters:
        raise RuntimeError("this mlx-lm's PipelineMixin.pipeline() takes no split (added by mlx-lm "
                           "#1816): install a newer mlx-lm on every host, or serve over hosts alike")

    def pipeline(self, group, split_=None, **kw):
        return original(self, group, split if split_ is None else split_, **kw)

    mixin.PipelineMixin.pipeline = pipeline
    load = server.sharded_load

    def sharded_load(*args, **kw):
        loaded = load(*args, **kw)
        say_loaded(loaded[0])
        return loaded

    server.sharded_load = sharded_load


def say_loaded(model) -> None:
    from mlx.utils import tree_flatten

    inner = model.model  # after pipeline(): its layers start_idx..end_idx-1, the others None
    held = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    sys.stderr.write(f"pipeline rank {inner.pipeline_rank} of {inner.pipeline_size}: layers "
                     f"{inner.start_idx}-{inner.end_idx - 1} of {NUM_LAYERS[0]}, {held} bytes of "
                     "weights loaded\n")
    sys.stderr.flush()


NUM_LAYERS = [0]  # the model's layers, read from the split


def main() -> int:
    text = os.environ.get(SPLIT_ENV, "")
    try:
        split = parse_split(text)
    except ValueError as err:
        sys.stderr.write(f"mlxcluster.serve.pipeline_rank: {err}\n")
        return 2
    NUM_LAYERS[0] = sum(split)
    try:
        install(split)
    except RuntimeError as err:
        sys.stderr.write(f"mlxcluster.serve.pipeline_rank: {err}\n")
        return 2
    from mlx_lm import server

    sys.argv = ["mlx_lm.server", *sys.argv[1:]]
    server.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
