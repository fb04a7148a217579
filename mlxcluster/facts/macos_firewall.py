"""The macOS application firewall as ``socketfilterfw`` reports it.

Parsers only (the probe runs the commands, ``probe_script.probe_firewall``);
each returns None when the text is not what the command prints. The texts,
with where each was seen (tests/fixtures/macos/SOURCES.md)::

    $ socketfilterfw --getglobalstate          # captured on a Mac, 2026-10-02
    Firewall is enabled. (State = 1)           # 0 off, 1 on, 2 block all
    Firewall stealth mode is on
    $ socketfilterfw --getblockall             # same capture
    Firewall has block all state set to disabled.
    $ socketfilterfw --getappblocked /opt/homebrew/Cellar/mosh/1.4.0_43/bin/mosh-server
    Incoming connection to /opt/homebrew/Cellar/mosh/1.4.0_43/bin/mosh-server is permitted.
    $ socketfilterfw --listapps                # Darwin 27, first entry as measured
    Total number of apps = 3
    1 : /Applications/Zoom.app
                 (Allow incoming connections)

Older macOS prints the list as ``ALF: total number of apps = 2`` with
``1 :  /path`` and `` ( Block incoming connections )`` (the form other
projects quote); both are read. ``--getappblocked`` says "permitted" of a
path the firewall has never listed (measured by three projects), so only its
"blocked" answer is believed: whether the python is listed, and how, comes
from ``--listapps``.
"""

from __future__ import annotations

import re

OFF, ON, BLOCK_ALL = 0, 1, 2

_STATE = re.compile(r"\(State = (\d+)\)")
_ENTRY = re.compile(r"^\s*(\d+)\s*:\s*(.*?)\s*$")


def parse_global_state(text: str | None) -> int | None:
    """``--getglobalstate`` -> 0 (off), 1 (on), 2 (on, block all) or None."""
    if not text:
        return None
    m = _STATE.search(text)
    if m:
        return int(m.group(1)) if m.group(1) in ("0", "1", "2") else None
    low = text.lower()
    if "blocking all" in low:
        return BLOCK_ALL
    if "firewall is disabled" in low:
        return OFF
    if "firewall is enabled" in low:
        return ON
    return None


def parse_block_all(text: str | None) -> bool | None:
    """``--getblockall`` -> whether "Block all incoming connections" is on.
    Read: ``Firewall has block all state set to disabled.`` (captured),
    ``... enabled.``, ``Block all DISABLED!`` (older), ``Firewall is set to
    block all non-essential incoming connections`` and ``Firewall is blocking
    all non-essential incoming connections.`` (newer, as other projects
    quote them)."""
    if not text:
        return None
    low = text.lower()
    if "block all" not in low and "blocking all" not in low:
        return None
    if "disabled" in low:
        return False
    if "enabled" in low or "set to block all" in low or "blocking all" in low:
        return True
    return None


def parse_listapps(text: str | None) -> list[tuple[str, bool | None]] | None:
    """``--listapps`` -> [(path, allowed)], allowed None when the entry's
    state line is missing; None when the text is not the list."""
    if not text or "total number of apps" not in text.lower():
        return None
    entries: list[tuple[str, bool | None]] = []
    for line in text.splitlines():
        if "total number of apps" in line.lower():
            continue
        m = _ENTRY.match(line)
        if m and m.group(2):
            entries.append((m.group(2), None))
            continue
        low = line.lower()
        if entries and entries[-1][1] is None:
            if "allow incoming" in low:
                entries[-1] = (entries[-1][0], True)
            elif "block incoming" in low:
                entries[-1] = (entries[-1][0], False)
    return entries


def parse_app_blocked(text: str | None, path: str) -> bool | None:
    """``--getappblocked PATH`` -> True when it says blocked; None otherwise
    ("permitted" is also said of a path the firewall never listed)."""
    if not text:
        return None
    rest = text.replace(path, " ").lower()
    return True if re.search(r"\bis blocked\b", rest) else None


def app_rule(entries: list[tuple[str, bool | None]], paths: list[str]) -> bool | None:
    """The list's rule for a program known by any of ``paths``: True
    allowed, False blocked (a blocking entry wins), None not listed. An
    entry for an ``.app`` bundle covers the programs inside it."""
    found: list[bool | None] = []
    for listed, allowed in entries:
        bundle = listed.rstrip("/") + "/" if listed.rstrip("/").endswith(".app") else None
        if listed in paths or (bundle and any(p.startswith(bundle) for p in paths)):
            found.append(allowed)
    if not found:
        return None
    return False if False in found else (True if True in found else None)
