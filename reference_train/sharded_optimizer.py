"""A sharded optimizer (ZeRO stage 1, "sharded data parallel" in FairScale's
words): each rank keeps the AdamW state of its share of the parameters only,
updates that share, and the updated parameters are gathered on every rank.

    --shard_optimizer        AdamW state per rank ~ 1/N of the unsharded one

Shares are whole parameters, dealt out largest first to the rank holding the
fewest elements so far (deterministic: every rank computes the same deal).
Laid end to end, rank 0's parameters, then rank 1's..., each share padded to
the largest one, the flat vector splits into N equal pieces, piece r being
rank r's share: the cut that ``sum_scatter`` and ``all_gather`` make.

A step: the gradients are reduce-scattered (each rank receives the average of
its own share only), clipped by the global norm (each rank's sum of squares,
one ``all_sum`` of a scalar), the share is updated, and the updated pieces are
all-gathered. Only JACCL (mlx >= 0.32.1) and NCCL have ``sum_scatter``
(launch_env.py reads the backend from the launch; ring and MPI raise):
elsewhere the gradients are all-summed and each rank keeps its piece, the
same values.
``all_gather`` copies, so every rank ends with bit-for-bit the same parameters.

Checkpoints hold the whole state in the unsharded layout (``gathered_state``,
a collective every rank calls), so every host's own copy is whole and a run
resumes on any rank count, sharded or not; loading keeps this rank's share.
"""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from .collectives import all_gather, all_sum, sum_scatter

MOMENTS = ("m", "v")  # AdamW's per-parameter state, each shaped like the parameter

def deal(sizes: dict[str, int], ranks: int) -> dict[str, int]:
    """Each parameter's owning rank: largest first, to the least-loaded rank."""
    load, owner = [0] * ranks, {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owner[name] = rank
        load[rank] += sizes[name]
    return owner


def clip_grad_norm_over(grads: dict[str, mx.array], max_norm: float, group):
    """``optim.clip_grad_norm`` for gradients held in pieces by the ranks of ``group``
    (a sharded optimizer's shares, a pipeline's stages): the global norm from every
    rank's sum of squares (one ``all_sum`` of a scalar). Returns (clipped, norm)."""
    squares = sum((g.square().sum() for g in grads.values()), mx.array(0.0))
    total = mx.sqrt(all_sum(squares, group)
                    if group.size() > 1 else squares)
    normalizer = mx.minimum(max_norm / (total + 1e-6), 1.0)
    return {n: (g * normalizer).astype(g.dtype) for n, g in grads.items()}, total


class ShardedOptimizer:
    """Wraps an MLX optimizer (AdamW) so that it holds and updates this rank's share."""

    def __init__(self, optimizer, model, group, reduce_scatter: bool = False):
        self.inner, self.group, self.reduce_scatter = optimizer, group, reduce_scatter
        self.rank, self.size = group.rank(), group.size()
        params = dict(tree_flatten(model.trainable_parameters()))
        self.names = sorted(params)
        self.shapes = {n: params[n].shape for n in self.names}
        self.sizes = {n: params[n].size for n in self.names}
        self.owner = deal(self.sizes, self.size)
        self.shares = [[n for n in self.names if self.owner[n] == r] for r in range(self.size)]
        self.mine = self.shares[self.rank]
        self.piece = max(sum(self.sizes[n] for n in share) for share in self.shares)
        self.inner.init(tree_unflatten([(n, params[n]) for n in self.mine]))

    # What mx.eval / mx.compile see: this rank's share of the state.
    @property
    def state(self):
        return self.inner.state

    @state.setter
    def state(self, whole) -> None:
        """Take a whole (unsharded) state, as a checkpoint holds it; keep this rank's share."""
        flat = dict(tree_flatten(whole))
        kept = [(k, v) for k, v in flat.items()
                if k.rsplit(".", 1)[0] in self.mine or "." not in k]  # "step", "learning_rate"
        self.inner.state = tree_unflatten(kept)

    @property
    def learning_rate(self):
        return self.inner.learning_rate

    def average_gradients(self, grads, comm_dtype: mx.Dtype) -> dict[str, mx.array]:
        """This rank's share of the ranks' mean gradient, in float32 (a flat
        dict by parameter name), reduced in ``comm_dtype``."""
        grads = dict(tree_flatten(grads))
        if self.size == 1:
            return {n: grads[n] for n in self.mine}
        flat = mx.concatenate([self._padded([grads[n] for n in share]) for share in self.shares])
        flat = flat.astype(comm_dtype)
        if self.reduce_scatter:
            piece = sum_scatter(flat, self.group)
        else:  # the same piece, the long way: the whole sum, then keep ours
            at = self.rank * self.piece
            piece = all_sum(flat, self.group)[at:at + self.piece]
        return self._split((piece / self.size).astype(mx.float32), self.mine)

    def clip_grad_norm(self, grads: dict[str, mx.array], max_norm: float):
        return clip_grad_norm_over(grads, max_norm, self.group)

    def update(self, model, grads: dict[str, mx.array]) -> None:
        """Update this rank's share from its averaged gradients (``average_gradients``),
        then gather the updated parameters on every rank."""
        params = dict(tree_flatten(model.trainable_parameters()))
        new = dict(tree_flatten(self.inner.apply_gradients(
            tree_unflatten(list(grads.items())),
            tree_unflatten([(n, params[n]) for n in self.mine]))))
        pieces = self._gather([new[n] for n in self.mine])
        model.update(tree_unflatten([(n, v) for share, piece in zip(self.shares, pieces, strict=True)
                                     for n, v in self._split(piece, share).items()]))

    def gathered_state(self):
        """The whole state in the unsharded layout, on every rank (a collective)."""
        own = dict(tree_flatten(self.inner.state))
        gathered = {}
        for m in MOMENTS:
            pieces = self._gather([own[f"{n}.{m}"] for n in self.mine])
            for share, piece in zip(self.shares, pieces, strict=True):
                gathered.update({f"{n}.{m}": v for n, v in self._split(piece, share).items()})
        rest = [(k, v) for k, v in own.items() if k.rsplit(".", 1)[0] not in self.names]
        mx.eval(gathered)  # now, on every rank: MLX is lazy, and only writers would evaluate it
        return tree_unflatten(sorted(gathered.items()) + rest)

    # ------------------------------------------------------------ the flat layout

    def _padded(self, arrays: list[mx.array]) -> mx.array:
        """Arrays end to end, padded with zeros to one piece's length."""
        filled = sum(a.size for a in arrays)
        return mx.concatenate([a.reshape(-1) for a in arrays]
                              + [mx.zeros((self.piece - filled,), dtype=mx.float32)])

    def _split(self, piece: mx.array, names: list[str]) -> dict[str, mx.array]:
        """A piece cut back into the named parameters (the padding dropped)."""
        out, at = {}, 0
        for n in names:
            out[n] = piece[at:at + self.sizes[n]].reshape(self.shapes[n])
            at += self.sizes[n]
        return out

    def _gather(self, arrays: list[mx.array]) -> list[mx.array]:
        """Every rank's piece (this rank's ``arrays``, padded), in rank order."""
        mine = self._padded(arrays)
        if self.size == 1:
            return [mine]
        return mx.split(all_gather(mine, self.group), self.size)
