"""Will each pipeline stage fit its host? `mlxcluster train -- --pipeline N`
judges it before anything is sent or launched: rank r runs stage r on the
job's r-th host, its bytes planned from the model folder here
(reference_train/stages.py: the safetensors headers only, no mlx), each host
judged on the same memory facts and the same 90% margin as `serve`
(fit/split.py ``judge_host``).

What a stage holds while it trains: its weights as the trainer holds them
(float weights as float32 master weights, quantized ones packed), and with
full fine-tuning as much again for the gradients and twice for AdamW's two
moments (LoRA, DoRA and QLoRA train adapters of a few MiB: their base alone
is counted). The 10% margin holds the activations, the adapters' state and
MLX's buffers, as it holds serve's KV cache.

Pure: the inputs are values; ``check_stages`` (launch/trainer.py's check
hook) gathers them. A verdict that is not ``ok`` names each stage that does
not fit, its host, its bytes and what the host has, and the ways out: a
--pipeline_split that fits every host (moving blocks off the small Mac),
more hosts, a raised GPU limit on a Mac, adapters instead of full
fine-tuning.

    stage 2 of 2 (blocks 2-3 of 4, the final norm and head) on mini needs
    13.3 GiB (12.0 GiB held, +10% margin); mini has 10.7 GiB (Metal working set ...)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mlxcluster.facts.facts import HostFacts
from mlxcluster.fit.split import (
    MIB,
    TOO_BIG,
    UNKNOWN,
    WEIGHTS_SHARE,
    HostFit,
    gib,
    judge_host,
)
from reference_train.stages import ModelBytes, StagePlan, plan_stages, stage_bytes

# Full fine-tuning holds per float32 weight its gradient and AdamW's two moments too.
FULL_TRAINING_COPIES = 4


def held_while_training(weights: int, fine_tune: str) -> int:
    """The bytes a stage of ``weights`` holds while it trains (module docstring)."""
    return weights * (FULL_TRAINING_COPIES if fine_tune == "full" else 1)


def needs(held: int) -> int:
    """``held`` with serve's margin: the memory it may take is 90% of the budget."""
    return math.ceil(held / WEIGHTS_SHARE)


@dataclass(frozen=True)
class StagesVerdict:
    """Each stage's host judged: ``ok`` unless ``refusals``."""

    plans: tuple[StagePlan, ...]  # each rank's stage, in rank order
    placement: tuple[str, ...]  # each rank's host
    held: tuple[int, ...]  # what each rank's stage holds while it trains
    hosts: tuple[HostFit, ...]
    refusals: tuple[str, ...] = ()
    ways_out: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.refusals

    def lines(self, n_blocks: int) -> list[str]:
        """One line per stage: its blocks, its host, its bytes and the host's verdict."""
        status = {h.host: h for h in self.hosts}
        return [f"stage {p.index + 1} of {p.count} on {host}: {what_it_holds_of(p, n_blocks)}, "
                f"{gib(held)} held while training; {host}: {status[host].line()}"
                for p, host, held in zip(self.plans, self.placement, self.held, strict=True)]


def what_it_holds_of(plan: StagePlan, n_blocks: int) -> str:
    """'blocks 2-3 of 4, the final norm and head' (``StagePlan.describe`` without the bytes)."""
    return plan.describe(n_blocks).split(": ", 1)[1].rsplit(", ", 1)[0]


@dataclass
class _Judgement:
    refusals: list[str] = field(default_factory=list)
    ways_out: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def judge_stages(sizes: ModelBytes, plans: Sequence[StagePlan], placement: Sequence[str],
                 facts: Mapping[str, HostFacts | None], fine_tune: str) -> StagesVerdict:
    """The verdict on training ``plans`` with rank r on ``placement[r]`` holding
    stage r % N (N x R ranks: R copies of the pipeline; a host twice holds both
    ranks' stages), each host judged on its ``facts``."""
    if not plans or len(placement) % len(plans):
        raise ValueError(f"{len(plans)} stages for {len(placement)} ranks")
    n_blocks = len(sizes.blocks)
    stage_of = [plans[r % len(plans)] for r in range(len(placement))]
    held = [held_while_training(p.bytes, fine_tune) for p in stage_of]
    hosts = list(dict.fromkeys(placement))
    fits = [judge_host(h, ranks := tuple(r for r, on in enumerate(placement) if on == h),
                       sum(held[r] for r in ranks), facts.get(h)) for h in hosts]
    j = _Judgement()
    for fit in fits:
        if fit.status == UNKNOWN:
            j.notes.append(f"{fit.host}: not judged whether {gib(fit.need)} fits: {fit.budget.source}")
        if fit.status != TOO_BIG:
            continue
        for r in fit.ranks:
            plan = stage_of[r]
            j.refusals.append(
                f"stage {plan.index + 1} of {plan.count} ({what_it_holds_of(plan, n_blocks)}) on "
                f"{fit.host} needs {gib(needs(held[r]))} ({gib(held[r])} held while training"
                f"{', weights, gradients and AdamW state' if fine_tune == 'full' else ''}, "
                f"+{100 - WEIGHTS_SHARE * 100:.0f}% margin)"
                + (f"; {fit.host} has {gib(fit.budget.high)} ({fit.budget.source})"
                   if len(fit.ranks) == 1 else
                   f"; {fit.host} holds stages "
                   f"{', '.join(str(stage_of[x].index + 1) for x in fit.ranks)}, "
                   f"{gib(fit.need)} in all, and has {gib(fit.budget.high)} ({fit.budget.source})"))
    if j.refusals:
        _ways_out(sizes, plans, placement, fits, facts, fine_tune, j)
    return StagesVerdict(tuple(stage_of), tuple(placement), tuple(held), tuple(fits),
                         tuple(j.refusals), tuple(dict.fromkeys(j.ways_out)), tuple(j.notes))


def _ways_out(sizes: ModelBytes, plans: Sequence[StagePlan], placement: Sequence[str],
              fits: Sequence[HostFit], facts: Mapping[str, HostFacts | None], fine_tune: str,
              j: _Judgement) -> None:
    n_stages = len(plans)
    room = {f.host: f.budget.low for f in fits}  # what each host certainly has
    if len(set(placement)) == len(placement) == n_stages and all(room[h] for h in placement):
        split = fitting_split(sizes, [room[h] for h in placement], fine_tune)
        if split is not None:
            j.ways_out.append(f"--pipeline_split {','.join(map(str, split))}: moves blocks off "
                              f"the host that is short, and every stage fits its host here")
        else:
            j.notes.append(f"no --pipeline_split of the {len(sizes.blocks)} blocks over these "
                           f"{n_stages} hosts fits every one of them")
    smallest = min((r for r in room.values() if r), default=None)
    if smallest:
        more = more_stages(sizes, smallest, fine_tune, n_stages)
        if more:
            j.ways_out.append(f"more hosts: --pipeline {more} over {more} hosts like the smallest "
                              f"here ({gib(smallest)})")
    for f in fits:
        if f.status == TOO_BIG and f.wired_limit_mb:
            host = facts[f.host]
            j.ways_out.append(f"on {f.host}: sudo sysctl iogpu.wired_limit_mb={f.wired_limit_mb} "
                              f"(gives the GPU {gib(f.wired_limit_mb * MIB)} of its "
                              f"{gib(host.memory_bytes)}; until the next reboot)")
    if fine_tune == "full":
        j.ways_out.append("--fine_tune lora (or dora; QLoRA on a quantized --init_from): the "
                          f"frozen base alone, {FULL_TRAINING_COPIES}x less than full fine-tuning")


def fitting_split(sizes: ModelBytes, rooms: Sequence[int], fine_tune: str) -> list[int] | None:
    """Blocks per stage such that stage r, with what else it holds, fits ``rooms[r]``
    bytes (the margin included); None when no contiguous split does. Greedy: each
    stage takes as many blocks as fit, leaving one for every stage after it. Taking
    more early never hurts a later stage (what is left is a suffix of what it would
    have had), so when any split fits, this one does."""
    n_stages, n_blocks = len(rooms), len(sizes.blocks)
    if n_stages > n_blocks:
        return None
    split, start = [], 0
    for index, room in enumerate(rooms):
        left_for_later = n_stages - 1 - index
        end = n_blocks if index == n_stages - 1 else start + 1
        if index < n_stages - 1:
            while end + 1 <= n_blocks - left_for_later and fits_in(sizes, range(start, end + 1),
                                                                   index, n_stages, room, fine_tune):
                end += 1
        if not fits_in(sizes, range(start, end), index, n_stages, room, fine_tune):
            return None
        split.append(end - start)
        start = end
    return split


def fits_in(sizes: ModelBytes, blocks: range, index: int, n_stages: int, room: int,
            fine_tune: str) -> bool:
    return needs(held_while_training(stage_bytes(sizes, blocks, index, n_stages), fine_tune)) <= room


def more_stages(sizes: ModelBytes, room: int, fine_tune: str, than: int) -> int | None:
    """The fewest stages, more than ``than``, whose balanced split fits hosts of ``room`` each."""
    for n in range(than + 1, len(sizes.blocks) + 1):
        plans = plan_stages(sizes, n)
        if all(needs(held_while_training(p.bytes, fine_tune)) <= room for p in plans):
            return n
    return None


def refusal_text(verdict: StagesVerdict, n_blocks: int) -> tuple[str, str]:
    """(the message, the hint) of the InputError that refuses the launch."""
    lines = ["the pipeline's stages do not all fit their hosts:",
             *(f"  {r}" for r in verdict.refusals),
             *(f"  {line}" for line in verdict.lines(n_blocks)),
             *(f"  note: {n}" for n in verdict.notes)]
    hint = "; ".join(verdict.ways_out) or "a smaller model, or hosts with more memory"
    return "\n".join(lines), "ways out: " + hint

