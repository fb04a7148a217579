"""The restart and elastic rules apart from any launch (the lab tests,
tests/lab/test_elastic_lab.py and test_restart_lab.py, run them for real):
which hosts are dropped and why, the --min-hosts floor, the gradient
accumulation that keeps the global batch, and what a failure points at."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlxcluster.errors import InputError, MlxclusterError
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.jobs.job import Job
from mlxcluster.jobs.restarts import (
    Failure,
    Restarts,
    accumulation_for,
    failure_of_outcome,
    without_hosts,
)
from mlxcluster.jobs.watch import RunOutcome


def job_on(*names: str) -> Job:
    return Job(hosts=tuple(RankHost(n, n, (f"10.0.0.{i}",), "python3")
                           for i, n in enumerate(names, 1)), backend="ring", python="python3")


def test_a_host_is_dropped_when_unreachable_or_failing_in_two_launches_in_a_row():
    job = job_on("mac1", "mac2", "mac3")
    restarts = Restarts(3, elastic=True)
    restarts.failed(job, Failure("rank 1 exited with code 3", ("mac2",)))
    assert restarts.to_drop(job, []) == []  # once is not enough
    restarts.failed(job, Failure("rank 1 exited with code 3", ("mac2",)))
    assert [(d.host, d.reason) for d in restarts.to_drop(job, [])] == \
        [("mac2", "its rank failed in 2 launches in a row")]
    restarts.failed(job, Failure("rank 0 exited with code 1", ("mac1",)))  # the streak ends
    assert restarts.to_drop(job, []) == []
    assert [(d.host, d.reason) for d in restarts.to_drop(job, ["mac3"])] == \
        [("mac3", "unreachable over ssh")]
    assert not restarts.can_restart()
    assert Restarts(3).to_drop(job, ["mac3"]) == []  # not elastic: nobody is dropped


def test_never_fewer_hosts_than_min_hosts():
    job = job_on("mac1", "mac2", "mac3")
    with pytest.raises(MlxclusterError, match=r"only 1 host\(s\) left after dropping mac2 "
                                              r"\(unreachable over ssh\), mac3 \(unreachable over "
                                              r"ssh\): fewer than --min-hosts 2"):
        Restarts(2, elastic=True).to_drop(job, ["mac2", "mac3"])
    assert len(Restarts(2, elastic=True, min_hosts=1).to_drop(job, ["mac2", "mac3"])) == 2


def test_the_global_batch_is_kept_by_raising_grad_accum_or_refused_with_the_arithmetic():
    # 3 ranks x 1 accum x 4: on 2 ranks a micro-batch of 6 would outgrow a rank's
    # memory; 2 ranks x 2 accum x 3 keeps the global batch and fits.
    assert accumulation_for(12, 2, micro_batch=4) == 2
    assert accumulation_for(12, 2, micro_batch=6) == 1
    assert accumulation_for(12, 1, micro_batch=4) == 3
    assert accumulation_for(20, 2, micro_batch=3) == 5  # 10 per rank: 5 x 2 (4 x 2.5 is no split)
    with pytest.raises(InputError) as refused:
        accumulation_for(9, 2, micro_batch=3)
    assert str(refused.value).startswith("global_batch 9 does not split over the 2 rank(s) left "
                                         "(9 % 2 = 1)")


def test_without_hosts_renumbers_the_ranks_and_a_failure_names_its_host():
    job = job_on("mac1", "mac2", "mac3")
    assert [h.name for h in without_hosts(job, {"mac1"}).hosts] == ["mac2", "mac3"]
    failed = failure_of_outcome(job, RunOutcome(exit_code=3, failed_rank=2, run_id="r1"))
    assert failed == Failure("rank 2 exited with code 3 (on mac3)", ("mac3",), "r1")
    lost = failure_of_outcome(job, RunOutcome(exit_code=255, lost_host="mac1", run_id="r2"))
    assert lost.hosts == ("mac1",) and "lost the ssh connection to mac1" in lost.cause


def test_the_restart_loop_reports_each_step_and_asks_the_caller_for_the_next_job():
    """The loop (jobs/restarts.py) on local ranks, with a stand-in launch: a
    failed launch is reported, then the restart, then the caller's notes;
    the second launch gets the caller's job; a refusal ends the loop at once
    (the CLI says it), however many restarts are left."""
    import sys

    from mlxcluster.jobs.events import LaunchFailed, Note, Restarting
    from mlxcluster.jobs.job import job_local
    from mlxcluster.jobs.restarts import launch_until_done

    job = job_local(2, "ring", sys.executable)
    outcomes = [RunOutcome(exit_code=3, failed_rank=1, run_id="r1"), RunOutcome(exit_code=0)]
    launched, events = [], []

    def launch(job):
        launched.append(job.env.get("K"))
        return outcomes.pop(0)

    def again(job, k):
        return replace(job, env={**job.env, "K": str(k)}), [f"again {k}"]

    last, outcome = launch_until_done(job, launch, Restarts(2), {}, again=again,
                                      on_event=events.append)
    assert outcome.exit_code == 0 and launched == [None, "1"] and last.env["K"] == "1"
    assert [type(e) for e in events] == [LaunchFailed, Restarting, Note]
    assert events[1] == Restarting(1, 2, "rank 1 exited with code 3 (on local-1)") and events[2].text == "again 1"

    refused = RunOutcome(exit_code=2, lines=("usage: mlx.launch [-h]",
                                             "mlx.launch: error: unrecognized arguments: --bogus"))
    assert refused.refusal == "unrecognized arguments: --bogus"
    events.clear()
    calls = []
    _, outcome = launch_until_done(job, lambda j: calls.append(j) or refused, Restarts(2), {},
                                   again=again, on_event=events.append)
    assert outcome is refused and len(calls) == 1 and events == []


@pytest.mark.parametrize("started, launches", [(False, 1), (True, 3), (None, 3)])
def test_exit_2_before_the_first_step_is_not_restarted(started, launches):
    """A rank that exits with 2 before the program's first step or answer
    refused its arguments or input (argparse's and click's code): launching
    again would be refused the same way. After a step (or unwatched: None)
    exit 2 is restarted as any failure."""
    import sys

    from mlxcluster.jobs.job import job_local
    from mlxcluster.jobs.restarts import launch_until_done

    job = job_local(2, "ring", sys.executable)
    lines = ("[0] usage: train.py [-h] [--steps STEPS]",
             "[0] train.py: error: unrecognized arguments: --stpes 3")
    refused = RunOutcome(exit_code=2, failed_rank=0, lines=lines, run_id="r1", started=started)
    calls = []
    _, outcome = launch_until_done(job, lambda j: calls.append(j) or refused, Restarts(2), {},
                                   again=lambda j, k: (j, []), on_event=lambda e: None)
    assert len(calls) == launches and outcome == refused
    assert refused.refused_at_start is (started is False)
    assert refused.usage_words() == "unrecognized arguments: --stpes 3"
    assert replace(refused, exit_code=1).refused_at_start is False  # only 2 is a usage error


def test_usage_words_read_click_and_the_trainer_s_form_or_nothing():
    assert RunOutcome(2, lines=("Error: No such option: --prot",)).usage_words() == \
        "No such option: --prot"
    assert RunOutcome(2, lines=("[1] error: --lora_rank must be positive", "[1] bye")).usage_words() \
        == "--lora_rank must be positive"
    assert RunOutcome(2, lines=("Traceback (most recent call last):", "ValueError: x")).usage_words() \
        is None
