"""Fixes that write what a host's ranks need into the inventory's ``env``
(every launch exports it): ``MLX_MPI_LIBNAME`` where MLX alone does not find
the libmpi the probe found (``libmpi-by-hand``), and the OpenBLAS preload on
Linux hosts whose mlx runs the reference BLAS (``reference-blas``).

The value goes to the cluster's ``env`` when every host wants the same one,
else to each host's own; the file is edited in place (``inventory_edit``:
comments and order kept), with a ``.bak`` beside it.
"""

from __future__ import annotations

import shlex

from mlxcluster.doctor.fixes.plan import Action, Fix, FixInput
from mlxcluster.facts.blas import OPENBLAS_CANDIDATES, with_openblas


def env_actions(check: str, inventory, wanted: dict[str, tuple[str, str]], why: str) -> list[Action]:
    """One action per (key, value) the hosts want: for the whole cluster when
    every inventory host wants it, else per host."""
    path = inventory.path
    everyone = set(inventory.names)
    by_pair: dict[tuple[str, str], list[str]] = {}
    for host, pair in wanted.items():
        by_pair.setdefault(pair, []).append(host)
    actions = []
    for (key, value), hosts in by_pair.items():
        targets = [None] if set(hosts) == everyone and len(by_pair) == 1 else hosts
        for target in targets:
            for_hosts = tuple(hosts) if target is None else (target,)
            where = "env" if target is None else f"hosts[{target}].env"
            actions.append(Action(
                check, for_hosts, "inventory-env", f"inventory {where}: {key}={value} ({why})",
                [f"edit {path}: {where}.{key}: {value!r} (the file before: {path}.bak)"],
                where="here", params={"path": path, "host": target, "key": key, "value": value}))
    return actions


def plan_libmpi(fix: FixInput) -> list[Action]:
    wanted = {h: ("MLX_MPI_LIBNAME", d["MLX_MPI_LIBNAME"]) for h, d in fix.result.fix_data.items()}
    return env_actions(fix.result.id, fix.inventory, wanted,
                       "MLX alone does not find it: mpirun and mlx.launch by hand")


LIBMPI_ENV = Fix("MLX_MPI_LIBNAME in the inventory env", plan_libmpi)


FIND_OPENBLAS = "sh -c " + shlex.quote(
    "for p in " + " ".join(shlex.quote(p) for p in OPENBLAS_CANDIDATES)
    + '; do if [ -f "$p" ]; then echo "$p"; break; fi; done; true')


def plan_openblas(fix: FixInput) -> list[Action]:
    """LD_PRELOAD of the host's OpenBLAS, looked up on each host (the probe
    does not say where it is); a host without one is left (install it)."""
    wanted = {}
    for host in fix.result.fix_data:
        if fix.lookup is None:
            continue
        found = fix.lookup(host, FIND_OPENBLAS)
        path = found.stdout.strip().splitlines()[0] if found.exit_status == 0 and found.stdout.strip() else None
        if path:
            env = fix.inventory.host(host).env
            wanted[host] = ("LD_PRELOAD", with_openblas(env, path)["LD_PRELOAD"])
    return env_actions(fix.result.id, fix.inventory, wanted, "mlx's matmuls on OpenBLAS, not the reference BLAS")


OPENBLAS_PRELOAD = Fix("the OpenBLAS preload in the inventory env", plan_openblas)
