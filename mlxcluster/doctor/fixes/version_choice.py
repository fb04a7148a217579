"""Which version a version fix installs: one rule for every fix that makes a
distribution one version on the hosts (``mlx_version``, ``mlx_lm_version``)
or installs what they lack (``trainer_deps``), and the words saying which
part of it chose::

    asked for (--mlx-version X)           X            "--mlx-version"
    most hosts have one version           that one     "on 2 of 3 hosts"
    a tie, this machine's among them      this one's   "this machine's version (a tie: 1 host each)"
    a tie without this machine's          the newest   "the newest (a tie: 1 host each)"
    no host has one                       this one's   "this machine's version (no host has mlx-lm)"
                                          else none    "no host has mlx-lm, nor has this machine"

Why a tie is broken, not left to the user: with two Macs every mismatch is a
tie (1 host each), and the most common cluster is two Macs. This machine's
version goes first because it is the one the user runs and tried here; else
the newest of the tied, as pip would pick. ``--mlx-version`` still wins.
"""

from __future__ import annotations

from collections import Counter
from importlib import metadata
from typing import NamedTuple

from mlxcluster.facts.facts import version_tuple

THIS_MACHINES = "this machine's version"


class Choice(NamedTuple):
    """The version chosen (None: none could be) and which rule chose it."""

    version: str | None
    why: str

    def said(self, dist: str) -> str:
        """'mlx 0.32.4: this machine's version (a tie: 1 host each)'."""
        return f"{dist} {self.version}: {self.why}" if self.version else self.why


def version_here(dist: str) -> str | None:
    """The version of ``dist`` installed in this machine's python, or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def newest(versions) -> str:
    """The newest of ``versions`` (by their numbers; the text breaks an equal pair)."""
    return max(versions, key=lambda v: (version_tuple(v), v))


def choose_version(dist: str, versions: dict[str, str | None], *, here: str | None,
                   wanted: str | None = None, wanted_by: str = "") -> Choice:
    """The version of ``dist`` for every host, from each host's (``versions``,
    None: a host without one) and this machine's (``here``); ``wanted``
    (named ``wanted_by``) wins over all."""
    if wanted:
        return Choice(wanted, wanted_by)
    counts = Counter(v for v in versions.values() if v)
    if not counts:
        if here:
            return Choice(here, f"{THIS_MACHINES} (no host has {dist})")
        return Choice(None, f"no host has {dist}, nor has this machine")
    most = max(counts.values())
    tied = [v for v, n in counts.items() if n == most]
    if len(tied) == 1:
        return Choice(tied[0], f"on {most} of {len(versions)} hosts")
    tie = f"a tie: {most} host{'s' if most > 1 else ''} each"
    if here in tied:
        return Choice(here, f"{THIS_MACHINES} ({tie})")
    return Choice(newest(tied), f"the newest ({tie})")
