"""The trainer says when MLX will compile its CPU kernels from nothing (reference_train/
compile_cache.py): the first step of a cold host is a minute longer, not a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx

from reference_train.compile_cache import cache_folder, cold_note, compiles_cold

REPO = Path(__file__).resolve().parent.parent


def test_a_folder_without_built_kernels_is_cold_and_one_with_them_is_not(tmp_path):
    folder = tmp_path / "mlx" / "cpu"
    assert compiles_cold(True, mx.cpu, folder)  # no folder yet
    folder.mkdir(parents=True)
    (folder / "kernel.cpp").write_text("")  # a source left by a killed compile is not a kernel
    assert compiles_cold(True, mx.cpu, folder)
    (folder / "libkernel.so").write_bytes(b"")
    assert not compiles_cold(True, mx.cpu, folder)


def test_nothing_is_cold_when_nothing_compiles_or_the_gpu_runs(tmp_path):
    assert not compiles_cold(False, mx.cpu, tmp_path / "none")
    assert not compiles_cold(True, mx.gpu, tmp_path / "none")


def test_the_folder_is_where_mlx_writes_its_kernels(tmp_path):
    """Compile one fused graph under a fresh TMPDIR: MLX's shared object lands in
    cache_folder() as that process computes it."""
    code = ("import mlx.core as mx\n"
            "from reference_train.compile_cache import cache_folder, compiles_cold\n"
            "mx.set_default_device(mx.cpu)\n"
            "before = compiles_cold(True)\n"
            "f = mx.compile(lambda x: mx.exp(x) * 2 + 1)\n"
            "mx.eval(f(mx.arange(8.0)))\n"
            "print(before, compiles_cold(True), cache_folder())\n")
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out[:2] == ["True", "False"]
    assert Path(out[2]) == tmp_path / "mlx" / mx.__version__ / "cpu"
    assert any(Path(out[2]).glob("*.so"))
    assert cache_folder().name == "cpu"


def test_the_note_counts_the_cold_hosts():
    assert cold_note(0, 3) is None
    assert "on this host" in cold_note(1, 1)
    assert "on 2 of 3 ranks' hosts" in cold_note(2, 3)
