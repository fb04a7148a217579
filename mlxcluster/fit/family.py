"""What the installed mlx-lm can do with a model folder: whether its family
has ``shard()`` (tensor parallelism) and ``pipeline()`` (``--pipeline``), and
whether mlx-lm's own split of it over N ranks goes through.

Asked of the mlx-lm importable here (the python running mlxcluster), the way
``mlx_lm.server`` loads a model on every rank (``sharded_load``): the model
built lazily from the folder by ``load_model(path, lazy=True, strict=False)``
(config.json's family after mlx-lm's own remapping, quantized as its weights
are; no weight is read), then ``model.shard(group)`` or
``model.model.pipeline(group)`` on a stand-in group of N ranks. Lazy arrays
know their shapes, so an uneven split fails here as it would on every rank
("Cannot shard the output of size 14336 across 3 devices"). The hosts run
their own mlx-lm; serve's preflight makes it one version everywhere, and the
verdict says when it is not this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

TENSOR = "tensor"
PIPELINE = "pipeline"


@dataclass(frozen=True)
class FamilySupport:
    """One model family in one mlx-lm. ``tensor`` / ``pipeline`` are None
    when not known (``unknown`` says why: no mlx-lm here, a family it does
    not build)."""

    model_type: str
    mlx_lm_version: str | None = None
    module: str | None = None  # "mlx_lm.models.llama" (mistral is remapped to it)
    tensor: bool | None = None
    pipeline: bool | None = None
    # What mlx-lm's own split raised for the rank count asked (None: it went through or was not tried).
    split_error: str | None = None
    unknown: str | None = None


class StandInGroup:
    """What ``shard()`` and ``pipeline()`` ask of a distributed group while
    splitting: its size and this rank. Nothing is communicated."""

    def __init__(self, size: int, rank: int = 0):
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def family_support(folder: Path, model_type: str, ranks: int, mode: str) -> FamilySupport:
    """The family of the model in ``folder`` in the installed mlx-lm, and
    mlx-lm's own split of it over ``ranks`` in ``mode`` (TENSOR or PIPELINE)
    tried. Never raises: what could not be judged is in ``unknown``."""
    try:
        import mlx_lm.utils as mu
    except Exception as exc:  # any import failure means: not judged here
        return FamilySupport(model_type, unknown=f"mlx-lm does not import here ({type(exc).__name__}: {exc})")
    version = _version()
    try:
        model, _ = mu.load_model(Path(folder), lazy=True, strict=False)
    except Exception as exc:  # unknown family, custom code, a config it cannot build
        return FamilySupport(model_type, version, unknown=f"mlx-lm {version} cannot build it: {exc}")
    inner = getattr(model, "model", None)
    tensor, pipeline = hasattr(model, "shard"), inner is not None and hasattr(inner, "pipeline")
    error = None
    if ranks > 1 and (tensor if mode == TENSOR else pipeline):
        try:
            if mode == TENSOR:
                model.shard(StandInGroup(ranks))
            else:
                inner.pipeline(StandInGroup(ranks))
        except Exception as exc:  # what every rank would raise at load
            error = f"{type(exc).__name__}: {exc}"
    return FamilySupport(model_type, version, type(model).__module__, tensor, pipeline, error)


def _version() -> str | None:
    try:
        return metadata.version("mlx-lm")
    except metadata.PackageNotFoundError:
        return None
