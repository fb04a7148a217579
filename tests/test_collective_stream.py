"""Where the collectives run (reference_train.precision.collective_stream, docs/training-reference.md
"Collectives on a Mac's GPU"): on the CPU stream when the passes run on the GPU, the
backend's default otherwise; naming the CPU stream changes no loss. A Mac is not run here."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from reference_train import precision

from .conftest import require
from .train_support import MLX_LAUNCH, run_trainer, train_losses

COMMON = ["--config", "tiny", "--steps", "4", "--global_batch", "4", "--eval_every", "0",
          "--sample_tokens", "0", "--log_every", "1"]


def test_the_cpu_stream_when_the_passes_run_on_the_gpu():
    assert precision.collective_stream(mx.Device(mx.gpu)) == mx.cpu
    assert precision.collective_stream(mx.Device(mx.cpu)) is None
    assert precision.collective_stream() is (mx.cpu if mx.default_device() == mx.gpu else None)


@pytest.mark.parametrize("device", ["gpu", "cpu"])
@pytest.mark.parametrize("comm", [mx.float32, mx.bfloat16])
def test_the_gradient_all_reduce_is_given_that_stream(monkeypatch, device, comm):
    seen = []

    def fake(grads, group=None, communication_stream=None):
        seen.append(communication_stream)
        return grads

    monkeypatch.setattr(nn, "average_gradients", fake)
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(getattr(mx, device)))
    out = precision.average_gradients({"w": mx.ones((2,))}, None, comm)
    assert seen == [mx.cpu if device == "gpu" else None]
    assert out["w"].dtype == mx.float32


@pytest.mark.parametrize("extra", [[], ["--shard_optimizer", "true"]])
def test_naming_the_cpu_stream_changes_no_loss(tmp_path, extra):
    """Two ranks (ring), the compiled step's nn.average_gradients and the sharded
    optimizer's all_sum and all_gather: the trainer as on Linux, and with every collective
    it names given stream=mx.cpu (what a Mac's GPU gets): the same losses, bit for bit."""
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    losses = {}
    for name, module in (("default", "reference_train.train"),
                         ("cpu", "tests.cpu_stream_standin")):
        out = tmp_path / name
        proc = run_trainer([*COMMON, *extra, "--out", str(out)], ranks=2,
                           module=module)
        assert proc.returncode == 0, proc.stderr[-2000:]
        losses[name] = train_losses(out)
    assert sorted(losses["default"]) == [1, 2, 3, 4]
    assert losses["cpu"] == losses["default"]
