"""Finding OpenBLAS for MLX's CPU backend on Linux.

The `mlx[cpu]` wheel for Linux links the reference netlib BLAS: a 1024^2 fp32
matmul runs at ~6 GFLOP/s, and a small Llama training step ~15x slower than with
OpenBLAS (docs/FIELD_NOTES). Preloading an OpenBLAS library (`LD_PRELOAD`)
swaps the implementation with identical results. macOS uses Accelerate and
needs nothing.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path

# Debian/Ubuntu (libopenblas0-pthread / -openmp / -serial), Fedora/RHEL, Arch.
OPENBLAS_CANDIDATES: tuple[str, ...] = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",
    "/usr/lib/libopenblas.so.0",
)


def find_openblas(candidates: tuple[str, ...] = OPENBLAS_CANDIDATES,
                  platform: str = sys.platform) -> Path | None:
    """The path of an OpenBLAS shared library on this Linux machine, or None.

    Always None off Linux (macOS builds of mlx use Accelerate).
    """
    if not platform.startswith("linux"):
        return None
    for candidate in candidates:
        if os.path.isfile(candidate):
            return Path(candidate)
    found = ctypes.util.find_library("openblas")  # a bare soname from ldconfig
    if found:
        for libdir in ("/usr/lib", "/usr/lib64", "/usr/local/lib"):
            path = Path(libdir) / found
            if path.is_file():
                return path
    return None


def with_openblas(env: Mapping[str, str], library: Path | None) -> dict[str, str]:
    """A copy of `env` whose LD_PRELOAD starts with `library` (unchanged when None)."""
    out = dict(env)
    if library is None:
        return out
    current = [p for p in out.get("LD_PRELOAD", "").split(":") if p]
    if str(library) not in current:
        out["LD_PRELOAD"] = ":".join([str(library), *current])
    return out
