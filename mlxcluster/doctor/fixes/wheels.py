"""Wheels fetched here, sent over SSH, installed from the file on a host.

What the fixes that install python packages share (``mlx_version`` and
``mlx_lm_version``: one version everywhere, ``same_version``;
``trainer_deps``: what the trainer imports). Macs linked
only by Thunderbolt often reach no package index, so the wheels are fetched
once, here, for each host's platform and Python (what the probe reported),
then sent over the same SSH connection and installed with no index::

    here:    python -m pip download REQ... --only-binary=:all: --platform macosx_14_0_arm64 \\
                 --python-version 3.12 --implementation cp --abi cp312 -d ~/.cache/mlxcluster/wheels/...
    send:    each wheel the host lacks, by sha256, into ~/.cache/mlxcluster/wheels on the host
             (mlxcluster.transfer's agent checks it there before it is put in place)
    on host: PY -m pip install --isolated --disable-pip-version-check --no-index \\
                 --find-links "$HOME/.cache/mlxcluster/wheels" REQ...
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlxcluster.doctor.fixes.apply import ApplyContext
from mlxcluster.doctor.fixes.plan import Action, FixInput
from mlxcluster.transfer.link import RunnerLink, TransferError
from mlxcluster.transfer.manifest import files_manifest
from mlxcluster.transfer.send import check, send

HOST_WHEELS = ".cache/mlxcluster/wheels"  # under the host's $HOME
DEPS_DONE = ".with-dependencies"  # in a fetch folder: its requirements were fetched with their dependencies
FETCH_TIMEOUT = 900.0  # pip download of a ~45 MB mlx-metal wheel per platform
SEND_TIMEOUT = 900.0
OLDEST_MANYLINUX = 17  # manylinux_2_17 (manylinux2014): the oldest glibc pip's tags go down to


@dataclass(frozen=True)
class Target:
    """What picks a host's wheels: its kernel, CPU, OS or C library, Python."""

    system: str  # Darwin, Linux (uname -s)
    machine: str  # arm64, x86_64, aarch64
    python_version: str  # 3.12.4
    os_version: str | None = None  # macOS ProductVersion (sw_vers)
    libc: str | None = None  # Linux: "glibc 2.36"


def target_of(d: dict[str, Any]) -> Target:
    """The Target in a check's fix_data for one host."""
    return Target(d["system"], d["machine"], d["python_version"], d.get("os_version"), d.get("libc"))


def target_data(f) -> dict[str, Any]:
    """What ``target_of`` reads, from a host's facts (``HostFacts``)."""
    system = (f.platform or "").capitalize() if f.platform in ("darwin", "linux") else None
    return {"python": f.python, "python_version": f.python_version, "system": system,
            "machine": f.machine, "os_version": f.os_version, "libc": f.libc}


def python_minor(version: str | None) -> str | None:
    """'3.12.4' -> '3.12'."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def platform_tags(t: Target) -> list[str]:
    """The ``--platform`` values pip download needs for this host, best first.

    macOS: ``macosx_MAJOR_0_ARCH`` from sw_vers's version (pip itself widens it
    to the older macOS releases, as pip on the host would). Linux: every
    ``manylinux_2_N_ARCH`` the host's glibc runs, newest first (pip does not
    widen those)."""
    if t.system == "Darwin":
        if not t.os_version:
            raise ValueError("the host's macOS version is unknown (no sw_vers)")
        parts = [int(p) for p in re.findall(r"\d+", t.os_version)[:2]] + [0]
        major, minor = parts[0], (0 if parts[0] >= 11 else parts[1])
        return [f"macosx_{major}_{minor}_{t.machine}"]
    if t.system == "Linux":
        m = re.match(r"glibc (\d+)\.(\d+)", t.libc or "")
        if not m:
            raise ValueError(f"the host's C library is unknown or not glibc ({t.libc or 'not probed'})")
        top = int(m.group(2))
        return [f"manylinux_{m.group(1)}_{n}_{t.machine}" for n in range(top, OLDEST_MANYLINUX - 1, -1)]
    raise ValueError(f"no wheels for {t.system} (macOS and Linux only)")


def wheel_key(t: Target) -> str:
    """The cache folder of one platform and Python: macosx_14_0_arm64-cp312."""
    return f"{platform_tags(t)[0]}-cp{python_minor(t.python_version).replace('.', '')}"


def wheel_cache(environ: dict[str, str] | None = None) -> Path:
    """Where the wheels are fetched here: ``$XDG_CACHE_HOME/mlxcluster/wheels`` (else ``~/.cache``)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or str(Path.home()), ".cache")
    return Path(base) / "mlxcluster" / "wheels"


def download_argv(python: str, t: Target, requirements: list[str], dest: str, *, deps: bool = False) -> list[str]:
    """``pip download`` of ``requirements`` (their dependencies too with
    ``deps``) for ``t``, run here."""
    cp = "cp" + python_minor(t.python_version).replace(".", "")
    argv = [python, "-m", "pip", "download", *requirements, *([] if deps else ["--no-deps"]),
            "--only-binary=:all:"]
    for tag in platform_tags(t):
        argv += ["--platform", tag]
    return argv + ["--python-version", python_minor(t.python_version), "--implementation", "cp",
                   "--abi", cp, "--disable-pip-version-check", "-d", dest]


def pip_command(python: str, verb: str, *words: str) -> str:
    """``PY -m pip VERB ...`` on a host: ``--isolated`` (no pip config or PIP_*
    variable of the host's adds other links or constraints)."""
    return " ".join([shlex.quote(python), "-m", "pip", verb, "--isolated", "--disable-pip-version-check", *words])


def install_command(python: str, requirements: list[str], keep: str | None = None) -> str:
    """The install on the host, from the wheels sent there (no index);
    ``keep``: a distribution left at the version the host has (``kept_as_installed``)."""
    return pip_command(python, "install", "--no-index", "--find-links", f'"$HOME/{HOST_WHEELS}"',
                       *(shlex.quote(r) for r in requirements), *([kept_as_installed(python, keep)] if keep else []))


def kept_as_installed(python: str, dist: str) -> str:
    """Shell words for a pip install on the host: ``dist==V``, V the version
    installed there when the command runs, or nothing where it is not
    installed. pip then fails rather than replace it to satisfy a
    requirement. Read when the install runs, not when the plan is made: a fix
    applied just before (mlx's) may have changed it. One word: zsh does not
    split a command's output into words."""
    code = f'import importlib.metadata as m; print("{dist}==" + m.version("{dist}"))'
    return f"$({shlex.quote(python)} -c {shlex.quote(code)} 2>/dev/null)"


@dataclass(frozen=True)
class InstallHost:
    """A host a fix installs on: its inventory entry, python and wheels."""

    name: str
    host: Any  # mlxcluster.inventory.inventory.Host
    python: str  # the inventory's python (the probe ran it)
    target: Target
    key: str  # wheel_key(target)


def install_host(fix: FixInput, name: str, d: dict[str, Any]) -> InstallHost | None:
    """The host ``name`` of a check's ``fix_data`` (``d``); None when the
    probe does not say which wheels run there (left, with the check's hint)."""
    try:
        t = target_of(d)
        key = wheel_key(t)
    except (KeyError, TypeError, ValueError):
        return None
    host = fix.inventory.host(name)
    return InstallHost(name, host, host.python or d["python"], t, key)


def install_action(fix: FixInput, h: InstallHost, kind: str, what: str, downloads: list[list[str]],
                   install: str, params: dict[str, Any], note: str = "") -> Action:
    """One host's install: ``what`` changes in its python, the ``downloads``
    here, the send, the ``install`` there; ``params`` for the applier (with
    where the host is, its python, target and key)."""
    t = h.target
    return Action(
        fix.result.id, (h.name,), kind,
        f"{what} in {h.python} ({t.system} {t.machine}, Python {python_minor(t.python_version)}){note}",
        [f"here: {shlex.join(a)}" for a in downloads]
        + [f"send to {h.name}: the wheels it lacks, into ~/{HOST_WHEELS}", f"on {h.name}: {install}"],
        where="hosts",
        params={"ssh": h.host.ssh, "user": h.host.user, "port": h.host.port, "python": h.python,
                "target": asdict(t), "key": h.key, **params})


def fetch(argv: list[str], dest: Path, timeout: float) -> None:
    """Run pip download here into ``dest``."""
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"pip download failed here (exit {p.returncode}): "
                           + " ".join((p.stderr or p.stdout).strip().splitlines()[-2:]))


def normalized(name: str) -> str:
    """A distribution's name as wheel files spell it (PEP 427/503: PyYAML -> pyyaml)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_of(dest: Path, name: str, version: str | None) -> Path | None:
    """The wheel of ``name`` ``version`` (None: any) in ``dest`` (any
    spelling of the name), or None."""
    for path in sorted(dest.glob("*.whl")) if dest.is_dir() else []:
        parts = path.name.split("-")
        if len(parts) >= 3 and normalized(parts[0]) == normalized(name) and version in (None, parts[1]):
            return path
    return None


def fetch_dir(dist: str, version: str | None, key: str) -> Path:
    """Where one distribution's wheels (its dependencies too, when fetched
    with them) for one platform and Python are fetched here:
    ``.../wheels/mlx_lm-0.32.2/macosx_14_0_arm64-cp312``."""
    return wheel_cache() / f"{normalized(dist)}-{version or 'newest'}" / key


def fetched(t: Target, requirements: list[str], dest: Path, timeout: float, *, deps: bool = False) -> list[Path]:
    """The wheels of ``requirements`` (``NAME==V`` or ``NAME``) for ``t``,
    fetched once into ``dest`` here; with ``deps`` every wheel there (their
    dependencies too: a folder fetched without them is fetched again)."""
    def lacking() -> list[str]:
        return [r for r in requirements if wheel_of(dest, *_name_version(r)) is None]

    if lacking() or (deps and not (dest / DEPS_DONE).exists()):
        dest.mkdir(parents=True, exist_ok=True)
        fetch(download_argv(sys.executable, t, requirements, str(dest), deps=deps), dest, timeout)
        if deps:
            (dest / DEPS_DONE).touch()
    if lacking():
        raise RuntimeError(f"pip download left no wheel of {', '.join(lacking())} in {dest}")
    return sorted(dest.glob("*.whl")) if deps else [wheel_of(dest, *_name_version(r)) for r in requirements]


def _name_version(requirement: str) -> tuple[str, str | None]:
    name, _, version = requirement.partition("==")
    return name, version or None


def installed_by(output: str) -> list[str]:
    """The distributions pip's ``Successfully installed A-1.0 b-c-2.0`` line names."""
    found = re.search(r"^Successfully installed (.+)$", output, re.M)
    return [word.rsplit("-", 1)[0] for word in found.group(1).split()] if found else []


def remote_undo(p: dict[str, Any], commands: list[str]) -> dict[str, Any]:
    """The journal's undo: ``commands`` on the action's host."""
    return {"kind": "remote", "ssh": p["ssh"], "user": p.get("user"), "port": p.get("port"), "commands": commands}


def uninstall_undo(p: dict[str, Any], output: str) -> dict[str, Any] | None:
    """The undo of an install that found nothing there before: uninstall
    exactly what pip said (``output``) it installed; None when it installed nothing."""
    new = installed_by(output)
    return remote_undo(p, [pip_command(p["python"], "uninstall", "-y", *(shlex.quote(n) for n in new))]) if new else None


def send_wheels(ctx: ApplyContext, p: dict[str, Any], wheels: list[Path], log: list[str]) -> int:
    """Send the wheels the host lacks (by sha256, mlxcluster.transfer over the
    doctor's connection); the number sent."""
    link = RunnerLink(p["ssh"], p["python"], ctx.runner, p.get("user"), p.get("port"))
    manifest = files_manifest(f"~/{HOST_WHEELS}", wheels)
    try:
        copy = check(link, manifest, what="the wheels in", timeout=ctx.timeout)
    except TransferError as err:
        raise RuntimeError(err.message) from None
    lacking = copy.lacking(manifest)
    if lacking:
        try:
            send(manifest, copy, lambda n: None, use_rsync=False,
                 timeout=max(ctx.timeout, SEND_TIMEOUT))
        except TransferError as err:
            raise RuntimeError(f"{p['ssh']}: the wheels did not arrive whole: {err.message}") from None
    log.append(f"sent {len(lacking)} wheel(s) ({', '.join(w.name for w in lacking) or 'the host had them'})")
    return len(lacking)


def send_and_install(ctx: ApplyContext, p: dict[str, Any], wheels: list[Path], command: str,
                     log: list[str]) -> tuple[bool, str]:
    """Send what the host lacks of ``wheels``, then run ``command`` (the
    install) there; (it exited 0, its output). Every step is added to ``log``."""
    send_wheels(ctx, p, wheels, log)
    result = ctx.runner.run(p["ssh"], command, user=p.get("user"), port=p.get("port"), timeout=ctx.timeout)
    output = (result.stdout + result.stderr).strip()
    log.append(f"$ {command}\n{output}".rstrip())
    if result.exit_status != 0:
        log.append(f"(exit {result.exit_status})")
    return result.exit_status == 0, output
