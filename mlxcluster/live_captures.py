"""Live captures for commands that accept ``-i INVENTORY``: delegated to the
doctor's collector (``mlxcluster.doctor_collect.collect_captures``), a
separate module; without it, a clear error pointing at ``--from DIR``."""

from __future__ import annotations

import importlib
import importlib.util

from mlxcluster.capture import HostCapture
from mlxcluster.errors import MlxclusterError


def live_available() -> bool:
    """Whether the doctor's live collector is installed."""
    try:
        return importlib.util.find_spec("mlxcluster.doctor_collect") is not None
    except (ImportError, ValueError):
        return False


def collect_live(inventory) -> dict[str, HostCapture]:
    """Probe every inventory host and return its captures."""
    try:
        collector = importlib.import_module("mlxcluster.doctor_collect")
    except ImportError as exc:
        raise MlxclusterError(
            "live topology needs the doctor module (mlxcluster.doctor_collect is not available)",
            "collect the outputs with 'mlxcluster doctor --collect DIR' and pass --from DIR",
        ) from exc
    return collector.collect_captures(inventory)
