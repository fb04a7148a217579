"""Ctrl-C, SIGTERM and SIGHUP: the command stops its run everywhere, says so,
and exits 128 + the signal. Real commands, real launchers, real signals
(the multi-host form is in tests/lab/test_interrupt_lab.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster import interrupts
from mlxcluster.cli import main
from mlxcluster.demo import _run_streaming
from mlxcluster.errors import Interrupted
from tests.interrupt_helpers import (
    SmokeWorkersRunning,
    interrupt_when,
    processes_with,
    smoke_run_id,
)

MLXCLUSTER = [sys.executable, "-m", "mlxcluster"]
LONG_SMOKE = ["--bench", "--sizes", "1K:64M", "--phase-timeout", "120"]


# ---- the signal plumbing ------------------------------------------------------------

def test_handled_signals_raise_stop_and_deferred_ones_are_only_recorded():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with interrupts.signals_raise():
        with pytest.raises(interrupts.Stop) as raised:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs between bytecodes of this thread
        assert raised.value.signum == signal.SIGTERM
        with interrupts.deferred() as arrived:
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        assert arrived == [signal.SIGHUP, signal.SIGINT]
    # outside, the previous handlers are back (SIGINT is SIG_IGN, not Python's
    # handler, when the tests were started in the background by a script)
    assert {s: signal.getsignal(s) for s in before} == before


def test_the_first_signal_calls_back_and_the_next_or_stop_now_raises():
    """serve's drain (serve/serving.py Drain): the first Ctrl-C or SIGTERM is
    a call, not a raise; a second one raises, and so does ``stop_now`` from
    another thread once the drain is done."""
    import threading

    called: list[int] = []
    with interrupts.first_signal_calls(called.append) as stop_now:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        assert called == [signal.SIGTERM]  # called, nothing raised
        with pytest.raises(interrupts.Stop) as raised:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert raised.value.signum == signal.SIGINT
        with pytest.raises(interrupts.Stop) as raised:
            threading.Thread(target=stop_now, args=(signal.SIGTERM,)).start()
            time.sleep(1)
        assert raised.value.signum == signal.SIGTERM
    stop_now(signal.SIGTERM)  # outside: nothing is sent
    assert called == [signal.SIGTERM]


@pytest.mark.parametrize("raised, code, said", [
    (KeyboardInterrupt(), 130, "interrupted (SIGINT)"),
    (interrupts.Stop(signal.SIGHUP), 129, "interrupted (SIGHUP)"),
    (Interrupted(signal.SIGTERM, "interrupted (SIGTERM): run x stopped", "ssh h pkill -f x"), 143,
     "interrupted (SIGTERM): run x stopped\nfix: ssh h pkill -f x"),
])
def test_cli_turns_an_interrupt_into_its_message_and_128_plus_signal(raised, code, said):
    @main.command("interrupt-for-test")
    def interrupt():
        raise raised

    try:
        result = CliRunner().invoke(main, ["interrupt-for-test"])
    finally:
        main.commands.pop("interrupt-for-test")
    assert result.exit_code == code
    assert said in result.output
    assert "Traceback" not in result.output and "Aborted" not in result.output


# ---- demo's step runner ---------------------------------------------------------------

def test_a_silent_step_times_out_and_is_asked_to_clean_up_first(tmp_path):
    """The deadline holds for a command that prints nothing, and the command
    gets SIGTERM (so it can stop its own run), not SIGKILL."""
    cleaned = tmp_path / "cleaned"
    child = textwrap.dedent(f"""
        import signal, sys, time
        def stop(*_):
            open({str(cleaned)!r}, "w").write("yes")
            sys.exit(143)
        signal.signal(signal.SIGTERM, stop)
        time.sleep(60)
    """)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        _run_streaming([sys.executable, "-c", child], timeout=2.0, on_output=None)
    assert time.monotonic() - started < 10
    assert cleaned.read_text() == "yes"


# ---- real commands on local ranks -------------------------------------------------------

@pytest.mark.parametrize("backend, sig", [("ring", signal.SIGINT), ("mpi", signal.SIGTERM)])
def test_interrupted_smoke_stops_every_rank_and_removes_its_files(backend, sig, tmp_path):
    workers = SmokeWorkersRunning(2)
    run = interrupt_when([*MLXCLUSTER, "smoke", "--local", "2", "--backend", backend, *LONG_SMOKE],
                         workers, sig, cwd=str(tmp_path))
    name = signal.Signals(sig).name
    assert run.returncode == 128 + sig, run.stderr
    assert f"interrupted ({name}): smoke {backend} run" in run.stderr
    assert "stopped on every host" in run.stderr and "Traceback" not in run.stderr
    run_id = smoke_run_id(run.stderr)
    assert run_id == workers.run_id
    assert processes_with(run_id) == [] and workers.family_alive() == []
    assert not Path("/tmp", run_id).exists()


def test_interrupted_train_stops_every_rank(tmp_path):
    out = tmp_path / "run"
    metrics = out / "metrics.jsonl"
    run = interrupt_when(
        [*MLXCLUSTER, "train", "--local", "2", "--config", "tiny", "--no-preflight", "--",
         "--steps", "100000", "--out", str(out), "--sample_tokens", "0"],
        lambda _: metrics.exists() and '"loss"' in metrics.read_text(), signal.SIGHUP,
        cwd=str(tmp_path))
    assert run.returncode == 128 + signal.SIGHUP, run.stderr
    assert "interrupted (SIGHUP): the job was stopped on every rank" in run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    assert processes_with("reference_train", str(out)) == []
    steps = metrics.read_text()
    time.sleep(2)  # an absence to prove: a rank still training would log a step (well under 1 s each) meanwhile
    assert metrics.read_text() == steps  # nobody trains on


def test_interrupted_demo_stops_the_step_under_way(tmp_path):
    workers = SmokeWorkersRunning(2)
    run = interrupt_when([*MLXCLUSTER, "demo", "--workdir", str(tmp_path), "--quiet"],
                         workers, signal.SIGINT, cwd=str(tmp_path))
    assert run.returncode == 130, run.stdout + run.stderr
    assert "interrupted (SIGINT): the demo stopped in step 'smoke ring', after 3 of 6 steps" in run.stderr
    assert processes_with(workers.run_id) == []
    assert len(workers.family) >= 4  # mlxcluster smoke, the launcher, 2 workers
    assert workers.family_alive() == []
    assert json.loads((tmp_path / "hostfile-ring.json").read_text())["backend"] == "ring"


def test_a_launcher_stops_on_sigint_even_when_mlxcluster_was_started_with_it_ignored():
    """`mlxcluster train ... &` in a script starts mlxcluster with SIGINT
    ignored, which exec passes on: the launcher then ignored the SIGINT that
    tells it to stop, and was KILLed after a 20 s grace, its remote ranks
    left to the sweep (seen in CI). process.start gives it SIGINT back."""
    from mlxcluster.jobs import process

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        running = process.start(["sh", "-c", "echo ready; exec sleep 60"])
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert running.lines.get(timeout=30) == ("stdout", "ready")  # past the python in front
        os.killpg(running.proc.pid, signal.SIGINT)
        assert running.proc.wait(timeout=5) == -signal.SIGINT
    finally:
        if running.proc.poll() is None:
            os.killpg(running.proc.pid, signal.SIGKILL)
            running.proc.wait()

