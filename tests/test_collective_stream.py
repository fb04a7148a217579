"""Where the collectives run (reference_train.collectives.collective_stream, docs/training-reference.md
"Collectives on a Mac's GPU"): on the CPU stream when the passes run on the GPU, the
backend's default otherwise; naming the CPU stream changes no loss. A Mac is not run here."""

from __future__ import annotations

import ast
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

from reference_train import collectives

from .conftest import require
from .train_support import MLX_LAUNCH, run_trainer, train_losses

COMMON = ["--config", "tiny", "--steps", "4", "--global_batch", "4", "--eval_every", "0",
          "--sample_tokens", "0", "--log_every", "1"]


def test_the_cpu_stream_when_the_passes_run_on_the_gpu():
    assert collectives.collective_stream(mx.Device(mx.gpu)) == mx.cpu
    assert collectives.collective_stream(mx.Device(mx.cpu)) is None
    assert collectives.collective_stream() is (mx.cpu if mx.default_device() == mx.gpu else None)


@pytest.mark.parametrize("device", ["gpu", "cpu"])
@pytest.mark.parametrize("comm", [mx.float32, mx.bfloat16])
def test_the_gradient_all_reduce_is_given_that_stream(monkeypatch, device, comm):
    seen = []

    def fake(grads, group=None, communication_stream=None):
        seen.append(communication_stream)
        return grads

    monkeypatch.setattr(nn, "average_gradients", fake)
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(getattr(mx, device)))
    out = collectives.average_gradients({"w": mx.ones((2,))}, None, comm)
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


COLLECTIVES = {"all_sum", "all_gather", "all_max", "all_min", "sum_scatter", "send", "recv",
               "recv_like"}


def distributed_calls(tree: ast.AST) -> list[ast.Call]:
    """Every call of mx.distributed.<collective>(...) in `tree`."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr in COLLECTIVES
            and ast.unparse(node.func.value) == "mx.distributed"]


def test_every_collective_is_called_in_one_module_on_the_named_stream():
    """reference_train calls mx.distributed's collectives in collectives.py only (the
    other modules through its functions), and each there passes the stream the rule
    names: collective_stream(), or one of the Exchange's own CPU streams."""
    package = Path(collectives.__file__).parent
    elsewhere = {p.name: len(distributed_calls(ast.parse(p.read_text())))
                 for p in package.glob("*.py") if p.name != "collectives.py"}
    assert {n: c for n, c in elsewhere.items() if c} == {}
    calls = distributed_calls(ast.parse(Path(collectives.__file__).read_text()))
    assert len(calls) >= len(COLLECTIVES) - 2  # all_max, all_min: not called
    streams = {ast.unparse(k.value) for call in calls for k in call.keywords if k.arg == "stream"}
    assert all(any(k.arg == "stream" for k in call.keywords) for call in calls)
    assert streams == {"collective_stream()", "self.sending", "self.receiving"}
    gradients = [node for node in ast.walk(ast.parse(Path(collectives.__file__).read_text()))
                 if isinstance(node, ast.Call) and ast.unparse(node.func) == "nn.average_gradients"]
    assert gradients and all(ast.unparse(k.value) == "stream" for call in gradients
                             for k in call.keywords if k.arg == "communication_stream")


def test_the_exchange_streams_are_cpu_streams():
    link = collectives.Exchange(None)
    assert link.sending.device == mx.cpu and link.receiving.device == mx.cpu
    assert link.sending != link.receiving
