"""The tests' waits tied to progress (tests/waits.py, issue 50): a job that advances is
waited for past any fixed time, one that shows no sign for the quiet limit is ended with
what was seen last, and the ceiling holds whatever happens."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from tests import waits

QUIET = 3.0  # s; the signs are looked at once a second


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def gone(marker: str) -> bool:
    return not any(marker in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))


def test_a_job_that_prints_now_and_then_is_waited_for_past_the_quiet_limit():
    code = "import time\nfor i in range(6):\n    print(i, flush=True); time.sleep(1)\n"
    start = time.monotonic()
    done = waits.run(python(code), "printer", quiet_s=QUIET)
    assert time.monotonic() - start > QUIET + 1  # longer than a fixed wait of QUIET
    assert done.returncode == 0 and done.stdout.split() == [str(i) for i in range(6)]


def test_a_job_that_only_computes_is_advancing(monkeypatch, tmp_path):
    # Its CPU is the only sign (no kernels built meanwhile count). A loaded machine (the
    # suite's 4 workers, load 17) gives it an eighth of a core: 0.1 CPU-s is a sign here,
    # as 2 CPU-s are over the suite's 120 s.
    monkeypatch.setattr(waits, "KERNELS", tmp_path / "no-kernels")
    monkeypatch.setattr(waits, "PROGRESS_CPU_S", 0.1)
    code = "import time\nend = time.monotonic() + 8\nwhile time.monotonic() < end: pass\nprint('done')"
    done = waits.run(python(code), "busy loop", quiet_s=QUIET)
    assert done.stdout.strip() == "done"


def test_a_job_that_only_writes_a_watched_file_is_advancing(tmp_path):
    log = tmp_path / "steps.jsonl"
    code = ("import sys, time\nfor i in range(6):\n"
            "    open(sys.argv[1], 'a').write(f'{i}\\n'); time.sleep(1)\n")
    done = waits.run(python(code, str(log)), "writer", paths=[tmp_path], quiet_s=QUIET)
    assert done.returncode == 0 and log.read_text().split() == [str(i) for i in range(6)]


def test_a_silent_idle_job_is_ended_naming_it_and_what_was_seen_last(monkeypatch, tmp_path):
    # Other tests' MLX kernels, built meanwhile, would be a sign for this job too.
    monkeypatch.setattr(waits, "KERNELS", tmp_path / "no-kernels")
    marker = "waits-silent-job-marker"
    code = f"import subprocess, sys, time\nprint('started', flush=True)\n" \
           f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n" \
           "time.sleep(60)\n"
    start = time.monotonic()
    with pytest.raises(AssertionError) as missed:
        waits.run(python(code), "the idle job", quiet_s=QUIET)
    took = time.monotonic() - start
    said = str(missed.value)
    assert said.startswith("the idle job: nothing advanced for 3 s (last seen: ")
    assert "started" in said  # its output's end is shown
    assert QUIET <= took < QUIET + 30  # ended soon after the quiet limit, even at load
    waits.poll_until(lambda: gone(marker), 10, "the job's child killed with it")


def test_the_ceiling_ends_a_job_that_advances_for_ever():
    code = "import time\nwhile True:\n    print('tick', flush=True); time.sleep(0.3)\n"
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"the ticker: not within 4 s although it went on "
                                             r"\(last seen: output"):
        waits.run(python(code), "the ticker", quiet_s=QUIET, ceiling_s=4)
    assert time.monotonic() - start < 30


def test_wait_for_returns_the_condition_value_and_communicate_the_output(monkeypatch, tmp_path):
    monkeypatch.setattr(waits, "KERNELS", tmp_path / "no-kernels")
    proc = subprocess.Popen(python("import sys; print('out'); print('err', file=sys.stderr)"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert waits.communicate(proc, "a quick job", quiet_s=QUIET) == ("out\n", "err\n")
    progress = waits.Progress()
    assert waits.wait_for(lambda: 42, "an answer", progress, quiet_s=QUIET) == 42
    with pytest.raises(AssertionError, match="never: nothing advanced for 1 s"):
        waits.wait_for(lambda: False, "never", progress, quiet_s=1, interval=0.05)
