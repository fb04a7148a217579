"""Which inventory a command uses when the user types none.

People type ``mlxcluster doctor`` and ``mlxcluster smoke --backend jaccl``
with no ``-i``. The inventory is then found in this order, and the first one
that applies wins:

1. ``-i PATH`` on the command line;
2. ``$MLXCLUSTER_INVENTORY`` (a path; it must exist when set: a variable
   naming a missing file is a mistake to report, not a reason to look further);
3. ``./cluster.yaml`` in the current directory (what ``mlxcluster discover
   --write cluster.yaml`` writes);
4. ``cluster.yaml`` in the user config folder:
   ``$XDG_CONFIG_HOME/mlxcluster/cluster.yaml``, else
   ``~/.config/mlxcluster/cluster.yaml``.

Nothing here prints: the CLI names the file it found (docs/inventory.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlxcluster.errors import InputError

ENV_VAR = "MLXCLUSTER_INVENTORY"
DEFAULT_NAME = "cluster.yaml"
WRITE_ONE = f"mlxcluster discover --write {DEFAULT_NAME}"


@dataclass(frozen=True)
class InventoryChoice:
    """The inventory a command will load, and why that one."""

    path: Path
    source: str  # "-i", "$MLXCLUSTER_INVENTORY", "current directory", "user config folder"

    @property
    def given(self) -> bool:
        """True when the user named the file on the command line."""
        return self.source == "-i"

    def describe(self) -> str:
        """'inventory: ./cluster.yaml (current directory)', as the CLI shows it."""
        shown = str(self.path)
        if not self.path.is_absolute() and not shown.startswith("."):
            shown = f"./{shown}"
        return f"inventory: {shown} ({self.source})"


def user_config_inventory(env: Mapping[str, str]) -> Path:
    """cluster.yaml in the user config folder (XDG base directory rules)."""
    base = env.get("XDG_CONFIG_HOME", "")
    # The XDG spec says a relative XDG_CONFIG_HOME is invalid and to be ignored.
    folder = Path(base) if base and Path(base).is_absolute() else Path(env.get("HOME") or Path.home()) / ".config"
    return folder / "mlxcluster" / DEFAULT_NAME


def find_inventory(given: str | os.PathLike | None, *, env: Mapping[str, str] | None = None,
                   cwd: Path | None = None, other_sources: str = "") -> InventoryChoice:
    """The inventory to load: ``given`` (-i) if any, else the first default
    that applies (module docstring). Raises InputError listing every place
    looked at, and the command that writes one, when there is none;
    ``other_sources`` ("--hostfile FILE or --local N"), what else the command
    takes, joins its hint."""
    try:
        return _find_inventory(given, os.environ if env is None else env, cwd)
    except InputError as err:
        if other_sources:
            err.hint = f"{err.hint}; or give {other_sources}"
        raise


def _find_inventory(given: str | os.PathLike | None, env: Mapping[str, str],
                    cwd: Path | None) -> InventoryChoice:
    if given is not None and str(given) != "":
        return InventoryChoice(Path(given), "-i")
    from_env = env.get(ENV_VAR, "")
    if from_env:
        path = Path(from_env)
        if not path.is_file():
            raise InputError(f"${ENV_VAR} names {from_env}, which is not a file",
                             f"fix or unset {ENV_VAR}, or pass -i PATH")
        return InventoryChoice(path, f"${ENV_VAR}")
    here = Path(DEFAULT_NAME) if cwd is None else cwd / DEFAULT_NAME
    if here.is_file():
        return InventoryChoice(here, "current directory")
    user = user_config_inventory(env)
    if user.is_file():
        return InventoryChoice(user, "user config folder")
    looked = ["-i (not given)", f"${ENV_VAR} (not set)", f"./{DEFAULT_NAME}", str(user)]
    raise InputError(
        "no inventory: none given and none found; looked at " + ", ".join(looked),
        f"write one with '{WRITE_ONE}' (see docs/inventory.md), or pass -i PATH",
    )
