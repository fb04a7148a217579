"""Run every test file alone, each in a pytest process of its own, some at a
time (`make test-each-alone`): a file that passes only after another made
something for it fails here. Prints one line a file (its outcome, seconds
and pytest's summary) and exits 1 when any file failed.

    python -m tests.each_alone [--jobs 4] [FILE ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_alone(path: str) -> tuple[str, int, float, str]:
    """(file, pytest's exit code, seconds, its last line; for a failure also
    each failed test and the first lines of what it said)."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", path],
                          cwd=REPO, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else proc.stderr[-300:]
    if proc.returncode != 0:
        said = [line for line in lines if line.startswith(("FAILED", "ERROR", "E "))][:40]
        summary += "".join(f"\n      {line[:300]}" for line in said)
    return path, proc.returncode, time.monotonic() - started, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4, help="files run at the same time")
    parser.add_argument("files", nargs="*", help="default: every tests/**/test_*.py")
    args = parser.parse_args(argv)
    files = args.files or sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py"))
    failed = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for path, code, seconds, summary in pool.map(run_alone, files):
            print(f"{'ok  ' if code == 0 else 'FAIL'} {seconds:7.1f} s  {path}: {summary}", flush=True)
            if code != 0:
                failed.append(path)
    print(f"{len(files) - len(failed)} of {len(files)} files passed alone"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
