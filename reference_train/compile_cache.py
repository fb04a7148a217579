"""Whether MLX will compile its CPU kernels before the first step, so the log can say why
the first step is slow.

On the CPU, MLX builds every fused graph (``mx.compile``, and our multiply-add kernels) with
the system's C++ compiler the first time it meets it, and keeps the shared object in
``$TMPDIR/mlx/<version>/cpu`` (mlx/backend/cpu/compiled.cpp: ``temp_directory_path()``).
A host whose folder is empty (first run of this mlx, or /tmp cleared at boot) spends tens
of seconds compiling: measured here for a tiny QLoRA run, 69 s cold against 2.6 s warm
(54 kernels). A Mac's GPU compiles Metal kernels instead, in well under a second.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import mlx.core as mx


def cache_folder() -> Path:
    """Where this process's MLX keeps its compiled CPU kernels."""
    return Path(tempfile.gettempdir()) / "mlx" / mx.__version__ / "cpu"


def compiles_cold(compiling: bool, device: mx.Device | None = None,
                  folder: Path | None = None) -> bool:
    """True when this process will compile CPU kernels and finds none built yet."""
    if not compiling or (device or mx.default_device()) != mx.cpu:
        return False
    folder = folder or cache_folder()
    return not any(folder.glob("*.so")) if folder.is_dir() else True


def cold_note(cold_hosts: int, size: int) -> str | None:
    """The log's line when `cold_hosts` of the job's `size` ranks compile from nothing."""
    if cold_hosts == 0:
        return None
    where = "this host" if size == 1 else f"{cold_hosts} of {size} ranks' hosts"
    return (f"first step: MLX compiles its CPU kernels on {where} (nothing built yet in "
            f"$TMPDIR/mlx/{mx.__version__}/cpu; about a minute, once per host and mlx version)")
