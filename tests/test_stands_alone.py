"""The project stands alone: a clone with nothing beside it passes its tests.

Nothing under tests/, bench/, .ci/ or the Makefile may name a path outside the
repository (the captures once came from a ../shared folder a user's clone does
not have), and every carried capture keeps the line that says where it is from.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import MACOS_FIXTURES, REPO

# What reaching outside the checkout looks like in this project's files.
OUTSIDE = re.compile(
    r"\.\./shared|shared/fixtures|shared/docs|MLXCLUSTER_SHARED"
    r"|parents\[[2-9]\]"          # climbing above the repo from tests/x.py
    r"|\.\./\.\./"                # a relative path two levels up
)


def _checked_files() -> list[Path]:
    files = [REPO / "Makefile"]
    for folder in ("tests", "bench", ".ci"):
        for path in sorted((REPO / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if MACOS_FIXTURES in path.parents:
                continue  # captured data, not paths we read
            if path == Path(__file__).resolve():
                continue  # the pattern above names what it forbids
            files.append(path)
    return files


def test_nothing_reads_outside_the_repository():
    offenders = []
    for path in _checked_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == [], "paths outside the repository:\n" + "\n".join(offenders)


def test_the_checker_catches_a_path_outside():
    # The pattern must catch what this test exists for, or the test above cannot fail.
    for bad in ('REPO / "../shared/fixtures/macos"', "p = HERE.parents[2] / 'shared'",
                "cp ../../other/x tests/"):
        assert OUTSIDE.search(bad), bad
    assert not OUTSIDE.search('REPO / "tests" / "fixtures" / "macos"')


def test_every_carried_capture_has_its_source():
    sources = (MACOS_FIXTURES / "SOURCES.md").read_text()
    captures = [p.name for p in MACOS_FIXTURES.iterdir() if p.name != "SOURCES.md"]
    assert len(captures) >= 40
    unlisted = [name for name in captures if f"| {name} |" not in sources]
    assert unlisted == []
