"""Environment checks: the shell and the MLX_* variables a non-interactive
SSH session has.

mlx.launch starts ranks through ``ssh host cmd``, which sshd runs with the
user's login shell: the shell must parse what the launchers send, variables
exported in a shell rc read only by interactive shells do not reach the
ranks, and ones exported on some hosts only make the ranks behave differently.
"""

from __future__ import annotations

from mlxcluster.doctor.checks.base import CheckContext
from mlxcluster.doctor.checks.common import (
    BAD,
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
from mlxcluster.facts.shell import SHELL_FIX, parses_launch, shell_kind
from mlxcluster.inventory.inventory import LOCAL_TARGETS

FAST_SYNCH = "MLX_METAL_FAST_SYNCH"

@doctor_check("login-shell", "Login shell parses what the launchers send over ssh")
def login_shell(ctx: CheckContext) -> Verdict:
    """sshd runs every remote command with the user's login shell. fish (or
    csh, nu...) cannot parse mlx.launch's, mpirun's or mlxcluster's command
    lines: measured in the lab, mlx.launch and mpirun then hang, rank 0
    waiting for a rank that never started. A POSIX-only sh (dash) runs
    mpirun's but not mlx.launch's (that rank exits 2)."""
    facts = probed_hosts(ctx)
    if not facts:
        return skip("no host was probed", unprobed_evidence(ctx))
    evidence = unprobed_evidence(ctx)
    failing, warned, kinds = [], [], {}
    local = {h.name for h in (ctx.inventory.hosts if ctx.inventory else ()) if h.ssh in LOCAL_TARGETS}
    for n, f in facts.items():
        if n in local:
            evidence[n] = f"{f.login_shell or '?'}: not used (local ranks start without ssh)"
            continue
        kind = shell_kind(f.login_shell, f.login_shell_resolved, f.platform)
        runs = parses_launch(kind, ctx.backend)
        shown = f.login_shell or "?"
        if f.login_shell_resolved and f.login_shell_resolved != f.login_shell:
            shown += f" ({f.login_shell_resolved})"
        if kind is None:
            evidence[n] = "not reported (an older probe)"
        elif runs is False:
            evidence[n] = BAD + shown
            failing.append(n)
        elif runs is None:
            evidence[n] = WARN + shown
            warned.append(n)
        else:
            evidence[n] = shown + (": runs mpirun's commands" if kind == "posix" else "")
        kinds[n] = kind
    hint = None
    if failing or warned:
        hosts = join_hosts(failing + warned)
        posix = [n for n in failing + warned if kinds[n] == "posix"]
        if posix and len(posix) == len(failing + warned):
            what = ("mlx.launch (ring, jaccl, nccl) sends bash text (arrays, [[ ]]) that a POSIX sh "
                    "cannot parse: that rank exits 2 (mpi works)")
        else:
            what = ("mlx.launch sends bash text and mpirun and mlxcluster POSIX sh; fish, csh and "
                    "the like parse neither: mlx.launch and mpirun hang waiting for a rank that "
                    "never started, and mlxcluster cannot stop ranks there")
        hint = (f"sshd runs every remote command with the login shell; {what}. On {hosts}: "
                f"{SHELL_FIX}; Terminal can still open your shell (Terminal > Settings > "
                "General > Shells open with)")
    return Verdict(worst(bool(failing), bool(warned)), evidence, hint)


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
