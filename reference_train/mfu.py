"""Model FLOPs utilization: the FLOPs a step needs over what the machine can do.

FLOPs per token, as nanoGPT and PaLM (appendix B) count them: 6 N for the
matmuls of the forward and backward passes over the N parameters a token
passes through (the input embedding is a lookup, not a matmul, so it is left
out unless tied to the output), plus 12 L H Q T for attention's scores and
weighted sum (L layers, H heads of size Q, T tokens of context).

The peak: on a Mac, the GPU's from the table below (GPU cores x 128 FP32
lanes x 2 x clock; bfloat16 runs at the same ALU rate as float32 on M1-M4),
matched by the chip's name (``machdep.cpu.brand_string``, as doctor's facts
hold it) and GPU core count (``ioreg``); elsewhere, or for a chip not in the
table, the best of a few large float32/bfloat16 matmuls measured on this
machine when training starts (said in the log, so the MFU is never a number
against an unknown denominator).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import mlx.core as mx

# (chip, GPU cores) -> peak TFLOPS, float32 = bfloat16. Sources: philipturner/metal-benchmarks
# (M1, M2), hmc-tech.com GPU pages (M3, M4), the formula for the Ultras (2 x Max), measured
# 3.76 for the M5's ALU path (michaelstinkerings.org); see shared TRAINER_NOTES.md section 3.
APPLE_GPU_TFLOPS = {
    ("M1", 8): 2.62, ("M1 Pro", 16): 5.31, ("M1 Max", 32): 10.62, ("M1 Ultra", 64): 21.23,
    ("M2", 10): 3.58, ("M2 Pro", 19): 6.80, ("M2 Max", 38): 13.60, ("M2 Ultra", 76): 27.2,
    ("M3", 10): 3.58, ("M3 Pro", 18): 6.44, ("M3 Max", 30): 10.74, ("M3 Max", 40): 14.32,
    ("M3 Ultra", 60): 21.5, ("M3 Ultra", 80): 28.6,
    ("M4", 10): 3.76, ("M4 Max", 32): 13.74, ("M4 Max", 40): 17.2,
    ("M5", 10): 3.76,
}


def flops_per_token(n_params: int, n_embedding: int, n_layers: int, n_heads: int,
                    head_dim: int, context: int) -> int:
    """6 N (N without the input embedding's lookup) + 12 L H Q T."""
    return 6 * (n_params - n_embedding) + 12 * n_layers * n_heads * head_dim * context


def apple_peak(chip: str | None, gpu_cores: int | None) -> float | None:
    """Peak FLOP/s of an Apple chip's GPU from the table, or None."""
    found = re.search(r"\b(M\d(?: Pro| Max| Ultra)?)\b", chip or "")
    if not found:
        return None
    name = found.group(1)
    rows = {cores: tf for (n, cores), tf in APPLE_GPU_TFLOPS.items() if n == name}
    if gpu_cores in rows:
        return rows[gpu_cores] * 1e12
    return next(iter(rows.values())) * 1e12 if len(rows) == 1 and gpu_cores is None else None


def mac_chip() -> tuple[str | None, int | None]:
    """(brand string, GPU core count) of this Mac; (None, None) elsewhere."""
    if sys.platform != "darwin":
        return None, None

    def ask(argv: list[str]) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    chip = ask(["sysctl", "-n", "machdep.cpu.brand_string"]).strip() or None
    cores = re.search(r'"gpu-core-count"\s*=\s*(\d+)', ask(["ioreg", "-rc", "AGXAccelerator", "-d1"]))
    return chip, int(cores.group(1)) if cores else None


def measured_peak(dtype: mx.Dtype = mx.float32, n: int = 512, rounds: int = 3) -> float:
    """FLOP/s of the best of ``rounds`` n x n x n matmuls on MLX's default device."""
    keys = mx.random.split(mx.random.key(0))  # its own keys: the run's random state untouched
    a, b = (mx.random.normal((n, n), key=k).astype(dtype) for k in keys)
    mx.eval(a @ b)  # warm up
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        mx.eval(a @ b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def peak_flops(dtype: mx.Dtype) -> tuple[float, str]:
    """(peak FLOP/s of one rank's device, where the figure comes from)."""
    chip, cores = mac_chip()
    peak = apple_peak(chip, cores)
    if peak is not None:
        return peak, f"{chip} with {cores} GPU cores: {peak / 1e12:.2f} TFLOPS (table, mfu.py)"
    peak = measured_peak(dtype)
    return peak, (f"measured here: best of 3 512^3 {str(dtype).split('.')[-1]} matmuls, "
                  f"{peak / 1e9:.1f} GFLOP/s per rank")
