"""Environment checks: MLX_* variables as a non-interactive shell sees them.

mlx.launch starts ranks through ``ssh host cmd``: variables exported in a
shell rc read only by interactive shells do not reach the ranks, and ones
exported on some hosts only make the ranks behave differently.
"""

from __future__ import annotations

from mlxcluster.doctor.checks.base import CheckContext
from mlxcluster.doctor.checks.common import (
    WARN,
    Verdict,
    doctor_check,
    join_hosts,
    majority,
    probed_hosts,
    skip,
    unprobed_evidence,
    worst,
)

FAST_SYNCH = "MLX_METAL_FAST_SYNCH"


def _show(env: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "no MLX_* variables"


@doctor_check("metal-fast-synch", "MLX_METAL_FAST_SYNCH not set")
def metal_fast_synch(ctx: CheckContext) -> Verdict:
    facts = probed_hosts(ctx)
    if not facts:
        return skip("no host was probed", unprobed_evidence(ctx))
    evidence = unprobed_evidence(ctx)
    flagged = []
    for n, f in facts.items():
        value = f.inventory_env.get(FAST_SYNCH, f.env.get(FAST_SYNCH))
        if value not in (None, "", "0"):
            evidence[n] = WARN + f"{FAST_SYNCH}={value}"
            flagged.append(n)
        else:
            evidence[n] = "not set" if value is None else f"{FAST_SYNCH}={value}"
    hint = None
    if flagged:
        hint = (f"{FAST_SYNCH}=1 lowers latency but has deadlocked GPUs (mlx #3142): unset it on "
                f"{join_hosts(flagged)} unless you are measuring it")
    return Verdict(worst(False, bool(flagged)), evidence, hint)


@doctor_check("mlx-env-differs", "MLX_* environment the same on every host")
def mlx_env_differs(ctx: CheckContext) -> Verdict:
    facts = probed_hosts(ctx)
    if not facts:
        return skip("no host was probed", unprobed_evidence(ctx))
    keys = sorted({k for f in facts.values() for k in f.env})
    differing = [k for k in keys if len({f.env.get(k) for f in facts.values()}) > 1]
    evidence = unprobed_evidence(ctx)
    # Blame the hosts that differ from the most common environment.
    common = majority({n: frozenset(f.env.items()) for n, f in facts.items()})
    odd = []
    for n, f in facts.items():
        if frozenset(f.env.items()) != common:
            evidence[n] = WARN + _show(f.env)
            odd.append(n)
        else:
            evidence[n] = _show(f.env)
    hint = None
    if differing:
        hint = (f"{', '.join(differing)} differ between hosts (set by a shell rc or launchctl on some): "
                "remove them there and put what you need in the inventory env, which every launch exports")
    return Verdict(worst(False, bool(differing)), evidence, hint)
