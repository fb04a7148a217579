"""The trainer's --help describes every flag (issue 46): what it is, its
choices and its default, grouped; the flags mlxcluster sets for itself are
hidden. Read from the real `python -m reference_train.train --help`."""

from __future__ import annotations

import re
import subprocess
import sys

from reference_train.config import FLAG_HELP, GROUPS, HIDDEN, field_types
from tests.train_support import REPO


def help_text() -> str:
    done = subprocess.run([sys.executable, "-m", "reference_train.train", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def described(text: str) -> dict[str, str]:
    """Each option of the help's option lines -> its description (the lines
    after its name, joined)."""
    found: dict[str, str] = {}
    current = None
    for line in text.split("options:", 1)[1].splitlines():
        head = re.match(r"^  (--[a-z0-9_]+)(?: \S+)?\s*(.*)$", line)
        if head:
            current = head.group(1)
            found[current] = head.group(2).strip()
        elif current and line.startswith("    "):
            found[current] = f"{found[current]} {line.strip()}".strip()
        elif not line.strip() or line.endswith(":"):
            current = None
    return found


def test_every_flag_of_the_trainer_has_a_description_and_its_default():
    flags = described(help_text())
    visible = sorted(set(field_types()) - HIDDEN)
    missing = [name for name in visible if not flags.get(f"--{name}")]
    assert missing == []
    for name in visible:
        assert "(default: " in flags[f"--{name}"], (name, flags[f"--{name}"])
    assert re.search(r"one of full, lora, dora \(default: 'full'\)", flags["--fine_tune"])
    assert re.search(r"one of float32, bfloat16 \(default: 'float32'\)", flags["--comm_dtype"])
    assert all(f"--{name}" not in flags for name in HIDDEN)  # mlxcluster's own, not shown
    assert flags["--config"]


def test_the_flags_are_grouped_and_the_table_covers_every_field():
    text = help_text()
    at = [text.index(f"\n{group}:\n") for group in GROUPS]
    assert at == sorted(at)  # data, model, fine-tuning, parallelism, ... in that order
    assert set(FLAG_HELP) == set(field_types()) - HIDDEN  # a new field without help fails here
    assert {group for group, _ in FLAG_HELP.values()} == set(GROUPS)
