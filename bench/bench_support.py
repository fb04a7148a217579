"""What several benchmarks share: OpenBLAS preloaded as the trainer runs it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlxcluster.facts.blas import find_openblas, with_openblas  # noqa: E402


def rerun_with_openblas(threads: int) -> Path | None:
    """Re-exec this script with OpenBLAS preloaded (LD_PRELOAD acts only at
    start-up), OPENBLAS_NUM_THREADS defaulting to ``threads``; returns the
    library once it is (None where this machine has none)."""
    blas = find_openblas()
    if blas and str(blas) not in os.environ.get("LD_PRELOAD", ""):
        env = with_openblas(os.environ, blas)
        env.setdefault("OPENBLAS_NUM_THREADS", str(threads))
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    return blas
