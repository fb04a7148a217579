"""Every `mlxcluster ...` command line in README.md and docs/ names only
options its command has, as a link checker checks links: a flag renamed or
removed in the CLI fails here until the docs say the new one. (Lines that
show a refusal, followed by the `error:` they get, are examples of a typo.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from mlxcluster.cli import COMMAND_MODULES
from mlxcluster.cli import main as cli

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *REPO.glob("docs/*.md")])
INLINE = re.compile(r"`(mlxcluster [^`]+)`")


def command_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command) for each mlxcluster command: typed in a code
    block (``$ `` or not) or quoted inline; not one a block shows refused."""
    found, in_block = [], False
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            typed = line.strip().removeprefix("$ ")
            refused = n < len(lines) and lines[n].startswith("error: No such option")
            if typed.startswith("mlxcluster ") and not refused:
                found.append((n, typed))
        else:
            found += [(n, m.group(1)) for m in INLINE.finditer(line)]
    return found


def unknown_options(line: str) -> list[str] | None:
    """The options ``line`` gives its command that the command does not have
    (None: not a command line, e.g. doctor's first output line)."""
    try:
        words = shlex.split(line.split(" #", 1)[0])
    except ValueError:  # an inline fragment with one quote
        return None
    if len(words) < 2 or words[1] not in COMMAND_MODULES:
        return None
    ctx = click.Context(cli)
    command, rest = cli.get_command(ctx, words[1]), words[2:]
    if isinstance(command, click.Group):
        if not rest or rest[0] not in command.commands:
            return None
        command, rest = command.commands[rest[0]], rest[1:]
    own = rest[:rest.index("--")] if "--" in rest else rest
    options = {opt: param for param in command.params if isinstance(param, click.Option)
               for opt in (*param.opts, *param.secondary_opts)}
    unknown, i = [], 0
    while i < len(own):
        word = own[i]
        name = word.split("=", 1)[0]
        if word.startswith("-") and name not in ("-", "--"):
            param = options.get(name)
            if param is None and name not in ("-h", "--help"):
                unknown.append(name)
            elif param is not None and not param.is_flag and "=" not in word \
                    and name != "--local":  # --local [N]: mlxcluster/cli/params.py
                i += 1  # its value
        i += 1
    return unknown


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_line_uses_its_commands_own_options(doc):
    checked, wrong = 0, []
    for n, line in command_lines(doc.read_text()):
        unknown = unknown_options(line)
        if unknown is None:
            continue
        checked += 1
        if unknown:
            wrong.append(f"{doc.name}:{n}: {unknown} in {line[:120]}")
    assert wrong == []
    if doc.name in ("README.md", "quickstart.md", "smoke.md", "training.md", "training-cluster.md", "doctor.md",
                    "serve.md"):
        assert checked >= 5, checked  # the pages that teach the commands do show them


def test_the_checker_finds_an_option_a_command_does_not_have():
    assert unknown_options("mlxcluster smoke --backend ring --timeout 60") == ["--timeout"]
    assert unknown_options("mlxcluster smoke --backend ring --phase-timeout 60") == []
    assert unknown_options("mlxcluster train --mpi-arg '--mca x 1' -- --steps 3") == []
    assert unknown_options("mlxcluster hostfile generate --backend ring --plan-ips") == []
    assert unknown_options("mlxcluster doctor: lab (3 hosts, live, 1 s)") is None
