"""Will the model split over these ranks, and fit each host? Judged before
anything is sent or launched, from the model folder, what the installed
mlx-lm can do with its family, and each host's memory facts. Pure: the
inputs are values (``split_check.check_split`` gathers them).

Tensor parallelism (``mlx_lm.server``'s default, the family's ``shard()``)
gives every rank 1/N of each layer's matrices: N must divide the attention
heads and the KV heads (mlx-lm divides both by N; 2 KV heads over 4 ranks
leaves each rank none) and mlx-lm's own split must go through. Every rank
also holds what is not split (embeddings, norms, the head). ``--pipeline``
(the family's ``pipeline()``) gives every rank whole layers, as mlx-lm
splits them (evenly, the low ranks one more), plus the same unsplit rest;
over hosts of unequal memory the layers are placed by each host's memory
instead (``place_by_memory``: the split mlx-lm's ``pipeline(group, split)``
takes), and when no split fits, the refusal names the hosts or the
quantization that would.

Each host must hold the weights of its ranks with a margin: the weights
may use at most 90% of the memory the GPU can wire (mlx-lm's own line: it
warns above 90% of Metal's recommended working set, "the model will likely
be slow"); the other 10% holds the KV cache, activations and mlx's buffers.
On a Mac that memory is the working set mlx reports (the
``iogpu.wired_limit_mb`` override when set, else macOS's default share of
RAM); on Linux, MemAvailable. See docs/serve.md "Will the model fit?".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mlxcluster.facts.facts import HostFacts
from mlxcluster.fit.family import PIPELINE, TENSOR, FamilySupport
from mlxcluster.fit.model_folder import ModelFolder

GIB, MIB = 2**30, 2**20
# The share of the GPU's memory the weights may take (mlx-lm warns above it).
WEIGHTS_SHARE = 0.9
# macOS's default GPU limit is a share of RAM it does not publish: 2/3 on the
# 8-32 GB Macs measured, 3/4 at 64 GB, 0.84 at 128 GB under macOS 26
# (tests/fixtures/macos/SOURCES.md). Without mlx's figure, 2/3 is the least.
DEFAULT_SHARE_AT_LEAST = 2 / 3
# What a raised limit leaves to macOS and everything else on the Mac: an
# eighth of RAM, at least 4 GiB (16 GiB on 128: what people set there, 112).
OS_RESERVE_SHARE, OS_RESERVE_MIN = 1 / 8, 4 * GIB
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # as mlx-lm's sharded_load matches them

FITS, TOO_BIG, UNKNOWN = "fits", "too big", "unknown"


def gib(n: int | float) -> str:
    """Bytes for a reader: GiB from 1 GiB up, else MiB, else KiB."""
    for unit, size in (("GiB", GIB), ("MiB", MIB)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 1024:.1f} KiB"


def layer_of(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def even_split(layers: int, ranks: int) -> tuple[int, ...]:
    """mlx-lm's own split: evenly, the low ranks one more."""
    base, extra = divmod(layers, ranks)
    return tuple(base + (1 if r < extra else 0) for r in range(ranks))


def spans_of(split: Sequence[int]) -> list[range]:
    """The layers each rank runs for ``split`` (each rank's count, mlx-lm's
    ``pipeline(group, split)``): rank r runs the layers after those of ranks
    r+1 ... N-1, so rank 0 runs the last ones."""
    return [range(sum(split[r + 1:]), sum(split[r + 1:]) + split[r]) for r in range(len(split))]


def pipeline_layers(layers: int, ranks: int) -> list[range]:
    """The layers each rank runs under ``--pipeline``, as mlx-lm's
    PipelineMixin splits them: evenly, the low ranks one more, rank 0 the last ones."""
    return spans_of(even_split(layers, ranks))


def layer_bytes(model: ModelFolder) -> tuple[int, list[int]]:
    """(what every pipeline rank holds whole: embeddings, final norm, head;
    each layer's bytes, in layer order)."""
    whole = sum(t.nbytes for t in model.tensors if layer_of(t.name) is None)
    count = model.layers or 1 + max((layer_of(t.name) or 0 for t in model.tensors), default=0)
    per_layer = [0] * count
    for t in model.tensors:
        i = layer_of(t.name)
        if i is not None and i < count:  # past the last layer: MTP weights mlx-lm drops
            per_layer[i] += t.nbytes
    return whole, per_layer


def rank_bytes(model: ModelFolder, ranks: int, mode: str, split: Sequence[int] | None = None) -> list[int]:
    """The weights each rank holds. Tensor: each layer's matrices split N
    ways (its vectors, norms and the rest whole); pipeline: its layers whole
    (``split``: each rank's count; None: mlx-lm's even split), and the rest
    (embeddings, final norm, head) on every rank."""
    if mode == TENSOR:
        whole = sum(t.nbytes for t in model.tensors if layer_of(t.name) is None)
        split_bytes = sum(math.ceil(t.nbytes / ranks) if t.ndim >= 2 else t.nbytes
                          for t in model.tensors if layer_of(t.name) is not None)
        return [whole + split_bytes] * ranks
    whole, per_layer = layer_bytes(model)
    spans = spans_of(split) if split is not None else pipeline_layers(len(per_layer), ranks)
    return [whole + sum(per_layer[i] for i in span) for span in spans]


def fits_room(weights: int, room: int) -> bool:
    """``weights`` with the margin fit ``room`` bytes (``judge_host``'s test)."""
    return math.ceil(weights / WEIGHTS_SHARE) <= room


def memory_split(whole: int, per_layer: Sequence[int], rooms: Sequence[int]) -> tuple[int, ...] | None:
    """Layers per rank (mlx-lm's split: rank r's count, rank 0 the last
    layers) such that every rank's weights with the margin fit ``rooms[r]``;
    None when no contiguous split does.

    First the layers' bytes shared in proportion to what each rank has room
    for once it holds what every rank holds (``whole``): hosts of 16 and 32
    GB take them about 1:2, and each fills the same share of its room. Whole
    layers can overshoot that share; then greedily, in layer order, each rank
    taking as many layers as fit and leaving one for every rank after it:
    taking more early never hurts a later rank, so when any split fits, that
    one does."""
    ranks, n = len(rooms), len(per_layer)
    if ranks < 1 or ranks > n:
        return None
    order = list(range(ranks - 1, -1, -1))  # the ranks in layer order: N-1 runs the first layers
    spare = [max(0, int(rooms[r] * WEIGHTS_SHARE) - whole) for r in order]
    if sum(spare) > 0:
        proportional = _proportional(per_layer, spare)
        if _all_fit(whole, per_layer, proportional, [rooms[r] for r in order]):
            return tuple(reversed(proportional))
    greedy = _greedy(whole, per_layer, [rooms[r] for r in order])
    return None if greedy is None else tuple(reversed(greedy))


def _proportional(per_layer: Sequence[int], shares: Sequence[int]) -> list[int]:
    """Counts in layer order whose cut points fall nearest the bytes ``shares`` ask for,
    every part at least one layer."""
    total, parts, n = sum(per_layer), len(shares), len(per_layer)
    cumulative = [0]
    for b in per_layer:
        cumulative.append(cumulative[-1] + b)
    cuts, start = [], 0
    for k in range(1, parts):
        target = total * sum(shares[:k]) / sum(shares)
        lowest, highest = start + 1, n - (parts - k)  # at least one layer each side
        cut = min(range(lowest, highest + 1), key=lambda i: (abs(cumulative[i] - target), i))
        cuts.append(cut)
        start = cut
    edges = [0, *cuts, n]
    return [edges[i + 1] - edges[i] for i in range(parts)]


def _all_fit(whole: int, per_layer: Sequence[int], counts: Sequence[int], rooms: Sequence[int]) -> bool:
    start = 0
    for count, room in zip(counts, rooms, strict=True):
        if not fits_room(whole + sum(per_layer[start:start + count]), room):
            return False
        start += count
    return True


def _greedy(whole: int, per_layer: Sequence[int], rooms: Sequence[int]) -> list[int] | None:
    parts, n = len(rooms), len(per_layer)
    counts, start = [], 0
    for k, room in enumerate(rooms):
        end = n if k == parts - 1 else start + 1
        if k < parts - 1:
            while end + 1 <= n - (parts - 1 - k) and fits_room(whole + sum(per_layer[start:end + 1]), room):
                end += 1
        if not fits_room(whole + sum(per_layer[start:end]), room):
            return None
        counts.append(end - start)
        start = end
    return counts


@dataclass(frozen=True)
class Budget:
    """The memory a host's ranks may fill: certainly at least ``low``, at
    most ``high`` (equal when known exactly; None: nothing known)."""

    low: int | None
    high: int | None
    source: str


def os_reserve(memory: int) -> int:
    return max(OS_RESERVE_MIN, int(memory * OS_RESERVE_SHARE))


def budget(f: HostFacts | None) -> Budget:
    if f is None or not f.probed:
        return Budget(None, None, "not probed")
    if f.platform == "darwin":
        limit = f"iogpu.wired_limit_mb={f.gpu_wired_limit_mb}" if f.gpu_wired_limit_mb is not None else \
            "iogpu.wired_limit_mb unknown"
        if f.gpu_working_set_bytes:
            return Budget(f.gpu_working_set_bytes, f.gpu_working_set_bytes,
                          f"Metal working set as mlx reports it ({limit})")
        if f.gpu_wired_limit_mb:
            return Budget(f.gpu_wired_limit_mb * MIB, f.gpu_wired_limit_mb * MIB, limit)
        if f.memory_bytes:
            return Budget(int(f.memory_bytes * DEFAULT_SHARE_AT_LEAST), f.memory_bytes,
                          f"macOS's default GPU limit, at least 2/3 of {gib(f.memory_bytes)} RAM "
                          f"({limit}; mlx did not report its working set)")
        return Budget(None, None, "neither its RAM nor its GPU limit reported")
    if f.memory_available_bytes:
        return Budget(f.memory_available_bytes, f.memory_available_bytes, "MemAvailable")
    if f.memory_bytes:
        return Budget(None, f.memory_bytes, "its RAM (MemAvailable not reported)")
    return Budget(None, None, "its memory not reported")


def wired_limit_for(need: int, f: HostFacts | None) -> int | None:
    """The iogpu.wired_limit_mb (MiB) that gives a Mac ``need`` bytes of
    GPU memory, rounded up to whole GiB; None when that would leave macOS
    less than its reserve (or the host is no Mac whose RAM is known)."""
    if f is None or f.platform != "darwin" or not f.memory_bytes:
        return None
    most = (f.memory_bytes - os_reserve(f.memory_bytes)) // MIB
    wanted = math.ceil(need / MIB)
    if wanted > most:
        return None
    return min(most, math.ceil(wanted / 1024) * 1024)


@dataclass(frozen=True)
class HostFit:
    host: str
    ranks: tuple[int, ...]
    weights: int  # the weights of its ranks
    need: int  # with the margin: weights / WEIGHTS_SHARE
    budget: Budget
    status: str  # FITS, TOO_BIG or UNKNOWN
    wired_limit_mb: int | None = None  # setting iogpu.wired_limit_mb to it makes it fit (macOS)

    def line(self) -> str:
        ranks = f"rank{'s' if len(self.ranks) > 1 else ''} {','.join(map(str, self.ranks))}"
        have = gib(self.budget.low) if self.budget.low == self.budget.high and self.budget.low else \
            (f"at least {gib(self.budget.low)}" if self.budget.low else "?") + \
            (f", at most {gib(self.budget.high)}" if self.budget.high and self.budget.high != self.budget.low else "")
        text = (f"{ranks}: {gib(self.weights)} of weights, {gib(self.need)} with the margin; "
                f"{have} ({self.budget.source})")
        return f"{text}: {self.status}"


def judge_host(host: str, ranks: tuple[int, ...], weights: int, f: HostFacts | None) -> HostFit:
    need = math.ceil(weights / WEIGHTS_SHARE)
    b = budget(f)
    if b.low is not None and need <= b.low:
        status = FITS
    elif b.high is not None and need > b.high:
        status = TOO_BIG
    else:
        status = UNKNOWN
    raise_to = wired_limit_for(need, f) if status != FITS else None
    return HostFit(host, ranks, weights, need, b, status, raise_to)


@dataclass(frozen=True)
class SplitVerdict:
    """The split judged: ``ok`` unless ``refusals``. Numbers in every line."""

    model: str
    mode: str  # TENSOR or PIPELINE
    ranks: int
    rank_bytes: tuple[int, ...]
    hosts: tuple[HostFit, ...]
    family: FamilySupport
    refusals: tuple[str, ...] = ()
    ways_out: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what was not judged and why; never a refusal
    # --pipeline over hosts of unequal memory: each rank's layers (mlx-lm's
    # ``pipeline(group, split)``, rank 0 the last ones) placed by memory; None:
    # mlx-lm's even split, which the ranks then run unchanged.
    split: tuple[int, ...] | None = None
    even_fits: bool = True  # with a split: whether mlx-lm's even split fits too

    @property
    def ok(self) -> bool:
        return not self.refusals

    def split_line(self) -> str | None:
        """With a split by memory, the line that says it: each rank's host, its
        layers and their bytes, and what mlx-lm's even split would have done."""
        if self.split is None:
            return None
        host_of = {r: h.host for h in self.hosts for r in h.ranks}
        ranks = [f"rank {r} on {host_of[r]}: layers {span.start}-{span.stop - 1} "
                 f"({len(span)}, {gib(self.rank_bytes[r])} with the embeddings and head)"
                 for r, span in enumerate(spans_of(self.split))]
        even = even_split(sum(self.split), len(self.split))
        tail = ("mlx-lm's even split" + f" ({', '.join(map(str, even))} layers) "
                + ("would fit too, but fills the smaller host's memory more" if self.even_fits else
                   "does not fit"))
        return "layers placed by each host's memory: " + "; ".join(ranks) + "; " + tail

    def summary(self) -> str:
        each = gib(max(self.rank_bytes)) if self.rank_bytes else "?"
        if self.split is not None:
            each = f"{gib(min(self.rank_bytes))} to {each}"
        head = f"{self.model} over {self.ranks} rank(s), {self.mode}: {each} of weights per rank"
        if self.split is not None:
            head += " (layers placed by memory)"
        if self.ok:
            return head + (": fits" if all(h.status == FITS for h in self.hosts) else ": not refused")
        return head + ": refused: " + "; ".join(self.refusals)

    def message(self) -> str:
        """The whole verdict: what is refused, each host, the ways out, the notes."""
        lines = [self.summary()]
        lines += [f"  {h.host}: {h.line()}" for h in self.hosts]
        lines += [f"  way out: {w}" for w in self.ways_out]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass
class _Judgement:
    refusals: list[str] = field(default_factory=list)
    ways_out: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def heads_divide(model: ModelFolder, ranks: int) -> bool:
    heads, kv = model.attention_heads, model.kv_heads
    return (heads is None or heads % ranks == 0) and (kv is None or kv % ranks == 0)


def _family_name(model: ModelFolder, family: FamilySupport) -> str:
    module = (family.module or "").rsplit(".", 1)[-1]
    return model.model_type + (f" (mlx-lm's {module})" if module and module != model.model_type else "")


def _mlx_lm(family: FamilySupport) -> str:
    return f"mlx-lm {family.mlx_lm_version or '(version unknown)'}"


def tensor_counts(model: ModelFolder, fits, most: int = 64) -> list[int]:
    """Rank counts (up to ``most``) that divide the heads and whose share ``fits``."""
    top = min(most, model.attention_heads or most)
    return [n for n in range(1, top + 1)
            if heads_divide(model, n) and fits(rank_bytes(model, n, TENSOR)[0])]


def _judge_family(model: ModelFolder, family: FamilySupport, ranks: int, mode: str, j: _Judgement) -> None:
    name = _family_name(model, family)
    if family.unknown:
        j.notes.append(f"whether {model.model_type} has shard() and pipeline() was not judged: {family.unknown}")
        return
    has = family.tensor if mode == TENSOR else family.pipeline
    method = "shard()" if mode == TENSOR else "pipeline()"
    if not has:
        j.refusals.append(f"{name} has no {method} in {_mlx_lm(family)}: "
                          f"{'tensor parallelism' if mode == TENSOR else '--pipeline'} cannot split it")
        other = family.pipeline if mode == TENSOR else family.tensor
        if other:
            j.ways_out.append("--pipeline (it has pipeline())" if mode == TENSOR
                              else "without --pipeline: tensor parallelism (it has shard())")
        elif ranks > 1:
            j.ways_out.append("one rank on one host (mlx-lm splits this family neither way), "
                              "or a newer mlx-lm if it adds the split")
    elif family.split_error:
        j.refusals.append(f"mlx-lm's own {method} of {name} over {ranks} ranks fails: {family.split_error}")


def _judge_heads(model: ModelFolder, family: FamilySupport, ranks: int, j: _Judgement) -> None:
    heads, kv = model.attention_heads, model.kv_heads
    if heads is None:
        j.notes.append("config.json names no num_attention_heads: only mlx-lm's own shard() judged the split")
        return
    if heads_divide(model, ranks):
        return
    j.refusals.append(f"{ranks} ranks do not divide the {heads} attention heads and {kv} KV heads "
                      "(tensor parallelism gives every rank heads/N of each)")
    works = [n for n in range(1, heads + 1) if heads_divide(model, n)]
    j.ways_out.append(f"{' or '.join(map(str, works))} rank(s): the counts that divide {heads} and {kv}")
    if family.pipeline:
        j.ways_out.append(f"--pipeline ({model.model_type} has pipeline() in {_mlx_lm(family)}; "
                          "whole layers per rank, any count up to the layers)")
    elif family.pipeline is False:
        j.notes.append(f"--pipeline is no way out: {model.model_type} has no pipeline() in {_mlx_lm(family)}")


def _judge_pipeline_layers(model: ModelFolder, ranks: int, j: _Judgement) -> None:
    if not model.has_index:
        j.refusals.append("--pipeline needs model.safetensors.index.json in the folder (mlx-lm's sharded_load "
                          "reads which file holds which layer from it)")
        j.ways_out.append("save the model with mlx-lm (mlx_lm.convert, or mlx_lm.utils.save_model): it writes "
                          "the index")
    if model.layers is not None and ranks > model.layers:
        j.refusals.append(f"{ranks} ranks for {model.layers} layers: --pipeline gives every rank at least one")
        j.ways_out.append(f"at most {model.layers} ranks")


def _judge_memory(model: ModelFolder, placement: Sequence[str], facts: Mapping[str, HostFacts | None],
                  mode: str, family: FamilySupport, j: _Judgement,
                  split: Sequence[int] | None = None) -> tuple[list[int], list[HostFit]]:
    ranks = len(placement)
    per_rank = rank_bytes(model, ranks, mode, split)
    hosts = list(dict.fromkeys(placement))
    fits = []
    for host in hosts:
        mine = tuple(r for r, h in enumerate(placement) if h == host)
        fits.append(judge_host(host, mine, sum(per_rank[r] for r in mine), facts.get(host)))
    short = [h for h in fits if h.status == TOO_BIG]
    for h in short:
        have = gib(h.budget.high) if h.budget.high else "?"
        j.refusals.append(f"{h.host} needs {gib(h.need)} for {gib(h.weights)} of weights "
                          f"({len(h.ranks)} rank(s), +{100 - WEIGHTS_SHARE * 100:.0f}% margin) "
                          f"and has {have} ({h.budget.source})")
    for h in fits:
        if h.status == UNKNOWN:
            j.notes.append(f"{h.host}: not judged whether {gib(h.need)} fits: {h.budget.source}")
        if h.status != FITS and h.wired_limit_mb:
            j.ways_out.append(f"on {h.host}: sudo sysctl iogpu.wired_limit_mb={h.wired_limit_mb} "
                              f"(gives the GPU {gib(h.wired_limit_mb * MIB)} of its "
                              f"{gib(facts[h.host].memory_bytes)}; until the next reboot; "
                              "or mlxcluster doctor --model DIR --fix)")
    if short:
        rooms = rank_rooms(placement, facts)
        if mode == TENSOR and family.pipeline and rooms is not None:
            by_memory = memory_split(*layer_bytes(model), rooms)
            if by_memory is not None:
                j.ways_out.insert(0, "--pipeline: whole layers placed by each host's memory fit these "
                                     f"hosts ({_counts(placement, by_memory)}; tensor parallelism "
                                     "gives every rank an equal share, uneven shards are not in MLX)")
        if mode == PIPELINE and rooms is not None:
            _pipeline_ways_out(model, placement, facts, rooms, j)
        smallest = min((h.budget.high for h in fits if h.budget.high), default=None)
        if smallest and not (mode == PIPELINE and rooms is not None):  # those said it
            _more_ranks(model, mode, family, ranks, smallest, j)
    return per_rank, fits


def _counts(placement: Sequence[str], split: Sequence[int]) -> str:
    return ", ".join(f"{n} layers on {host}" for host, n in zip(placement, split, strict=True))


def rank_rooms(placement: Sequence[str], facts: Mapping[str, HostFacts | None]) -> list[int] | None:
    """What each rank certainly may fill: its host's budget (``Budget.low``)
    shared by the host's ranks; None when a host's is not known."""
    rooms = []
    for host in placement:
        low = budget(facts.get(host)).low
        if low is None:
            return None
        rooms.append(low // placement.count(host))
    return rooms


# Hosts whose rooms differ by less than this keep mlx-lm's even split when it
# fits: the difference is noise (MemAvailable moving), not a smaller Mac.
UNEQUAL = 1.25


def place_by_memory(model: ModelFolder, placement: Sequence[str],
                    facts: Mapping[str, HostFacts | None]) -> tuple[tuple[int, ...] | None, bool]:
    """(--pipeline's split by memory, or None for mlx-lm's even split; whether
    the even split fits). Hosts alike (rooms within ``UNEQUAL``) whose even
    split fits keep it; otherwise the layers go by each host's room
    (``memory_split``) when that fits and differs from the even split. None
    too when a host's memory is not known or no split fits (the memory
    judgement then refuses the even split and names what would fit)."""
    rooms = rank_rooms(placement, facts)
    whole, per_layer = layer_bytes(model)
    even = even_split(len(per_layer), len(placement))
    if rooms is None or len(placement) > len(per_layer):
        return None, True
    even_fits = all(fits_room(w, room) for w, room in
                    zip(rank_bytes(model, len(placement), PIPELINE, even), rooms, strict=True))
    if even_fits and max(rooms) < UNEQUAL * min(rooms):
        return None, True
    by_memory = memory_split(whole, per_layer, rooms)
    return (None if by_memory in (None, even) else by_memory), even_fits


def _pipeline_ways_out(model: ModelFolder, placement: Sequence[str], facts: Mapping[str, HostFacts | None],
                       rooms: Sequence[int], j: _Judgement) -> None:
    """No split of the layers fits these hosts: the smallest set of hosts
    (the largest of these, and more like the largest) and the quantization
    that a split by memory would fit."""
    whole, per_layer = layer_bytes(model)
    ranked = sorted(range(len(placement)), key=lambda r: -rooms[r])  # these ranks, the roomiest first
    largest, room = placement[ranked[0]], rooms[ranked[0]]
    found = None
    for total in range(1, len(per_layer) + 1):
        for kept in range(min(total, len(placement)), 0, -1):  # as many of these as will do
            if memory_split(whole, per_layer, [*(rooms[r] for r in ranked[:kept]),
                                               *[room] * (total - kept)]) is not None:
                found = (total, kept)
                break
        if found:
            break
    if found and found[0] > 0:
        total, kept = found
        these = ", ".join(dict.fromkeys(placement[r] for r in ranked[:kept]))
        more = f" and {total - kept} more like {largest} ({gib(room)})" if total > kept else ""
        j.ways_out.append(f"{total} host{'s' if total > 1 else ''}: {these}{more}, the layers placed by memory")
    bits = _bits_now(model)
    for q in (8, 4):
        ratio = (q + QUANTIZED_EXTRA_BITS) / bits
        if ratio >= 1:
            continue
        scaled = [int(b * ratio) for b in per_layer]
        if memory_split(int(whole * ratio), scaled, rooms) is not None:
            j.ways_out.append(f"the model quantized to {q} bits (about "
                              f"{gib((whole + sum(per_layer)) * ratio)}; mlx_lm.convert -q --q-bits {q}), "
                              "the layers placed by memory over these hosts")
            break


# mlx-lm's quantization stores a scale and a bias (16 bits each) per group of 64: 0.5 bit a weight.
QUANTIZED_EXTRA_BITS = 0.5


def _bits_now(model: ModelFolder) -> float:
    """Bits a weight in the folder as it is: its quantization's, else 16 (bfloat16 or float16)."""
    q = model.config.get("quantization") or model.config.get("quantization_config") or {}
    bits = q.get("bits") if isinstance(q, dict) else None
    return bits + QUANTIZED_EXTRA_BITS if isinstance(bits, int) else 16


def _more_ranks(model: ModelFolder, mode: str, family: FamilySupport, ranks: int, room: int,
                j: _Judgement) -> None:
    """Ways out by rank count, for hosts with ``room`` bytes each (the least of these hosts')."""

    def fits(weights: int) -> bool:
        return math.ceil(weights / WEIGHTS_SHARE) <= room

    if mode == TENSOR:
        counts = [n for n in tensor_counts(model, fits) if n > ranks]
        if counts:
            j.ways_out.append(f"{counts[0]} hosts like the smallest here (tensor: "
                              f"{gib(rank_bytes(model, counts[0], TENSOR)[0])} per rank)")
    layers = model.layers or 0
    enough = next((n for n in range(2, layers + 1) if fits(max(rank_bytes(model, n, PIPELINE)))), None)
    if enough and (mode == PIPELINE or family.pipeline):
        j.ways_out.append(f"--pipeline over {enough} hosts like the smallest here "
                          f"({gib(max(rank_bytes(model, enough, PIPELINE)))} per rank)")


def judge_split(model: ModelFolder, family: FamilySupport, placement: Sequence[str],
                facts: Mapping[str, HostFacts | None], mode: str = TENSOR) -> SplitVerdict:
    """The verdict on splitting ``model`` over ranks placed on ``placement``
    (the host of each rank, in rank order; a host twice holds two ranks),
    each host judged on its ``facts``."""
    if mode not in (TENSOR, PIPELINE):
        raise ValueError(f"mode {mode!r}")
    ranks = len(placement)
    if ranks < 1:
        raise ValueError("no rank to place")
    j = _Judgement()
    split, even_fits = None, True
    if ranks > 1:
        if mode == TENSOR:
            _judge_heads(model, family, ranks, j)
        else:
            _judge_pipeline_layers(model, ranks, j)
            split, even_fits = place_by_memory(model, placement, facts)
        _judge_family(model, family, ranks, mode, j)
    per_rank, fits = _judge_memory(model, placement, facts, mode, family, j, split)
    versions = {h: f.mlx_lm_version for h, f in facts.items() if f is not None and f.mlx_lm_version}
    odd = {h: v for h, v in versions.items() if v != family.mlx_lm_version}
    if family.mlx_lm_version and odd:
        listing = ", ".join(f"{h} {v}" for h, v in odd.items())
        j.notes.append(f"judged with {_mlx_lm(family)} (here); the hosts run theirs: {listing}")
    return SplitVerdict(str(model.path), mode, ranks, tuple(per_rank), tuple(fits), family,
                        tuple(j.refusals), tuple(dict.fromkeys(j.ways_out)), tuple(j.notes),
                        split, even_fits)
