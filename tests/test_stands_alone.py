"""The project stands alone: a clone with nothing beside it passes its tests.

Nothing under tests/, bench/, .ci/ or the Makefile may name a path outside the
repository (the captures once came from a `shared` folder beside the checkout, which a user's clone does
not have), and every carried capture keeps the line that says where it is from.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import MACOS_FIXTURES, REPO

# What reaching outside the checkout looks like in this project's files.
OUTSIDE = re.compile(r"\.\./shared|shared/fixtures|shared/docs|MLXCLUSTER_SHARED")
PARENTS = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]")


def climbs_out(relative: Path, line: str) -> bool:
    """``Path(__file__).resolve().parents[k]`` above the repository's top:
    for tests/lab/jobs.py parents[2] is the repo, parents[3] is outside."""
    depth = len(relative.parts) - 1
    return any(int(k) > depth for k in PARENTS.findall(line))


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
            if OUTSIDE.search(line) or climbs_out(path.relative_to(REPO), line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == [], "paths outside the repository:\n" + "\n".join(offenders)


def test_the_checker_catches_a_path_outside():
    # The pattern must catch what this test exists for, or the test above cannot fail.
    beside = "../" + "shared"  # spelled apart so that this file does not name it itself
    assert OUTSIDE.search(f'REPO / "{beside}/fixtures/macos"')
    assert not OUTSIDE.search('REPO / "tests" / "fixtures" / "macos"')
    climb = "REPO = Path(__file__).resolve().parents[2]"
    assert climbs_out(Path("tests/conftest.py"), climb)
    assert not climbs_out(Path("tests/lab/jobs.py"), climb)


def test_every_carried_capture_has_its_source():
    sources = (MACOS_FIXTURES / "SOURCES.md").read_text()
    captures = [p.name for p in MACOS_FIXTURES.iterdir() if p.name != "SOURCES.md"]
    assert len(captures) >= 40
    unlisted = [name for name in captures if f"| {name} |" not in sources]
    assert unlisted == []
