"""The HTML report in a real browser (headless chromium over the DevTools
pipe, tests/browser.py): a doctor page from real Mac captures, a page from a
real `smoke --bench` run, one from a real short training run, and the
`report` page of all three. Each is screenshotted (a PNG under the test's
tmp dir); nothing may be requested beyond the file itself, nothing may reach
the console, and what a reader needs must be on the rendered page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from tests.browser import CHROMIUM, render
from tests.conftest import require
from tests.report_support import FAILING_CHECKS, external_references, failing_cluster

FAILING = FAILING_CHECKS
DOCTOR_TEXTS = (f"{len(FAILING)} check(s) failed", *FAILING, "local", "mbp", "mini", "peer", "What to fix first",
                "Every check", "Thunderbolt topology", "macOS 26.6.2 (25G83)")
SMOKE_TEXTS = ("bus bandwidth against size", "p50 latency against size", "smoke ring: passed",
               "local-0", "local-1", "checked sizes", "send_recv")
TRAIN_TEXTS = ("loss and validation loss", "tokens/s", "peak memory per rank", "rank 0", "rank 1",
               "5 steps")


def mlxcluster(*args: str, cwd: Path, timeout: float = 300,
               env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlxcluster", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def pages(tmp_path_factory, macos_fixtures):
    """The four pages, made by the commands a user runs."""
    tmp = tmp_path_factory.mktemp("pages")
    captures = failing_cluster(macos_fixtures, tmp / "captures")
    doctor = CliRunner().invoke(main, ["doctor", "--from", str(captures), "--backend", "jaccl",
                                       "--html", str(tmp / "doctor.html")])
    assert doctor.exit_code == 1, doctor.output  # FAILING_CHECKS fail
    smoke = mlxcluster("smoke", "--backend", "ring", "--local", "2", "--bench", "--json",
                       "--sizes", "1K:1M", "--dtypes", "float32", "--html", str(tmp / "smoke.html"), cwd=tmp)
    assert smoke.returncode == 0, smoke.stderr[-2000:]
    (tmp / "smoke.json").write_text(smoke.stdout)
    assert json.loads(smoke.stdout)["ok"]
    # A real wrong result: the worker's test hook corrupts one element on rank 1.
    failed = mlxcluster("smoke", "--backend", "ring", "--local", "2", "--sizes", "1K:2K", "--dtypes",
                        "bfloat16", "--html", str(tmp / "smoke-failed.html"),
                        cwd=tmp, env={"MLXCLUSTER_SMOKE_CORRUPT_RANK": "1"})
    assert failed.returncode == 1, failed.stderr[-2000:]
    train = mlxcluster("train", "--local", "2", "--config", "tiny", "--html", str(tmp / "train.html"),
                       "--", "--steps", "5", "--out", str(tmp / "run"), cwd=tmp)
    assert train.returncode == 0, train.stderr[-2000:]
    assert f"wrote {tmp / 'train.html'}" in train.stdout
    report = CliRunner().invoke(main, ["report", str(captures), "--backend", "jaccl",
                                       "--smoke", str(tmp / "smoke.json"), "--run", str(tmp / "run"),
                                       "-o", str(tmp / "all.html")])
    assert report.exit_code == 0, report.output
    return tmp


@pytest.mark.parametrize(("name", "texts"), [
    ("doctor", DOCTOR_TEXTS),
    ("smoke", SMOKE_TEXTS),
    ("smoke-failed", ("smoke ring: failed", "rank 1 on local-1: wrong result in all_sum bfloat16",
                      "✗ 1 (2 B): rank 1", "element 0: got 4.0, expected 3.0")),
    ("train", TRAIN_TEXTS),
    ("all", (*DOCTOR_TEXTS, *SMOKE_TEXTS, *TRAIN_TEXTS)),
])
def test_page_renders_alone_and_reads(pages, tmp_path, name, texts):
    require(CHROMIUM is not None, "chromium is not installed (apt-get install chromium; make test does)")
    page = pages / f"{name}.html"
    html = page.read_text()
    assert external_references(html) == []
    png = tmp_path / f"{name}.png"

    shown = render(page, png)

    print(f"{name}: {len(html) / 1024:.0f} KiB, rendered in {shown.seconds:.1f} s, "
          f"{shown.height} px tall; screenshot {png}", file=sys.stderr)
    assert shown.requests == [page.resolve().as_uri()]  # nothing but the file itself
    assert shown.console == []
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    missing = [t for t in texts if t not in shown.text]
    assert not missing, f"not on the rendered page: {missing}"
