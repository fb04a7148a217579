"""Where the time goes (reference_train/mfu.py): FLOPs per token as nanoGPT
and PaLM count them, the Apple GPU peak table's lookup, and a real run's
records: mfu, and the logged step split into compute, gradient all-reduce
and optimizer (2 local ranks, so the all-reduce is real)."""

from __future__ import annotations

import pytest

from reference_train.mfu import apple_peak, flops_per_token, measured_peak

from .train_support import read_metrics, run_trainer


def test_flops_per_token_is_6n_plus_the_attention_term():
    # GPT-2 small as nanoGPT counts it: N = 124M params less the position embedding
    # (nanoGPT's get_num_params), L 12, H 12, Q 64, T 1024: 6N + 12 L H Q T.
    n = 124_337_664
    assert flops_per_token(n, 0, 12, 12, 64, 1024) == 6 * n + 12 * 12 * 12 * 64 * 1024
    assert flops_per_token(1000, 400, 1, 1, 1, 1) == 6 * 600 + 12  # the lookup left out


def test_apple_peaks_by_chip_and_gpu_cores():
    assert apple_peak("Apple M2 Ultra", 76) == pytest.approx(27.2e12)
    assert apple_peak("Apple M3 Max", 30) == pytest.approx(10.74e12)
    assert apple_peak("Apple M3 Max", 40) == pytest.approx(14.32e12)
    assert apple_peak("Apple M3 Max", None) is None  # two SKUs: never a guess
    assert apple_peak("Apple M4", None) == pytest.approx(3.76e12)
    assert apple_peak("Intel(R) Xeon(R)", 0) is None and apple_peak(None, None) is None
    assert measured_peak(n=128, rounds=1) > 1e6


def test_a_run_logs_mfu_and_where_the_step_time_goes(tmp_path):
    proc = run_trainer(["--config", "tiny", "--steps", "6", "--global_batch", "6", "--log_every",
                        "3", "--eval_every", "0", "--sample_tokens", "0", "--out", str(tmp_path)],
                       ranks=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mfu against measured here: best of 3 512^3 float32 matmuls" in proc.stdout
    records = [r for r in read_metrics(tmp_path) if "loss" in r]
    assert [r["step"] for r in records] == [3, 6]
    for r in records:
        assert 0 < r["mfu"] < 1 and r["dtype"] == "float32"
        assert r["compute_s"] > 0 and r["comm_s"] > 0 and r["optimizer_s"] > 0
    assert "| mfu " in proc.stdout and " comm, " in proc.stdout
