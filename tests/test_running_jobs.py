"""What runs on the hosts (mlxcluster.jobs.running): the listing each host
prints, read apart from ssh; the same-run refusal; and the listing script
run for real on this machine against a live rank's pid file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from mlxcluster.cli.jobs import known_run_kinds
from mlxcluster.errors import InputError
from mlxcluster.jobs.hosts import local_hosts
from mlxcluster.jobs.job import Job
from mlxcluster.jobs.rank_wrapper import STACKS_ROOT
from mlxcluster.jobs.running import (
    elapsed_seconds,
    group_jobs,
    list_running,
    parse_listing,
    stop_run,
)
from mlxcluster.launch.trainer import check_not_running, same_run, trainer_out
from tests.waits import poll_until

known_run_kinds()  # every launching command's run ids known, as `jobs` and `stop` make them
NOW = datetime(2026, 11, 26, 21, 0, 0)
TRAIN = ("/opt/venv/bin/python -X mlxcluster_run=mlxtrain-1a2b3c4d5e -m mlxcluster.jobs.rank_wrapper "
         "-m reference_train.train --progress false --config tiny --out runs/a --steps 9")
LISTING = f"""@@rank mlxtrain-1a2b3c4d5e 0 4242
   01:02:03 {TRAIN}
@@rank mlxrun-00000000ff 1 777
   2-00:00:05 /opt/venv/bin/python -X mlxcluster_run=mlxrun-00000000ff -m mlxcluster.jobs.rank_wrapper /srv/prog.py --x 1
@@rank mlxtrain-9999999999 0 555
   00:07 /usr/bin/vim notes.txt
@@rank not-a-run 0 1
   00:07 whatever
"""


def test_the_listing_names_each_live_rank_its_age_and_its_program():
    ranks = parse_listing("mac1", LISTING, now=NOW)
    assert [(r.run_id, r.rank, r.pid, r.host) for r in ranks] == [
        ("mlxtrain-1a2b3c4d5e", 0, 4242, "mac1"), ("mlxrun-00000000ff", 1, 777, "mac1")]
    assert ranks[0].started == NOW - timedelta(hours=1, minutes=2, seconds=3)
    assert ranks[1].started == NOW - timedelta(days=2, seconds=5)
    assert ranks[0].command == "-m reference_train.train --config tiny --out runs/a --steps 9"
    assert trainer_out(ranks[0].command.split()) == "runs/a"
    assert trainer_out(ranks[1].command.split()) is None
    # a pid file whose pid is now another program's (vim) is not a rank


def test_elapsed_times_as_ps_prints_them():
    assert elapsed_seconds("00:07") == 7
    assert elapsed_seconds("01:02:03") == 3723
    assert elapsed_seconds("3-04:05:06") == 3 * 86400 + 4 * 3600 + 5 * 60 + 6
    assert elapsed_seconds("soon") is None and elapsed_seconds("1:2:3:4") is None


def test_ranks_on_several_hosts_make_one_job_oldest_first():
    ranks = parse_listing("mac1", LISTING, now=NOW) + parse_listing(
        "mac2", LISTING.replace("@@rank mlxtrain-1a2b3c4d5e 0", "@@rank mlxtrain-1a2b3c4d5e 1"), now=NOW)
    jobs = group_jobs(ranks)
    assert [j.run_id for j in jobs] == ["mlxrun-00000000ff", "mlxtrain-1a2b3c4d5e"]
    train = jobs[1]
    assert [r.rank for r in train.ranks] == [0, 1] and train.hosts == ("mac1", "mac2")
    assert same_run(jobs, "runs/a") is train and same_run(jobs, "runs/a/") is train
    assert same_run(jobs, os.path.abspath("runs/a")) is train
    assert same_run(jobs, "runs/b") is None


SLEEPER = "import time; print('ready', flush=True); time.sleep(60)\n"


@pytest.fixture
def live_rank(tmp_path):
    """A real rank under the rank wrapper on this machine, its pid file where
    every rank's is, with a trainer-like --out on its command line."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    run_id = "mlxtrain-00c0ffee00"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "MLX_RANK": "0"}
    proc = subprocess.Popen([sys.executable, "-X", f"mlxcluster_run={run_id}", "-m",
                             "mlxcluster.jobs.rank_wrapper", str(script), "--out", str(tmp_path / "out")],
                            env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield run_id, proc
    proc.kill()
    proc.wait()


def test_a_live_rank_is_listed_refused_again_and_stopped(live_rank, tmp_path):
    run_id, proc = live_rank
    hosts = local_hosts(2)
    jobs, unanswered = list_running(hosts)
    assert unanswered == []
    mine = [j for j in jobs if j.run_id == run_id]
    assert len(mine) == 1 and mine[0].ranks[0].pid == proc.pid
    assert mine[0].command == f"{tmp_path / 'sleeper.py'} --out {tmp_path / 'out'}"
    job = Job(hosts=hosts, backend="ring", python=sys.executable)
    with pytest.raises(InputError, match=f"run {run_id} still trains into --out") as refused:
        check_not_running(job, str(tmp_path / "out"), dict(os.environ))
    assert f"mlxcluster stop {run_id}" in refused.value.hint
    check_not_running(job, str(tmp_path / "other"), dict(os.environ))  # another --out: fine

    ended, unreached = stop_run(hosts, run_id, grace_s=10)
    assert ended and unreached == []
    assert proc.wait(timeout=5) == -signal.SIGUSR2  #, the sleeper's default: it ends
    poll_until(lambda: not Path(f"{STACKS_ROOT}/{run_id}").exists(), 5, "the run's folder removed")
    assert not [j for j in list_running(hosts)[0] if j.run_id == run_id]
