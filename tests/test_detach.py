"""A detached rank (rank wrapper, MLXCLUSTER_DETACH=1): it runs in a session
of its own with its output in its files; the process the launcher started
only relays it, and killing that relay (a launcher gone, a hung-up ssh
session) leaves the rank running to its end. jobs/follow.py then reads
every line from the first and returns the rank's exit code. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from mlxcluster.jobs import follow
from mlxcluster.jobs.attach import parse_probe
from mlxcluster.jobs.rank_wrapper import DETACH_VAR
from tests import waits
from tests.waits import poll_until

REPO = Path(__file__).resolve().parents[1]
PROGRAM = """
import os, sys, time
print("started", os.getpid(), os.getsid(0), flush=True)
print("on stderr", file=sys.stderr, flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("finished", flush=True)
sys.exit(int(sys.argv[2]))
"""


def start(tmp_path: Path, code: int) -> tuple[subprocess.Popen, Path, Path]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    stacks, go = tmp_path / "stacks", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLX_RANK": "0", DETACH_VAR: "1",
           "MLXCLUSTER_STACKS_DIR": str(stacks)}
    relay = subprocess.Popen([sys.executable, "-X", "mlxcluster_run=mlxtrain-0000d37ac4", "-m",
                              "mlxcluster.jobs.rank_wrapper", str(script), str(go), str(code)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    return relay, stacks, go


def test_the_relay_passes_the_lines_and_the_exit_code_on(tmp_path):
    relay, stacks, go = start(tmp_path, 3)
    first = relay.stdout.readline().split()
    assert first[0] == "started"
    rank_pid, session = int(first[1]), int(first[2])
    assert rank_pid != relay.pid and session == rank_pid  # its own process, its own session
    assert (stacks / "rank0.pid").read_text().split()[0] == str(rank_pid)
    go.touch()
    out, err = relay.communicate(timeout=30)
    assert relay.returncode == 3 and out == "finished\n"
    assert "on stderr" in err and "@@mlxcluster-exit 0 3 " in err
    assert (stacks / "rank0.exit").read_text() == "3\n"
    assert (stacks / "rank0.out").read_text() == f"started {rank_pid} {rank_pid}\nfinished\n"


def test_the_rank_outlives_its_relay_and_is_followed_to_its_end(tmp_path, capfd):
    relay, stacks, go = start(tmp_path, 0)
    rank_pid = int(relay.stdout.readline().split()[1])
    os.killpg(relay.pid, signal.SIGKILL)  # the launcher's process and its group: the rank is not in it
    relay.wait()
    assert psutil.pid_exists(rank_pid) and psutil.Process(rank_pid).status() != psutil.STATUS_ZOMBIE
    go.touch()
    poll_until(lambda: (stacks / "rank0.exit").exists(), 30, "the rank's end")
    assert follow.main(str(stacks)) == 0
    said = capfd.readouterr()
    assert said.out == f"started {rank_pid} {rank_pid}\nfinished\n" and "on stderr" in said.err
    assert parse_probe('@@ranks 1\n["/x/prog.py", "--out", "runs/a"]\n') == (
        1, ("/x/prog.py", "--out", "runs/a"))


def test_a_rank_a_signal_ended_is_followed_as_killed(tmp_path, capfd):
    relay, stacks, _ = start(tmp_path, 0)
    rank_pid = int(relay.stdout.readline().split()[1])
    os.kill(rank_pid, signal.SIGKILL)
    relay.communicate(timeout=30)
    assert relay.returncode == 128 + signal.SIGKILL
    assert follow.main(str(stacks)) == follow.KILLED
    assert follow.main(str(tmp_path / "nothing")) == 3


RUN_PROGRAM = """
import os, sys, time
print("rank", os.environ.get("MLX_RANK"), "up", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("rank", os.environ.get("MLX_RANK"), "done", flush=True)
"""


def test_run_detach_outlives_its_controller_and_attach_follows_it_to_the_end(tmp_path):
    """`mlxcluster run --local 2 --detach`, the controller killed (its
    process group, as a closed terminal): both ranks go on, `jobs` lists the
    run, `attach` shows every line from the first and ends with exit 0."""
    script, go = tmp_path / "prog.py", tmp_path / "go"
    script.write_text(RUN_PROGRAM)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    mlxcluster = [sys.executable, "-m", "mlxcluster"]
    proc = subprocess.Popen([*mlxcluster, "run", "--local", "2", "--no-preflight", "--detach", "--",
                             "python", str(script), str(go)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen = []
    try:
        while sum(" up" in line for line in seen) < 2:
            line = proc.stdout.readline()
            assert line, "".join(seen)
            seen.append(line)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run_id = next(w for line in seen for w in line.replace(",", " ").split() if w.startswith("mlxrun-"))
    try:
        listed = waits.run([*mlxcluster, "jobs", "--local"], env=env, cwd=tmp_path)
        assert f"{run_id} " in listed.stdout and "2 on local-0" in listed.stdout, listed
        go.touch()
        attached = waits.run([*mlxcluster, "attach", "--local", run_id], env=env, cwd=tmp_path)
    finally:
        subprocess.run([*mlxcluster, "stop", "--local", "--grace", "2s", run_id], env=env,
                       capture_output=True, timeout=60)
    assert attached.returncode == 0, attached.stdout + attached.stderr
    for rank in ("0", "1"):
        assert f"[{rank}] rank {rank} up" in attached.stdout
        assert f"[{rank}] rank {rank} done" in attached.stdout
    assert f"{run_id} finished: every rank ended well" in attached.stdout
    assert run_id not in waits.run([*mlxcluster, "jobs", "--local"], env=env, cwd=tmp_path).stdout
