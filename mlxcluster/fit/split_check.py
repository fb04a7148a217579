"""The split check as serve and ``doctor --model`` run it: the model folder
read, the installed mlx-lm asked about its family, each host judged
(``split.judge_split``). Below the doctor (its ``model-split`` check runs
it); serve asks the hosts for their facts itself (serving.py ``split_fits``).

    verdict = check_split("~/models/Llama-3-8B", ["studio", "mini"], facts, pipeline=False)
    if not verdict.ok:
        raise refusal(verdict)   # exit 2, before anything is sent or launched
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from mlxcluster.errors import InputError
from mlxcluster.facts.facts import HostFacts
from mlxcluster.fit.family import PIPELINE, TENSOR, family_support
from mlxcluster.fit.model_folder import read_model_folder
from mlxcluster.fit.split import SplitVerdict, judge_split


def check_split(model_dir: str | Path, placement: Sequence[str], facts: Mapping[str, HostFacts | None], *,
                pipeline: bool = False) -> SplitVerdict:
    """The verdict on serving the model in ``model_dir`` over ranks on
    ``placement`` (each rank's host name, rank order), each host judged on
    its ``facts``. InputError (exit 2) when the folder is no model mlx-lm
    loads; a model that cannot be split or does not fit is a verdict that
    is not ``ok``, not an exception."""
    model = read_model_folder(model_dir)
    mode = PIPELINE if pipeline else TENSOR
    family = family_support(model.path, model.model_type, len(placement), mode)
    return judge_split(model, family, placement, facts, mode)


def refusal(verdict: SplitVerdict) -> InputError:
    """The InputError (exit 2) that refuses a launch: the verdict, numbers and
    all, and the ways out as its hint."""
    hint = "; ".join(verdict.ways_out) or "a model that fits, or more hosts"
    body = "\n".join(line for line in verdict.message().splitlines() if not line.startswith("  way out: "))
    return InputError(body, "ways out: " + hint)
