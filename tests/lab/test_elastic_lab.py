"""`mlxcluster train --max-restarts 2 --elastic` on three lab hosts, each with
its own disk: a host loses its link mid-run (not rank 0's, then rank 0's).
The job is stopped everywhere, the host found unreachable and dropped, and
training goes on with the other two from the newest checkpoint they hold,
the same global batch (grad_accum raised so that no rank's micro-batch
grows), and ends with exit 0 and the losses of one uninterrupted process at
every step. Nothing of the run is left on any host, the lost one included
once it answers again."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from tests import waits
from tests.lab.jobs import bracketed, data_here, left_on_hosts, records, training_setup
from tests.train_support import run_trainer, train_losses
from tests.waits import ELASTIC_STALL_TIMEOUT_S

pytestmark = pytest.mark.lab

STEPS = 150
PARITY = 1.1e-6  # one process against 3 local ranks over 400 steps (docs/training-cluster.md)


def common(data) -> list[str]:
    return ["--steps", str(STEPS), "--global_batch", "12", "--eval_every", "0",
            "--sample_tokens", "0", "--data", str(data)]


@pytest.fixture(scope="module")
def reference(lab_data, tmp_path_factory) -> dict[int, float]:
    """The same run in one process, uninterrupted."""
    out = tmp_path_factory.mktemp("elastic-reference")
    proc = run_trainer(["--config", "tiny", *common(lab_data), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return train_losses(out)


# shared-out: --out on a folder every host sees (tmp_path: outside lab.disk),
# as on a NAS: the checkpoints are written once, by one writer for them all
# (docs/training-cluster.md, "Shared storage"), before and after the drop.
@pytest.mark.parametrize("lost,shared", [(2, False), (0, False), (2, True)],
                         ids=["labhost3", "labhost1-rank0", "labhost3-shared-out"])
def test_a_lost_host_is_dropped_and_the_run_ends_with_the_reference_losses(
        lab3, lab_data, tmp_path, reference, lost, shared):
    inventory, env = training_setup(lab3, tmp_path)
    out = (tmp_path if shared else lab3.disk) / f"elastic-{uuid.uuid4().hex[:8]}"
    metrics = out / "metrics.jsonl"  # the record, on this machine
    victim = lab3.hosts[lost]
    job = subprocess.Popen(
        [sys.executable, "-m", "mlxcluster", "train", "-i", str(inventory), "--no-preflight",
         "--config", "tiny", "--stall-timeout", f"{ELASTIC_STALL_TIMEOUT_S}s", "--max-restarts", "2",
         "--elastic", "--html", str(tmp_path / "run.html"), "--", *common(data_here(lab3, lab_data)), "--out", str(out)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    back_in = None
    try:
        def logged(count: int) -> bool:
            assert job.poll() is None, job.communicate()
            return sum("loss" in r for r in records(metrics)) >= count

        def training_again() -> bool:  # a loss logged after the second start
            assert job.poll() is None, job.communicate()
            got = records(metrics)
            starts = [i for i, r in enumerate(got) if r.get("event") == "start"]
            return len(starts) == 2 and any("loss" in r for r in got[starts[1]:])

        progress = waits.Progress([metrics])
        waits.wait_for(lambda: logged(30), "30 losses", progress)
        lab3.link_down(victim)
        lost_at = time.monotonic()
        waits.wait_for(training_again, f"training again without {victim.name}", progress)
        back_in = time.monotonic() - lost_at
        lab3.heal(victim)  # it answers again: the end of the run sweeps it
        stdout, stderr = waits.communicate(job, "the elastic run's end", paths=[metrics])
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        lab3.heal(victim)
    lab3.end_orphaned_sessions(victim)  # sshd's sessions the cut link left (test_dead_host_lab)
    print(f"{victim.name} lost: training again after {back_in:.1f} s "
          f"(stall timeout {ELASTIC_STALL_TIMEOUT_S} s)")
    text = stdout + stderr
    assert job.returncode == 0, text[-4000:]
    assert "Traceback" not in text
    rest = [h.name for h in lab3.hosts if h is not victim]
    assert f"dropped {victim.name} (unreachable over ssh): going on with 2 rank(s) on " \
           f"{', '.join(rest)}" in text, text[-3000:]
    assert "grad_accum 1 -> 2: the global batch stays 12 = 2 ranks x 2 accum x 3" in text
    assert "train finished on 2 rank(s)" in text and "after 1 restart(s)" in text
    got = records(metrics)
    events = [r for r in got if "event" in r]
    assert [e["event"] for e in events] == ["start", "restart", "host_dropped", "start"]
    assert events[2]["host"] == victim.name and events[2]["ranks"] == 2
    assert events[3]["ranks"] == 2 and events[3]["step"] > 0
    losses = {r["step"]: r["loss"] for r in got if "loss" in r}
    assert sorted(losses) == list(range(1, STEPS + 1))
    worst = max(abs(losses[s] - reference[s]) / abs(reference[s]) for s in reference)
    assert worst <= PARITY, worst
    page = (tmp_path / "run.html").read_text()  # the HTML report's training section
    assert f"dropped {victim.name} (unreachable over ssh): going on with 2 rank(s), " \
           "grad_accum 2" in page
    assert "restart 1/2 after:" in page and "resuming at step" in page
    for name in rest:  # both hosts left hold the last checkpoint on their own disks (or the one)
        assert lab3.host_read(name, out / "checkpoints" / "latest").strip() == f"step_{STEPS:06d}"
    if shared:  # one writer for the folder, before the drop and after: no race, nothing half-made
        assert "shared storage: labhost1, labhost2, labhost3 see one --out" in text
        assert "shared storage: labhost1, labhost2 see one --out" in text
        assert [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")] == []
    time.sleep(1)
    assert left_on_hosts(lab3, bracketed(f"reference_train.*{out.name}")) == {}
