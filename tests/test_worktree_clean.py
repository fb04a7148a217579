"""The guard that fails a test run leaving files in the checkout
(tests/worktree_guard.py, run by tests/conftest.py): what counts as left
behind, and what, edited by someone else meanwhile, does not."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.worktree_guard import Snapshot, left_behind, parse_porcelain, snapshot

TOP = frozenset({"mlxcluster", "tests", "docs", "README.md", ".gitignore", ".venv", "runs"})


def snap(entries: dict[str, str], top: frozenset[str] = TOP) -> Snapshot:
    return Snapshot(entries, top)


def test_run_output_that_appeared_is_named():
    before = snap({"runs/old/rank0.log": "!!"})
    after = snap({"runs/old/rank0.log": "!!",  # there before: not this run's
                  "runs/run-mlxrun-1a2b/rank0.log": "!!",  # run's logs (ignored)
                  "stall-mlxsmoke-62733f56f8/summary.txt": "!!",  # smoke's hang report
                  "loss.png": "??",  # a new file at the root, not ignored
                  "tests/stall-mlxsmoke-1/rank0.txt": "??",  # a stall folder anywhere
                  "tests/fixtures/out/x.json": "??"},  # an out/ folder anywhere
                 TOP | {"stall-mlxsmoke-62733f56f8", "loss.png"})
    assert left_behind(before, after) == [
        "loss.png", "runs/run-mlxrun-1a2b/rank0.log", "stall-mlxsmoke-62733f56f8/summary.txt",
        "tests/fixtures/out/x.json", "tests/stall-mlxsmoke-1/rank0.txt"]


def test_an_empty_folder_at_the_root_is_named():
    # git lists no empty folder; the root's own listing does.
    assert left_behind(snap({}), snap({}, TOP | {"out"})) == ["out/"]


def test_what_others_edit_meanwhile_and_caches_do_not_count():
    top = TOP | {"stall-mlxsmoke-1", "out"}
    before = snap({"docs/notes.md": "??"}, top)
    after = snap({"docs/notes.md": "??",
                  "mlxcluster/new_module.py": "??",  # someone's new source file
                  "tests/test_new.py": "??",
                  "README.md": " M", "mlxcluster/cli/smoke.py": "M ",  # someone's edits
                  "stall-mlxsmoke-1/summary.txt": "D ", "out/kept.txt": " D",  # removals
                  "runs/staged.txt": "A ",  # someone staged it: not a test's
                  "mlxcluster.egg-info/PKG-INFO": "!!", ".pytest_cache/v/cache/nodeids": "!!",
                  "tests/__pycache__/x.pyc": "!!", ".ruff_cache/x": "!!",
                  ".venv/lib/site.py": "!!"},
                 top | {"mlxcluster.egg-info", ".pytest_cache", ".ruff_cache"})
    assert left_behind(before, after) == []


def test_porcelain_parsing_keeps_the_new_name_of_a_rename():
    out = "R  mlxcluster/hostfile/tuned.py\0mlxcluster/tuned.py\0?? runs/x/rank0.log\0 M README.md\0"
    assert parse_porcelain(out) == {"mlxcluster/hostfile/tuned.py": "R ", "runs/x/rank0.log": "??",
                                    "README.md": " M"}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_on_a_real_checkout(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    try:
        git(repo, "init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git cannot init a repository here")
    (repo / ".gitignore").write_text("runs/\nstall-*/\n")
    (repo / "pkg").mkdir()
    (repo / "pkg" / "a.py").write_text("x = 1\n")
    before = snapshot(repo)
    assert before is not None
    (repo / "pkg" / "a.py").write_text("x = 2\n")  # an edit
    (repo / "pkg" / "b.py").write_text("")  # a new source file
    (repo / "runs" / "demo").mkdir(parents=True)
    (repo / "runs" / "demo" / "metrics.jsonl").write_text("{}\n")  # ignored, still caught
    (repo / "stall-mlxsmoke-1").mkdir()
    (repo / "stall-mlxsmoke-1" / "summary.txt").write_text("hung\n")
    (repo / "pkg" / "__pycache__").mkdir()
    (repo / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"")
    assert left_behind(before, snapshot(repo)) == ["runs/demo/metrics.jsonl",
                                                   "stall-mlxsmoke-1/summary.txt"]


def test_not_a_checkout_is_not_checked(tmp_path):
    assert snapshot(tmp_path) is None
