"""A sharded optimizer (ZeRO stage 1, "sharded data parallel" in FairScale's
words): each rank keeps the AdamW state of its share of the parameters only,
updates that share, and the updated parameters are gathered on every rank.

    --shard_optimizer        AdamW state per rank ~ 1/N of the unsharded one

Shares are whole parameters, dealt out largest first to the rank holding the
fewest elements so far (deterministic: every rank computes the same deal).
The gradients are averaged over all ranks as without sharding (``all_sum``:
MLX's ring and MPI backends have no ``sum_scatter`` — ring raises "[ring]
sum_scatter not supported", MPI "[mpi] sum_scatter not yet implemented" —
and every rank needs the global gradient norm for clipping anyway), so each
rank updates its share from exactly the gradient the unsharded optimizer
sees. The gather is one ``all_sum`` of a flat vector in which each rank
fills its own parameters and leaves zeros elsewhere: x + 0 = x, so every
rank ends with bit-for-bit the parameters of the unsharded run.

Checkpoints hold the whole state in the unsharded layout (``gathered_state``,
a collective every rank calls), so every host's own copy is whole and a run
resumes on any rank count, sharded or not; loading keeps this rank's share.
"""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

MOMENTS = ("m", "v")  # AdamW's per-parameter state, each shaped like the parameter


def deal(sizes: dict[str, int], ranks: int) -> dict[str, int]:
    """Each parameter's owning rank: largest first, to the least-loaded rank."""
    load, owner = [0] * ranks, {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owner[name] = rank
        load[rank] += sizes[name]
    return owner


class ShardedOptimizer:
    """Wraps an MLX optimizer (AdamW) so that it holds and updates this rank's share."""

    def __init__(self, optimizer, model, group):
        self.inner, self.group = optimizer, group
        self.rank, self.size = group.rank(), group.size()
        params = dict(tree_flatten(model.trainable_parameters()))
        self.names = sorted(params)
        self.shapes = {n: params[n].shape for n in self.names}
        self.owner = deal({n: params[n].size for n in self.names}, self.size)
        self.mine = [n for n in self.names if self.owner[n] == self.rank]
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

    def update(self, model, grads) -> None:
        """Update this rank's share from the (already averaged) gradients, then
        gather the updated parameters on every rank."""
        grads, params = dict(tree_flatten(grads)), dict(tree_flatten(model.trainable_parameters()))
        new = dict(tree_flatten(self.inner.apply_gradients(
            tree_unflatten([(n, grads[n]) for n in self.mine]),
            tree_unflatten([(n, params[n]) for n in self.mine]))))
        whole = self._gather({n: new[n] for n in self.mine}, params)
        model.update(tree_unflatten(list(whole.items())))

    def gathered_state(self):
        """The whole state in the unsharded layout, on every rank (a collective)."""
        own = dict(tree_flatten(self.inner.state))
        fields = {f"{n}.{m}": own.get(f"{n}.{m}") for n in self.names for m in MOMENTS}
        shapes = {k: self.shapes[k.rsplit(".", 1)[0]] for k in fields}
        gathered = self._gather({k: v for k, v in fields.items() if v is not None},
                                {k: mx.zeros(shapes[k], dtype=mx.float32) for k in fields})
        rest = [(k, v) for k, v in own.items() if k.rsplit(".", 1)[0] not in self.names
                and k not in gathered]
        mx.eval(gathered)  # now, on every rank: MLX is lazy, and only writers would evaluate it
        return tree_unflatten(sorted(gathered.items()) + rest)

    def _gather(self, mine: dict[str, mx.array], like: dict[str, mx.array]) -> dict[str, mx.array]:
        """Every key of ``like``, with the owners' values: one all_sum of a
        flat vector where only the owner's part is not zero."""
        if self.size == 1:
            return {k: mine.get(k, like[k]) for k in like}
        keys = sorted(like)
        flat = mx.concatenate([(mine[k] if k in mine else mx.zeros_like(like[k])).reshape(-1)
                               for k in keys])
        summed = mx.distributed.all_sum(flat, group=self.group)
        out, at = {}, 0
        for k in keys:
            n = like[k].size
            out[k] = summed[at:at + n].reshape(like[k].shape)
            at += n
        return out
