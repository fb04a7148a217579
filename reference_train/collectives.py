"""Every collective the trainer calls, each on the stream the precision rule names.

The rule (`collective_stream`): when the passes run on the GPU (a Mac's Metal) a
collective runs on the CPU stream, as mlx-lm's trainer passes ``stream=mx.cpu`` to
every ``all_sum``; elsewhere (Linux's CPU) on the backend's default. The other
modules call the collectives through this one, never ``mx.distributed`` themselves
(tests/test_collective_stream.py holds it):

    all_sum(x, group), all_gather(x, group), sum_scatter(x, group)
    send(x, to, group), recv_like(x, source, group)
    average_gradients(grads, group, comm_dtype)     the ranks' mean, sent in comm_dtype
    Exchange(group)         sends and receives between neighbouring ranks, each on a
                            CPU stream of its own (a pipeline's stages, mirror.py)
    barrier(group), refuse_together(problem, group)
    all_gather_bytes, broadcast_bytes, gather_json, gather_tensors, tensor_from:
                            bytes, JSON and tensors moved between ranks (resume, a
                            pipeline's outputs and re-split)
"""

from __future__ import annotations

import json
import time

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map

from .errors import DataError
from .precision import to_float32

CHUNK_BYTES = 64 << 20  # bytes per all_sum when sending a file (a checkpoint's, a mirror's)


def collective_stream(device: mx.Device | None = None):
    """Where the collectives run: ``mx.cpu`` when the passes run on the GPU (a Mac's
    Metal), else None (the backend's default; on Linux's CPU nothing changes).

    A collective on the GPU stream keeps a Metal command buffer waiting for the slowest
    peer until it times out (kIOGPUCommandBufferCallbackErrorTimeout,
    ml-explore/mlx-examples#1185, fixed in #1200 with stream=mx.cpu). mlx 0.32's ring,
    JACCL and MPI groups already pick the CPU stream when none is given; naming it keeps
    that choice if a release changes the default. See docs/training-reference.md, "Collectives on a Mac's GPU"."""
    device = mx.default_device() if device is None else device
    return mx.cpu if device == mx.gpu else None


# ---------------------------------------------------------------- the collectives


def all_sum(x: mx.array, group) -> mx.array:
    return mx.distributed.all_sum(x, group=group, stream=collective_stream())


def all_gather(x: mx.array, group) -> mx.array:
    return mx.distributed.all_gather(x, group=group, stream=collective_stream())


def sum_scatter(x: mx.array, group) -> mx.array:
    return mx.distributed.sum_scatter(x, group=group, stream=collective_stream())


def send(x: mx.array, to: int, group) -> mx.array:
    return mx.distributed.send(x, to, group=group, stream=collective_stream())


def recv_like(x: mx.array, source: int, group) -> mx.array:
    return mx.distributed.recv_like(x, source, group=group, stream=collective_stream())


def average_gradients(grads, group, comm_dtype: mx.Dtype):
    """The ranks' mean gradient (``nn.average_gradients``), reduced in
    ``comm_dtype`` on ``collective_stream()`` and returned in float32."""
    stream = collective_stream()
    if comm_dtype == mx.float32:
        return nn.average_gradients(grads, group=group, communication_stream=stream)
    sent = tree_map(lambda g: g.astype(comm_dtype), grads)
    return to_float32(nn.average_gradients(sent, group=group, communication_stream=stream))


class Exchange:
    """Sends and receives between neighbouring ranks (a pipeline's stages), each on a CPU
    stream of its own (collectives run on the CPU: `collective_stream`). A send starts at
    once and is waited for in the next evaluation, beside whatever is waited for then (a
    receive, or compute): two neighbours sending to each other at once never wait for
    each other. On one stream they would, as soon as the tensors outgrow the sockets'
    buffers: measured on ring, 64 MiB each way at once hangs on one stream and completes
    on two (tests/test_pipeline.py)."""

    def __init__(self, group):
        self.group = group
        self.sending, self.receiving = mx.new_stream(mx.cpu), mx.new_stream(mx.cpu)
        self.outbox: list[mx.array] = []
        self.waited = 0.0  # seconds spent waiting for a receive

    def send(self, value: mx.array, to: int) -> None:
        """Send `value` to rank `to`: computed (when it is not yet) and sent now, before
        anything built after it; waited for in the next evaluation. Started only there,
        a send would wait for whatever that evaluation computes first (on the pipeline's
        last stage, the weights' gradients before the input's: its neighbour waited)."""
        sent = mx.distributed.send(value, to, group=self.group, stream=self.sending)
        mx.async_eval(sent)
        self.outbox.append(sent)

    def receive(self, shape, dtype: mx.Dtype, source: int) -> mx.array:
        """What rank `source` sends next, lazily: received when evaluated."""
        return mx.distributed.recv(shape, dtype, source, group=self.group, stream=self.receiving)

    def evaluate(self, *arrays: mx.array) -> None:
        """Evaluate `arrays` and every send not yet waited for."""
        mx.eval(*arrays, *self.outbox)
        self.outbox = []

    def wait_for(self, received: mx.array) -> mx.array:
        start = time.perf_counter()
        self.evaluate(received)
        self.waited += time.perf_counter() - start
        return received


# ---------------------------------------------------------------- agreeing


def barrier(group) -> None:
    mx.eval(all_sum(mx.array([1], dtype=mx.int32), group))


def refuse_together(problem: str | None, group, hint: str = "") -> None:
    """Raise on every rank of `group` when any rank has a problem (its own message, or
    which ranks refused): a rank that stopped alone would leave the others waiting in
    their next collective."""
    flag = mx.array(1 if problem else 0, dtype=mx.int32)
    refusing = int(all_sum(flag, group).item()) if group.size() > 1 else int(flag.item())
    if problem:
        raise DataError(problem, hint)
    if refusing:
        raise DataError(f"{refusing} other rank(s) refused to resume: their messages say why")


# ---------------------------------------------------------------- bytes, JSON, tensors


def all_gather_bytes(data: bytes, group) -> mx.array:
    return all_gather(mx.array(np.frombuffer(data, dtype=np.uint8)), group)


def broadcast_bytes(data: bytes, group) -> bytes:
    """The source's bytes on every rank: every other rank passes zeros of the same
    length, so the uint8 sum is exact."""
    out = bytearray()
    for start in range(0, max(len(data), 1), CHUNK_BYTES):
        chunk = np.frombuffer(data[start:start + CHUNK_BYTES], dtype=np.uint8)
        if chunk.size == 0:
            break
        summed = all_sum(mx.array(chunk), group)
        out += np.array(summed, dtype=np.uint8).tobytes()
    return bytes(out)


def gather_json(value, group) -> list:
    """Every rank's JSON-able `value`, in rank order, on every rank."""
    data = json.dumps(value).encode()
    if group.size() == 1:
        return [value]
    lengths = np.array(all_gather_bytes(len(data).to_bytes(8, "little"), group))
    lengths = [int.from_bytes(bytes(row), "little") for row in lengths.reshape(-1, 8)]
    every = np.array(all_gather_bytes(data.ljust(max(lengths), b" "), group))
    rows = every.reshape(group.size(), max(lengths))
    return [json.loads(bytes(row[:n])) for row, n in zip(rows, lengths, strict=True)]


def gather_tensors(mine: dict[str, mx.array], group) -> dict[str, mx.array] | None:
    """Every rank's tensors on rank 0 (None elsewhere), one tensor at a time: for
    small ones (adapters). Each goes as its bytes in an all_sum where the other ranks
    add zeros (exact, and any rank reaches any other: ring's send and receive join
    neighbours only)."""
    if group.size() == 1:
        return dict(mine)
    specs = gather_json(tensor_specs(mine), group)
    rank, gathered = group.rank(), {}
    for source, spec in enumerate(specs):
        for name, (shape, dtype) in spec.items():
            value = tensor_from(source, mine[name] if rank == source else None, shape, dtype,
                                group)
            if rank == 0:
                gathered[name] = value
    return gathered if rank == 0 else None


def tensor_specs(tensors: dict[str, mx.array]) -> dict[str, list]:
    """name -> [shape, dtype name] (JSON), in name order: what `tensor_from` needs to know."""
    return {n: [list(v.shape), str(v.dtype).rsplit(".", 1)[-1]] for n, v in sorted(tensors.items())}


def tensor_from(source: int, value: mx.array | None, shape: list[int], dtype: str,
                group) -> mx.array:
    """Rank `source`'s tensor (its `value`; None on the other ranks) on every rank of
    `group` (collective): its bytes in an all_sum where the others add zeros, exact,
    and any rank reaches any other (ring's send and receive join neighbours only)."""
    kind = getattr(mx, dtype)
    if value is None:
        value = mx.zeros(shape, dtype=kind)
    summed = all_sum(value.reshape(-1).view(mx.uint8), group)
    mx.eval(summed)
    return summed.view(kind).reshape(shape)
