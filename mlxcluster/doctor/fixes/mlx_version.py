"""The fix for ``mlx-version``: one mlx on every host.

mlx X goes into the inventory's python on each host that has another (or
none that imports); X is the version most hosts have, or ``doctor --fix
--mlx-version X``. Macs linked only by Thunderbolt often cannot reach a
package index, so the wheels are fetched once, here, for each host's
platform and Python (what the probe reported), then sent over the same SSH
connection and installed from the file::

    here:    python -m pip download mlx==0.32.4 mlx-metal==0.32.4 --no-deps --only-binary=:all: \\
                 --platform macosx_14_0_arm64 --python-version 3.12 --implementation cp --abi cp312 \\
                 -d ~/.cache/mlxcluster/wheels/mlx-0.32.4/macosx_14_0_arm64-cp312
    send:    each wheel the host lacks, by sha256, into ~/.cache/mlxcluster/wheels on the host
    on host: PY -m pip install --isolated --disable-pip-version-check --no-index \\
                 --find-links "$HOME/.cache/mlxcluster/wheels" mlx==0.32.4 mlx-metal==0.32.4

On macOS mlx's wheel needs ``mlx-metal`` (its ``Requires-Dist``, for
``platform_system == "Darwin"``), on Linux ``mlx[cpu]`` needs ``mlx-cpu``:
both are fetched with ``--no-deps`` by name (pip here, on Linux, would
skip the Darwin one). The version the host had is fetched and sent as
well, before anything changes: the undo is the same install of that version
from the host's own copy. A host whose Python (major.minor) differs from
the others' is not changed: mlx's wheels are per Python version and this
fix does not change a host's Python (the check's hint says what to do).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlxcluster.doctor.fixes.apply import APPLIERS, ApplyContext
from mlxcluster.doctor.fixes.plan import Action, Fix, FixInput
from mlxcluster.errors import InputError

PACKAGE = "mlx"
COMPANION = {"Darwin": "mlx-metal", "Linux": "mlx-cpu"}  # what mlx's wheel needs there
HOST_WHEELS = ".cache/mlxcluster/wheels"  # under the host's $HOME
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
    raise ValueError(f"no mlx wheels for {t.system}")


def requirements(system: str, version: str) -> list[str]:
    return [f"{PACKAGE}=={version}", f"{COMPANION[system]}=={version}"]


def wheel_key(t: Target) -> str:
    """The cache folder of one platform and Python: macosx_14_0_arm64-cp312."""
    return f"{platform_tags(t)[0]}-cp{python_minor(t.python_version).replace('.', '')}"


def download_argv(python: str, t: Target, version: str, dest: str) -> list[str]:
    """``pip download`` of mlx X and its companion for ``t``, run here."""
    cp = "cp" + python_minor(t.python_version).replace(".", "")
    argv = [python, "-m", "pip", "download", *requirements(t.system, version), "--no-deps",
            "--only-binary=:all:"]
    for tag in platform_tags(t):
        argv += ["--platform", tag]
    return argv + ["--python-version", python_minor(t.python_version), "--implementation", "cp",
                   "--abi", cp, "--disable-pip-version-check", "-d", dest]


def install_command(python: str, system: str, version: str) -> str:
    """The install on the host, from the wheels sent there (no index;
    ``--isolated``: no pip config or PIP_* variable of the host's adds other
    links or constraints)."""
    words = [shlex.quote(python), "-m", "pip", "install", "--isolated", "--disable-pip-version-check",
             "--no-index", "--find-links", f'"$HOME/{HOST_WHEELS}"',
             *(shlex.quote(r) for r in requirements(system, version))]
    return " ".join(words)


def wheel_cache(environ: dict[str, str] | None = None) -> Path:
    """Where the wheels are fetched here: ``$XDG_CACHE_HOME/mlxcluster/wheels`` (else ``~/.cache``)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or str(Path.home()), ".cache")
    return Path(base) / "mlxcluster" / "wheels"


def choose_version(versions: dict[str, str | None], wanted: str | None = None) -> tuple[str | None, str]:
    """(X, why): ``wanted`` when given, else the version most hosts have; on
    a tie none (the user picks with --mlx-version)."""
    if wanted:
        return wanted, "--mlx-version"
    counts = Counter(v for v in versions.values() if v)
    if not counts:
        return None, "no host has an mlx that imports: pass --mlx-version"
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        tied = [v for v, n in ranked if n == ranked[0][1]]
        return None, (" and ".join(f"mlx {v} ({', '.join(h for h, hv in versions.items() if hv == v)})"
                                   for v in tied) + " are as common: pass --mlx-version " + " or ".join(tied))
    return ranked[0][0], f"on {ranked[0][1]} of {len(versions)} hosts"


def available_versions(python: str = sys.executable, timeout: float = 120.0) -> list[str]:
    """mlx's versions on the package index pip here uses (``pip index versions``)."""
    p = subprocess.run([python, "-m", "pip", "index", "versions", PACKAGE, "--disable-pip-version-check"],
                       capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    found = re.search(r"^Available versions:\s*(.+)$", p.stdout, re.M)
    if p.returncode != 0 or not found:
        why = (p.stderr or p.stdout).strip().splitlines()
        raise InputError(f"could not ask the package index for mlx's versions: {why[-1] if why else p.returncode}",
                         "--fix fetches the wheels on this machine: it needs a package index (PyPI) here")
    return [v.strip() for v in found.group(1).split(",")]


def check_mlx_version(version: str, versions=None) -> None:
    """InputError (exit 2, before any host is probed) for a version the index
    does not have; ``versions``: what lists them (``available_versions``)."""
    known = (versions or available_versions)()
    if version not in known:
        raise InputError(f"mlx {version} is not on the package index",
                         f"its versions: {', '.join(known[:8])}{' ...' if len(known) > 8 else ''}")


def target_of(d: dict[str, Any]) -> Target:
    return Target(d["system"], d["machine"], d["python_version"], d.get("os_version"), d.get("libc"))


def plan_mlx(fix: FixInput) -> list[Action]:
    """One action per host not on X (python like the others'); nothing on a tie."""
    data = fix.result.fix_data
    version, _ = choose_version({h: d.get("mlx") for h, d in data.items()}, fix.options.get("mlx_version"))
    if version is None:
        return []
    here = sys.executable
    actions = []
    for name, d in data.items():
        if d.get("mlx") == version or d.get("python_refused"):
            continue
        try:
            t = target_of(d)
            key = wheel_key(t)
        except (KeyError, TypeError, ValueError):
            continue  # the probe does not say which wheels run there: left, with the check's hint
        host = fix.inventory.host(name)
        python = host.python or d["python"]  # the inventory's python (the probe ran it)
        previous = d.get("mlx") or d.get("installed")
        cache = str(wheel_cache())
        downloads = [download_argv(here, t, v, f"{cache}/mlx-{v}/{key}")
                     for v in dict.fromkeys([version, previous]) if v]
        before = f"mlx {previous}" if previous else "no mlx that imports"
        back = "" if previous else " (no way back: the version there is unknown)"
        actions.append(Action(
            fix.result.id, (name,), "mlx-install",
            f"{before} -> mlx {version} in {python} ({t.system} {t.machine}, Python "
            f"{python_minor(t.python_version)}){back}",
            [f"here: {shlex.join(a)}" for a in downloads]
            + [f"send to {name}: the wheels it lacks, into ~/{HOST_WHEELS}",
               f"on {name}: {install_command(python, t.system, version)}"],
            where="hosts",
            params={"ssh": host.ssh, "user": host.user, "port": host.port, "python": python,
                    "version": version, "previous": previous, "target": asdict(t), "key": key}))
    return actions


# ---- applying ----

def fetch(argv: list[str], dest: Path, timeout: float) -> None:
    """Run pip download here into ``dest``."""
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"pip download failed here (exit {p.returncode}): "
                           + " ".join((p.stderr or p.stdout).strip().splitlines()[-2:]))


def wheels_in(dest: Path, system: str, version: str) -> list[Path]:
    """The wheels of ``requirements(system, version)`` in ``dest`` (each name once)."""
    found = []
    for req in requirements(system, version):
        name = req.split("==")[0].replace("-", "_")
        hits = sorted(dest.glob(f"{name}-{version}-*.whl"))
        if hits:
            found.append(hits[0])
    return found


def fetched(t: Target, version: str, key: str, timeout: float) -> list[Path]:
    """Both wheels for ``t``, fetched once into the cache here."""
    dest = wheel_cache() / f"mlx-{version}" / key
    have = wheels_in(dest, t.system, version)
    if len(have) < 2:
        dest.mkdir(parents=True, exist_ok=True)
        fetch(download_argv(sys.executable, t, version, str(dest)), dest, timeout)
        have = wheels_in(dest, t.system, version)
    if len(have) < 2:
        raise RuntimeError(f"pip download left {len(have)} of the 2 wheels of mlx {version} in {dest}")
    return have


# On the host: which wheels it has (by sha256), or receive the named ones on
# stdin, one after another, each verified before it is renamed into place.
RECEIVE = r"""
import hashlib, json, os, sys
spec = json.loads(sys.argv[1])
d = os.path.join(os.path.expanduser("~"), spec["dir"])
os.makedirs(d, exist_ok=True)
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()
if spec["op"] == "have":
    print(json.dumps([w["name"] for w in spec["wheels"]
                      if os.path.isfile(os.path.join(d, w["name"])) and sha(os.path.join(d, w["name"])) == w["sha256"]]))
    sys.exit(0)
for w in spec["wheels"]:
    part, h, left = os.path.join(d, "." + w["name"] + ".part"), hashlib.sha256(), w["bytes"]
    with open(part, "wb") as out:
        while left:
            b = sys.stdin.buffer.read(min(1 << 20, left))
            if not b:
                break
            out.write(b); h.update(b); left -= len(b)
    if left or h.hexdigest() != w["sha256"]:
        os.unlink(part)
        sys.exit(w["name"] + (": the stream ended %d bytes early" % left if left else ": sha256 differs"))
    os.replace(part, os.path.join(d, w["name"]))
print(json.dumps([w["name"] for w in spec["wheels"]]))
"""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            h.update(piece)
    return h.hexdigest()


def _spec(op: str, wheels: list[Path]) -> dict[str, Any]:
    return {"op": op, "dir": HOST_WHEELS,
            "wheels": [{"name": w.name, "bytes": w.stat().st_size, "sha256": _sha256(w)} for w in wheels]}


def _python_c(python: str, spec: dict[str, Any]) -> str:
    return " ".join(shlex.quote(w) for w in (python, "-c", RECEIVE, json.dumps(spec, sort_keys=True)))


class _Chain:
    """Files read one after another as one binary stream (stdin for RECEIVE)."""

    def __init__(self, paths: list[Path]):
        self.paths, self.f = list(paths), None

    def read(self, n: int = -1) -> bytes:
        while self.paths or self.f:
            if self.f is None:
                self.f = open(self.paths.pop(0), "rb")
            b = self.f.read(n)
            if b:
                return b
            self.f.close()
            self.f = None
        return b""


def send_wheels(ctx: ApplyContext, p: dict[str, Any], wheels: list[Path], log: list[str]) -> int:
    """Send the wheels the host lacks (by sha256); the number sent."""
    where = dict(user=p.get("user"), port=p.get("port"))
    have = ctx.runner.run(p["ssh"], _python_c(p["python"], _spec("have", wheels)), timeout=ctx.timeout, **where)
    if have.exit_status != 0:
        raise RuntimeError(f"{p['ssh']}: could not list its wheels: {(have.stderr or have.stdout).strip()}")
    present = set(json.loads(have.stdout.strip().splitlines()[-1]))
    lacking = [w for w in wheels if w.name not in present]
    if lacking:
        sent = ctx.runner.run(p["ssh"], _python_c(p["python"], _spec("receive", lacking)), stdin=_Chain(lacking),
                              timeout=max(ctx.timeout, SEND_TIMEOUT), **where)
        if sent.exit_status != 0:
            raise RuntimeError(f"{p['ssh']}: the wheels did not arrive whole: {(sent.stderr or sent.stdout).strip()}")
    log.append(f"sent {len(lacking)} wheel(s) ({', '.join(w.name for w in lacking) or 'the host had them'})")
    return len(lacking)


def apply_mlx_install(action: Action, ctx: ApplyContext) -> dict[str, Any]:
    """Fetch (here, once) the wheels of X and of the version the host had,
    send what it lacks, install X from them; the undo installs the old one
    the same way."""
    p = action.params
    t = Target(**p["target"])
    log: list[str] = []
    versions = [v for v in dict.fromkeys([p["version"], p.get("previous")]) if v]
    wheels = [w for v in versions for w in fetched(t, v, p["key"], max(ctx.timeout, FETCH_TIMEOUT))]
    send_wheels(ctx, p, wheels, log)
    command = install_command(p["python"], t.system, p["version"])
    result = ctx.runner.run(p["ssh"], command, user=p.get("user"), port=p.get("port"), timeout=ctx.timeout)
    log.append(f"$ {command}\n{(result.stdout + result.stderr).strip()}".rstrip())
    if result.exit_status != 0:
        log.append(f"(exit {result.exit_status})")
        return {"status": "failed", "output": "\n".join(log), "undo": None}
    undo = None
    if p.get("previous"):
        undo = {"kind": "remote", "ssh": p["ssh"], "user": p.get("user"), "port": p.get("port"),
                "commands": [install_command(p["python"], t.system, p["previous"])]}
    return {"status": "applied", "output": "\n".join(log), "undo": undo}


APPLIERS["mlx-install"] = apply_mlx_install

SAME_MLX = Fix("mlx X (the most hosts' or --mlx-version) installed from wheels fetched here", plan_mlx)
