"""When the machine running `mlxcluster train` goes away (here: `kill -9` of
its process group, as a closed terminal does), the ranks notice within the
lease, write a last checkpoint at the step they stop at, and end; nothing of
the job is left. `--resume auto` then gives the uninterrupted run's losses.
Two ranks on this machine (`--local 2`), real mlx.launch and ring; the lab
version (hosts on their own disks, the link cut too) is
tests/lab/test_controller_gone_lab.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from mlxcluster.jobs.rank_wrapper import LEASE_GRACE_VAR, LEASE_VAR
from tests import waits
from tests.train_support import trainer_env
from tests.waits import CONTROLLER_GONE_BOUND_S, LEASE_TEST_S, poll_until

TRAIN = [sys.executable, "-m", "mlxcluster", "train", "--local", "2", "--config", "tiny",
         "--no-preflight", "--"]
ARGS = ["--steps", "100000", "--sample_tokens", "0", "--global_batch", "4"]


def losses(out: Path) -> dict[int, float]:
    found = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if "loss" in record:
            found[record["step"]] = record["loss"]
    return found


def processes_of(out: Path) -> list[str]:
    """Every process here whose command line names this run's --out."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(out) in cmdline and proc.info["pid"] != os.getpid():
            found.append(cmdline)
    return found


def train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    done = waits.run([*TRAIN, *ARGS, *args], env=trainer_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def test_killing_the_controller_stops_every_rank_after_a_last_checkpoint(tmp_path):
    out = tmp_path / "run"
    env = {**trainer_env(), LEASE_VAR: str(LEASE_TEST_S), LEASE_GRACE_VAR: "30"}
    proc = subprocess.Popen([*TRAIN, *ARGS, "--out", str(out)], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        waits.wait_for(lambda: (out / "metrics.jsonl").exists() and len(losses(out)) >= 3,
                       "three losses", waits.Progress([out]))
    except AssertionError:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    os.killpg(proc.pid, signal.SIGKILL)  # the controller and everything in its group
    killed = time.monotonic()
    proc.wait()
    recorded = max(losses(out))
    poll_until(lambda: not processes_of(out), CONTROLLER_GONE_BOUND_S,
               "every rank and the launcher gone after the controller was killed")
    took = time.monotonic() - killed
    print(f"every rank gone {took:.1f} s after the controller was killed (lease {LEASE_TEST_S} s)")
    assert took >= LEASE_TEST_S - 1  # they trained on until the lease ran out, not before
    last = int((out / "checkpoints" / "latest").read_text().strip()[len("step_"):])
    assert last >= recorded  # the ranks' last checkpoint, at the step they stopped at
    assert (out / "checkpoints" / f"step_{last:06d}" / "state.json").is_file()

    stop = last + 3
    resumed = train(tmp_path, "--out", str(out), "--resume", "auto", "--stop_after", str(stop))
    assert f"resumed from {out / 'checkpoints' / f'step_{last:06d}'}" in resumed.stdout
    straight = tmp_path / "straight"
    train(tmp_path, "--out", str(straight), "--stop_after", str(stop))
    want, got = losses(straight), losses(out)
    assert set(range(last + 1, stop + 1)) <= set(got)
    for step, loss in got.items():  # the steps the record has: before the kill, and resumed
        assert abs(loss - want[step]) < 1e-6, (step, loss, want[step])
