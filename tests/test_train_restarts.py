"""`mlxcluster train --max-restarts`: a stalled job is stopped, launched again from
the newest checkpoint, and finishes with the losses of an uninterrupted run.

Real ranks (`--local 3`, ring) and a real stall: rank 1's process is stopped
with SIGSTOP mid-training, as a hung or swapped-out process looks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest

from mlxcluster.launch.trainer import parse_trainer_args, restart_checkpoint_every
from reference_train.prepare import prepare_offline
from tests import waits
from tests.train_support import REPO, run_trainer, train_losses, trainer_env
from tests.waits import LOCAL_STALL_TIMEOUT_S

STEPS = 160  # the restart test: its automatic checkpoint every 8 steps (a twentieth)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "offline"
    prepare_offline(out, n_stories=300)
    return out


def common(data) -> list[str]:
    return ["--steps", str(STEPS), "--global_batch", "12", "--eval_every", "0",
            "--sample_tokens", "0", "--data", str(data)]


def rank_process(out, rank: int) -> psutil.Process | None:
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if "reference_train.train" in cmd and str(out) in cmd \
                    and p.environ().get("MLX_RANK") == str(rank):
                return p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_the_checkpoint_rule_loses_at_most_a_twentieth():
    assert [restart_checkpoint_every(s) for s in (1, 19, 20, 21, 400, 1000)] == [1, 1, 1, 2, 20, 50]


# Two trainings (one process, then 3 ranks with a stall and a restart) on 2 cores. At
# 400 steps: 127 s in `make test-durations`, 288 s alone at load average 22-41, 313 s
# in a fresh-clone CI run beside three other sessions, 332 s in a cold one (issue 50),
# over fixed limits each time. 160 steps show the same (a checkpoint every 8, the stall
# after the first, every step once, the reference's losses), and the waits last while
# the run advances (tests/waits.py).
def test_a_stalled_rank_is_restarted_and_the_run_ends_with_the_reference_losses(data, tmp_path):
    reference = tmp_path / "reference"
    proc = run_trainer(["--config", "tiny", *common(data), "--out", str(reference)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = train_losses(reference)

    out = tmp_path / "restarted"
    env = trainer_env()
    job = subprocess.Popen(
        [sys.executable, "-m", "mlxcluster", "train", "--local", "3", "--no-preflight",
         "--config", "tiny", "--stall-timeout", f"{LOCAL_STALL_TIMEOUT_S}s", "--max-restarts", "1", "--",
         *common(data), "--out", str(out)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    stopped = None
    try:
        metrics = out / "metrics.jsonl"

        def past_the_first_checkpoint() -> bool:  # every 8 steps; stopped well before the end
            assert job.poll() is None, job.communicate()
            return metrics.exists() and metrics.read_text().count('"loss"') >= 18

        waits.wait_for(past_the_first_checkpoint, "18 losses", waits.Progress([out]), interval=0.05)
        stopped = rank_process(out, 1)
        assert stopped is not None
        stopped.send_signal(signal.SIGSTOP)
        stdout, stderr = waits.communicate(job, "the restarted run", paths=[out])
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        if stopped is not None and stopped.is_running():
            stopped.send_signal(signal.SIGCONT)
    text = stdout + stderr
    assert job.returncode == 0, text[-4000:]
    assert "training stalled" in text and "restart 1/1 after: training stalled" in text
    assert "resumed from" in text and "after 1 restart(s)" in text
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    restarts = [r for r in records if r.get("event") == "restart"]
    assert len(restarts) == 1 and "stalled" in restarts[0]["cause"]
    starts = [r["step"] for r in records if r.get("event") == "start"]
    assert starts[0] == 0 and starts[1] > 0 and starts[1] % 8 == 0  # from a checkpoint
    got = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert sorted(got) == list(range(1, STEPS + 1))  # every step once, the redone ones too
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in want)
    assert worst <= 1.1e-6, worst
    assert rank_process(out, 0) is None and rank_process(out, 1) is None


def test_flags_set_by_mlxcluster_come_last_once_each_and_the_config_follows():
    """What a restart or a dropped host changes is set on the parsed value,
    not edited into a command line: each flag once, after the user's (a later
    flag wins in argparse), and the ranks build the config we hold."""
    from reference_train.config import build_config

    given = ("--config", "tiny", "--steps", "40", "--resume_before=20", "--grad_accum", "1")
    args = parse_trainer_args(given)
    again = args.with_flags(resume="auto", resume_before=30).with_flags(grad_accum=2)
    again = again.with_flags(resume_before=35)
    assert again.argv() == (*given, "--resume", "auto", "--grad_accum", "2", "--resume_before", "35")
    assert (again.config.resume, again.config.resume_before, again.config.grad_accum) == ("auto", 35, 2)
    assert build_config(list(again.argv())) == again.config
    assert args.argv() == given and args.config.grad_accum == 1  # the first value is unchanged


def test_resume_before_a_step_redoes_the_steps_after_the_checkpoint_below_it(data, tmp_path):
    """What `train` passes after a restart: a checkpoint at or after the bound
    is passed over, and the steps from the one before are trained again, with
    the same losses."""
    out = tmp_path / "run"
    args = ["--config", "tiny", "--steps", "12", "--global_batch", "12", "--eval_every", "0",
            "--sample_tokens", "0", "--data", str(data), "--out", str(out), "--log_every", "1",
            "--checkpoint_every", "4", "--keep_checkpoints", "0"]
    first = run_trainer(args)
    assert first.returncode == 0, first.stderr[-2000:]
    want = train_losses(out)
    again = run_trainer([*args, "--resume", "auto", "--resume_before", "10"])
    assert again.returncode == 0, again.stderr[-2000:]
    assert "checkpoints/step_000008 at step 8" in again.stdout
    assert sorted(train_losses(out)) == list(range(1, 13))
    assert train_losses(out) == want


def test_a_trainer_that_refuses_its_input_at_start_is_not_restarted(data, tmp_path):
    """A data file cut short: every rank refuses it before the first step
    (exit 2). `--max-restarts 2` does not launch again what would be refused
    the same way: one launch, the trainer's own words, exit 2."""
    import shutil

    bad = tmp_path / "cut"
    shutil.copytree(data, bad)
    with open(bad / "train.bin", "r+b") as train_bin:
        train_bin.truncate(101)  # not a whole number of uint16 tokens
    done = waits.run([sys.executable, "-m", "mlxcluster", "train", "--local", "2",
                      "--no-preflight", "--config", "tiny", "--max-restarts", "2", "--",
                      *common(bad), "--out", str(tmp_path / "out")],
                     "a train refused at start", cwd=REPO, env=trainer_env())
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert said.count("launching 2 rank(s)") == 1 and "restart 1/" not in said, said
    assert re.search(r"train failed: rank \d refused to start: it exited with code 2 before its "
                     r"first step \(a usage error: its arguments or its input\): buffer size must "
                     r"be a multiple of element size; every rank was stopped, none restarted", said)


def test_records_lost_when_a_job_stopped_are_sent_again_from_the_checkpoint(data, tmp_path):
    """A job stopped mid-run loses the record lines in flight (mlx.launch stops
    reading a dying job's ranks; seen in CI: step 2's loss missing for good
    after `--resume auto`). Each checkpoint holds the records logged since the
    one before, and a resume sends them again: `mlxcluster train --local 2` to
    step 6, its record then missing steps 5 and 6 as if lost in flight;
    `--resume auto` to 8 brings them back, each step's loss once."""
    out = tmp_path / "run"
    flags = ["--steps", "8", "--global_batch", "4", "--eval_every", "0", "--sample_tokens", "0",
             "--log_every", "1", "--checkpoint_every", "3", "--data", str(data), "--out", str(out)]

    def train(*extra: str) -> subprocess.CompletedProcess:
        done = waits.run([sys.executable, "-m", "mlxcluster", "train", "--local", "2",
                          "--config", "tiny", "--no-preflight", "--", *flags, *extra],
                         "train --local 2", paths=[out], env=trainer_env(), cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done

    train("--stop_after", "6")
    first = train_losses(out)
    assert sorted(first) == [1, 2, 3, 4, 5, 6]
    metrics = out / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines()
            if json.loads(line).get("step") not in (5, 6) or "loss" not in json.loads(line)]
    metrics.write_text("".join(line + "\n" for line in kept))

    resumed = train("--resume", "auto")
    assert "at step 6" in resumed.stdout
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    logged = [r["step"] for r in records if "loss" in r]
    assert logged == [1, 2, 3, 4, 5, 6, 7, 8]  # each once: step 4 arrived the first time
    assert [r["step"] for r in records if r.get("replayed")] == [5, 6]
    got = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert all(got[step] == first[step] for step in first)
