"""The fix for ``mlx-lm-version``: one mlx-lm on every host, for a job that
runs it (``mlxcluster run -- -m mlx_lm ...``, ``doctor --fix --imports mlx_lm``).

mlx-lm X goes into the inventory's python of each host that has another
version or none; X is the version most hosts have, on a tie this machine's
when it is one of them, else the newest of them, and with no host having
it, this machine's (``version_choice``, as for mlx). Fetched, sent and installed as
mlx is (``same_version``), but X with its dependencies (transformers,
sentencepiece...: a host without mlx-lm gets them from the wheels sent)::

    here:    python -m pip download mlx-lm==0.32.2 --only-binary=:all: --platform ... \\
                 -d ~/.cache/mlxcluster/wheels/mlx_lm-0.32.2/macosx_14_0_arm64-cp312
    on host: PY -m pip install --isolated --disable-pip-version-check --no-index \\
                 --find-links "$HOME/.cache/mlxcluster/wheels" mlx-lm==0.32.2 \\
                 $(PY -c 'import importlib.metadata as m; print("mlx==" + m.version("mlx"))' 2>/dev/null)

The host's mlx is never changed: mlx-lm requires mlx on macOS, so the
download may bring an mlx wheel, but the install pins mlx to the version
the host has when it runs (mlx's own fix, applied just before, may have
changed it); an X that needs another mlx fails there and changes nothing.
The undo installs the previous version from the wheels sent (fetched
without dependencies: the host has them), or, where there was none,
uninstalls what pip said it installed.
"""

from __future__ import annotations

from mlxcluster.doctor.fixes.plan import Action, Fix, FixInput
from mlxcluster.doctor.fixes.same_version import Package, plan_hosts, register
from mlxcluster.doctor.fixes.version_choice import Choice, choose_version, version_here

DIST = "mlx-lm"
MLX_LM = register(Package(DIST, "mlx-lm-install", f"no {DIST}", deps=True, keep="mlx", undo_new=True))


def choose(versions: dict[str, str | None]) -> Choice:
    """X for the hosts' versions (None: a host without mlx-lm), with this machine's."""
    return choose_version(DIST, versions, here=version_here(DIST))


def plan_mlx_lm(fix: FixInput) -> list[Action]:
    """One action per host the check blamed, all to the X it chose (in each
    host's ``to``, and why in ``why``)."""
    data = fix.result.fix_data
    targets = {(d.get("to"), d.get("why", "")) for d in data.values()}
    if len(targets) != 1 or None in {to for to, _ in targets}:
        return []
    return plan_hosts(fix, MLX_LM, Choice(*targets.pop()), {name: d.get("version") for name, d in data.items()})


SAME_MLX_LM = Fix("mlx-lm X (the most hosts', a tie to this machine's or the newest) installed from wheels "
                  "fetched here, with its dependencies", plan_mlx_lm)
