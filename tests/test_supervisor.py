"""The half after launch (launch/supervisor.py): how any job's end is said,
in one ladder for run, train, serve and attach, and its exit code."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlxcluster.errors import InputError
from mlxcluster.jobs.hosts import local_hosts
from mlxcluster.jobs.job import Job
from mlxcluster.jobs.watch import RunOutcome
from mlxcluster.launch.supervisor import JobResult, Words, ending, refuse_detached_restarts
from mlxcluster.launch.trainer import TRAIN_WORDS

JOB = Job(hosts=local_hosts(2), backend="ring", python=sys.executable)
RUN_ID = "mlxrun-0123456789"


def said(result: JobResult) -> list[str]:
    return [line.text for line in ending(result).said]


def test_success_names_the_ranks_the_time_the_restarts_and_the_logs():
    done = JobResult(JOB, RunOutcome(0, run_id=RUN_ID), Words("run", logs=Path("runs/x")),
                     restarts=1, seconds=2.5)
    end = ending(done)
    assert (end.kind, end.exit_code) == ("finished", 0)
    assert said(done) == ["run finished on 2 rank(s) in 2.5 s after 1 restart(s); logs: runs/x"]
    assert not end.said[0].err


def test_a_stop_asked_for_is_143_in_each_commands_words():
    outcome = RunOutcome(143, run_id=RUN_ID, asked_to_stop=True)
    assert said(JobResult(JOB, outcome, Words("serve", logs=Path("L")))) == [
        f"serve stopped when asked ('mlxcluster stop {RUN_ID}'): every rank ended; logs: L"]
    train = ending(JobResult(JOB, outcome, TRAIN_WORDS, stopped_at=37))
    assert train.exit_code == 143 and train.why == "stopped at step 37 when asked"
    assert train.said[0].text == (
        "train stopped at step 37 when asked (mlxcluster stop, or the lease of the machine "
        "running mlxcluster ran out): every rank wrote its checkpoint at that step; go on with "
        "'-- --resume auto'")


def test_a_failure_names_who_with_its_code_then_the_logs():
    outcome = RunOutcome(3, failed_rank=1, run_id=RUN_ID)
    end = ending(JobResult(JOB, outcome, Words("run", logs=Path("L"),
                                               more_on_failure=("tail",))))
    assert (end.kind, end.exit_code, end.why) == ("failed", 3, "rank 1 exited with code 3")
    assert [s.text for s in end.said] == [
        "run failed: rank 1 exited with code 3; every rank was stopped", "tail", "logs: L"]
    assert end.said[0].colour == "red"


def test_a_detached_job_interrupted_is_left_running_and_said_so():
    done = JobResult(replace(JOB, detached=True), RunOutcome(0, run_id=RUN_ID),
                     replace(TRAIN_WORDS, record="runs/a"), interrupted=True)
    end = ending(done)
    assert (end.kind, end.exit_code) == ("left", 0)
    assert said(done) == [f"left {RUN_ID} running on the hosts: 'mlxcluster attach {RUN_ID}' "
                          "follows it again and makes the record at runs/a whole; "
                          f"'mlxcluster stop {RUN_ID}' stops it"]


def test_detach_and_restarts_are_refused_together():
    refuse_detached_restarts(True, 0)
    refuse_detached_restarts(False, 2)
    with pytest.raises(InputError, match="do not go together"):
        refuse_detached_restarts(True, 2)
