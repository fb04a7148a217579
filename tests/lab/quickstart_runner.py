"""Run a page's ```console blocks as a user types them (docs/quickstart.md).

A block is a terminal: ``$ COMMAND`` lines, each followed by what it prints
(shortened: a line may leave parts out with ``...``). The runner types each
command in a shell (bash, in the work folder, with the environment given)
and checks that every line the page shows is in what the command printed,
once both are put in the same shape (``shape``): numbers, run ids and the
lab's own names (hosts, paths, the python) stand for whatever the user's
machine prints there.

A command that runs until stopped (``mlxcluster serve``) is left running
once the last line its block shows has appeared; a later block that starts
with ``^C`` is that terminal again: Ctrl-C (SIGINT), then the rest of its
output. Blocks of other kinds (```sh) are shown, not run: what the test
prepares in their place is the test's to say.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

RUN_ID = re.compile(r"\bmlx(?:serve|train|run|smoke)-[0-9a-f]{10}\b")
NUMBER = re.compile(r"\d+(?:\.\d+)?")
LONG_RUNNING = ("mlxcluster serve",)


@dataclass
class Block:
    lines: list[str]


@dataclass
class Step:
    """One command of the page and what the page shows it printing."""

    command: str | None  # None: ^C to the running command
    shown: list[str] = field(default_factory=list)


def console_blocks(page: str) -> list[Block]:
    blocks, current = [], None
    for line in page.splitlines():
        if current is None and line.strip() == "```console":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append(Block(current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def steps_of(blocks: list[Block]) -> list[Step]:
    steps: list[Step] = []
    for block in blocks:
        for line in block.lines:
            if line.startswith("$ "):
                steps.append(Step(line[2:]))
            elif line.strip() == "^C":
                steps.append(Step(None))
            elif steps and line.strip():
                steps[-1].shown.append(line)
    return steps


def shape(text: str, names: dict[str, str]) -> str:
    """``text`` with the lab's names put as the page has them (``names``:
    what the lab prints -> what the page shows), then run ids and numbers
    made alike and spaces collapsed."""
    for said, shown in sorted(names.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(said, shown)
    text = RUN_ID.sub("RUN", text)
    text = NUMBER.sub("N", text)
    return re.sub(r"\s+", " ", text).strip()


def missing_lines(shown: list[str], printed: str, names: dict[str, str]) -> list[str]:
    """The page's lines that are not in what was printed (each a line of it,
    or its pieces around ``...`` in order within one printed line)."""
    printed_lines = [shape(line, names) for line in printed.splitlines()]
    missing = []
    for line in shown:
        if line.strip() in ("...", ""):
            continue
        pieces = [shape(p, names) for p in line.split("...") if p.strip()]
        if not any(_in_order(pieces, got) for got in printed_lines):
            missing.append(line)
    return missing


def _in_order(pieces: list[str], line: str) -> bool:
    at = 0
    for piece in pieces:
        found = line.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True


class Terminal:
    """A command left running (``mlxcluster serve``): its output read as it comes."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]):
        self.proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.output = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output += line

    def wait_for(self, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check(self.output):
            if self.proc.poll() is not None:
                self._reader.join(5)
                if check(self.output):
                    return
                raise AssertionError(f"ended (exit {self.proc.returncode}) before showing what "
                                     f"the page shows:\n{self.output[-5000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout:.0f} s:\n{self.output[-5000:]}")
            time.sleep(0.5)

    def interrupt(self, timeout: float) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)
        code = self.proc.wait(timeout=timeout)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@dataclass
class Typed:
    """What a step printed, and its exit code (None: still running)."""

    step: Step
    output: str
    code: int | None


def run_page(page: Path, cwd: Path, env: dict[str, str], names: dict[str, str], *,
             timeout: float, up_timeout: float, exits: dict[int, int] | None = None,
             record: bool = False) -> list[Typed]:
    """Every console step of ``page`` in order, each with its exit code;
    raises AssertionError naming the step whose output lacks a line the page
    shows, or that exited otherwise than ``exits`` says (step index -> code;
    0 for the others). ``record``: print what each step printed, the lab's
    names put as the page has them, to write the page from."""
    exits = exits or {}
    done: list[Typed] = []
    running: Terminal | None = None
    try:
        for index, step in enumerate(steps_of(console_blocks(page.read_text()))):
            if step.command is None:  # ^C to the running terminal
                assert running is not None, "^C with nothing running"
                before = len(running.output)
                code = running.interrupt(timeout)
                typed = Typed(step, running.output[before:], code)
                running = None
            elif step.command.startswith(LONG_RUNNING):
                running = Terminal(step.command, cwd, env)
                last = step.shown[-1] if step.shown else ""
                running.wait_for(lambda out, last=last: not missing_lines([last], out, names),
                                 up_timeout)
                typed = Typed(step, running.output, None)
            else:
                proc = subprocess.run(["bash", "-c", step.command], cwd=cwd, env=env,
                                      capture_output=True, text=True, timeout=timeout,
                                      stdin=subprocess.DEVNULL)
                typed = Typed(step, proc.stdout + proc.stderr, proc.returncode)
            if record:
                print(f"$ {step.command or '^C'}   (exit {typed.code})")
                print("\n".join(shape_keep_numbers(line, names) for line in typed.output.splitlines()))
            assert typed.code in (None, exits.get(index, 0)), (
                f"'$ {step.command or '^C'}' exited {typed.code}:\n{typed.output[-6000:]}")
            missing = missing_lines(step.shown, typed.output, names)
            assert not missing, (f"'$ {step.command or '^C'}' printed none of {missing} "
                                 f"(exit {typed.code}):\n{typed.output[-6000:]}")
            done.append(typed)
    finally:
        if running is not None:
            running.kill()
    return done


def shape_keep_numbers(text: str, names: dict[str, str]) -> str:
    for said, shown in sorted(names.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(said, shown)
    return text
