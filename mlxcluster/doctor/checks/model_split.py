"""``doctor --model DIR``: will the model split over the inventory's hosts
(one rank each, in inventory order) and fit each host's memory? The check
``mlxcluster serve`` makes before launch (``mlxcluster/fit/split.py``),
on the facts doctor probed; ``--pipeline`` judges mlx-lm's pipeline split.
Its fix raises a Mac's GPU wired-memory limit where that is what is short.
"""

from __future__ import annotations

from pathlib import Path

from mlxcluster.doctor.checks.base import CheckContext, Status
from mlxcluster.doctor.checks.common import BAD, WARN, Verdict, doctor_check, host_facts_of, skip
from mlxcluster.doctor.fixes.macos import WIRED_LIMIT_RAISE
from mlxcluster.fit.split import FITS, TOO_BIG, UNKNOWN
from mlxcluster.fit.split_check import check_split

MARKS = {FITS: "", TOO_BIG: BAD, UNKNOWN: WARN}


@doctor_check("model-split", "The model splits over the hosts and fits their memory (--model)",
              fix=WIRED_LIMIT_RAISE)
def model_split(ctx: CheckContext) -> Verdict:
    model = ctx.options.get("model")
    if not model:
        return skip("not asked for: doctor --model DIR judges serving that model over these hosts")
    facts = host_facts_of(ctx)
    placement = list(ctx.inventory.names) if ctx.inventory is not None else list(ctx.captures)
    verdict = check_split(model, placement, facts, pipeline=bool(ctx.options.get("pipeline")))
    name = Path(model).name or str(model)
    evidence = {name: verdict.summary() if verdict.ok else BAD + verdict.summary()}
    fix_data = {}
    for h in verdict.hosts:
        evidence[h.host] = MARKS[h.status] + h.line()
        f = facts.get(h.host)
        if h.wired_limit_mb and f is not None:
            fix_data[h.host] = {"wired_limit_mb": h.wired_limit_mb, "before_mb": f.gpu_wired_limit_mb or 0,
                                "model": name}
    if verdict.split_line():  # --pipeline over unequal hosts: serve places the layers by memory
        evidence["split"] = verdict.split_line()
    for i, note in enumerate(verdict.notes):
        evidence[f"note {i + 1}"] = note
    warned = any(h.status == UNKNOWN for h in verdict.hosts) or verdict.family.unknown is not None
    status = Status.FAIL if not verdict.ok else Status.WARN if warned else Status.PASS
    hint = "; ".join(verdict.ways_out) or None
    return Verdict(status, evidence, hint, fix_data if status is not Status.PASS else {})
