"""mlxcluster run without launching: the program every rank runs, the
launcher commands and probe built from it, rank tags and per-rank logs, and
the any-line stall watch."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest

from mlxcluster.errors import InputError
from mlxcluster.inventory.inventory import parse_inventory
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.jobs.job import (
    job_from_inventory,
    package_root,
    program_command,
    rank_env,
    rank_program,
)
from mlxcluster.jobs.plan import launcher_argv, write_hostfile
from mlxcluster.jobs.preflight import HostProbe, check_probes
from mlxcluster.jobs.run_output import RankLogs, is_python_word, program_argv, split_rank
from mlxcluster.jobs.stall import LineWatch
from mlxcluster.launch.trainer import parse_trainer_args, trainer_job
from tests.fakes import Clock

INVENTORY = """
cluster: lab
python: /opt/venv/bin/python
env:
  PYTHONPATH: /srv/shared/lib
hosts:
  - name: mac1
    ssh: mac1.local
    ips: [10.0.0.1]
  - name: mac2
    ssh: 10.0.0.2
"""


@pytest.mark.parametrize("words, want", [
    (["python", "train.py", "--lr", "0.1"], ("/work/proj/train.py", "--lr", "0.1")),
    (["train.py"], ("/work/proj/train.py",)),
    (["python3.12", "sub/../t.py", "-m", "x"], ("/work/proj/t.py", "-m", "x")),
    (["/usr/bin/python3", "/abs/t.py"], ("/abs/t.py",)),
    (["python", "-m", "pkg.mod", "--x"], ("-m", "pkg.mod", "--x")),
    (["-m", "pkg.mod"], ("-m", "pkg.mod")),
])
def test_program_after_the_double_dash(words, want):
    assert program_argv(words, cwd="/work/proj") == want


@pytest.mark.parametrize("words, said", [
    ([], "no program to run"), (["python"], "no program to run"), (["-m"], "-m needs a module"),
    (["python", "-c", "print(1)"], "not python '-c'"),
])
def test_bad_programs_are_input_errors(words, said):
    with pytest.raises(InputError, match=said):
        program_argv(words, cwd="/x")


def test_python_words():
    assert is_python_word("python") and is_python_word("/opt/venv/bin/python3.11")
    assert not is_python_word("pythonic.py") and not is_python_word("train.py")


def test_a_run_job_goes_through_the_same_launch_commands_as_train(tmp_path):
    job = replace(job_from_inventory(parse_inventory(INVENTORY), "ring"),
                  program=("/work/t.py", "--a"), tag_output=True)
    assert rank_program(job) == ("/work/t.py", "--a")
    assert program_command(job) == "/opt/venv/bin/python /work/t.py --a"
    env = rank_env(job)
    assert env["MLXCLUSTER_TAG_OUTPUT"] == "1"
    # mlxcluster (the rank wrapper) first, then the inventory's own PYTHONPATH
    assert env["PYTHONPATH"] == f"{package_root()}{os.pathsep}/srv/shared/lib"
    argv = launcher_argv(job, write_hostfile(job, tmp_path), ["-m", "mlxcluster.jobs.rank_wrapper",
                                                             *rank_program(job)])
    assert "--env=MLXCLUSTER_TAG_OUTPUT=1" in argv
    assert argv[-5:] == ["--", "-m", "mlxcluster.jobs.rank_wrapper", "/work/t.py", "--a"]
    train = trainer_job(job_from_inventory(parse_inventory(INVENTORY), "ring"),
                        parse_trainer_args(("--steps", "2")))
    assert rank_program(train) == ("-m", "reference_train.train", "--progress", "false",
                                   "--steps", "2")
    assert "MLXCLUSTER_TAG_OUTPUT" not in rank_env(train)


def test_probe_problems_for_a_run_job():
    job = replace(job_from_inventory(parse_inventory(INVENTORY), "ring"), program=("/w/t.py",))
    a, b = RankHost("mac1", "mac1.local", ("10.0.0.1",), "/py"), RankHost("mac2", "10.0.0.2", ("10.0.0.2",), "/py")
    ok = {"mlx": "0.32.4"}  # no reference_train: run does not need it
    assert check_probes(job, [HostProbe(a, {**ok, "script": True}),
                              HostProbe(b, {**ok, "script": True})]) == []
    problems = check_probes(job, [HostProbe(a, {**ok, "script": True}),
                                  HostProbe(b, {**ok, "script": False})])
    assert problems == ["mac2: no file /w/t.py (every rank runs it from that path; copy it there "
                        "or use a shared folder)"]
    module = replace(job, program=("-m", "pkg.mod"))
    assert check_probes(module, [HostProbe(a, ok)]) == []
    train = replace(job, program=("-m", "reference_train.train"), imports=("reference_train.train",))
    assert check_probes(train, [HostProbe(a, {**ok, "import_errors": {}})]) == []
    said = {"reference_train.train": "ModuleNotFoundError: No module named 'reference_train'"}
    assert check_probes(train, [HostProbe(a, {**ok, "import_errors": said})]) == [
        "mac1: reference_train.train does not import: ModuleNotFoundError: No module named "
        "'reference_train'"]


def test_a_login_shell_that_cannot_parse_the_launch_stops_the_job_before_it_hangs():
    """fish parses no launcher's command line (measured: mlx.launch and mpirun
    hang); dash parses mpirun's only. A local rank is started by bash, not over ssh."""
    ring = replace(job_from_inventory(parse_inventory(INVENTORY), "ring"), program=("-m", "pkg"))
    mpi = replace(ring, backend="mpi")
    a = RankHost("mac1", "mac1.local", ("10.0.0.1",), "/py")
    here = RankHost("local", "127.0.0.1", ("127.0.0.1",), "/py")
    fish = {"mlx": "0.32.4", "login_shell": "/opt/homebrew/bin/fish", "shell_kind": "other"}
    dash = {"mlx": "0.32.4", "login_shell": "/bin/sh", "shell_kind": "posix"}
    assert check_probes(ring, [HostProbe(a, fish)]) == [
        "mac1: its login shell /opt/homebrew/bin/fish cannot parse the command line mlx.launch "
        "sends over ssh (the launch would hang, or that rank exit 2): chsh -s /bin/zsh (macOS) "
        "or chsh -s /bin/bash (Linux) there"]
    assert "mpirun sends" in check_probes(mpi, [HostProbe(a, fish)])[0]
    assert "mlx.launch sends" in check_probes(ring, [HostProbe(a, dash)])[0]
    assert check_probes(mpi, [HostProbe(a, dash)]) == []
    assert here.is_local and check_probes(ring, [HostProbe(here, fish)]) == []


def test_rank_tags_and_one_log_per_rank(tmp_path):
    assert split_rank("[12] loss 2.3") == (12, "loss 2.3")
    assert split_rank("[0] ") == (0, "")
    assert split_rank("[WARN] Node with rank 1 exited with code 3") == (None, "[WARN] Node with "
                                                                          "rank 1 exited with code 3")
    logs = RankLogs(tmp_path / "logs")
    assert logs.write("[1] hello\r") == (1, "hello\r")
    logs.write("[0] zero")
    logs.write("[1] again")
    logs.write("mpirun says")
    logs.close()
    assert (tmp_path / "logs/rank1.log").read_text() == "hello\nagain\n"
    assert (tmp_path / "logs/rank0.log").read_text() == "zero\n"
    assert (tmp_path / "logs/launcher.log").read_text() == "mpirun says\n"
    assert logs.tail(1) == ["hello", "again"] and logs.tail(5) == []
    for i in range(30):
        logs.write(f"[3] line {i}")
    assert logs.tail(3) == [f"line {i}" for i in range(10, 30)]  # the last 20


def test_any_line_is_progress_for_a_run():
    clock = Clock(0.0)
    watch = LineWatch(20.0, clock=clock)
    clock.now = 19.0
    assert not watch.stalled()
    clock.now = 21.0
    assert watch.stalled()  # no startup grace: the given limit counts from the launch
    assert watch.feed("[1] still working") == "[1] still working"
    clock.now = 40.0
    assert not watch.stalled()
    clock.now = 42.0
    assert watch.stalled()


def test_a_port_block_handed_out_is_not_handed_out_again_while_claimed(tmp_path, monkeypatch):
    """Two runs of one machine choosing ports at the same moment: the second
    does not get the first's block, though both are free until bound."""
    import mlxcluster.jobs.plan as plan

    monkeypatch.setattr(plan, "PORT_CLAIMS", tmp_path / "claims")
    monkeypatch.setattr(plan.secrets, "randbelow", lambda n: 7)  # both start at the same block
    first = plan.free_port_block(2)
    second = plan.free_port_block(2)
    assert second != first and (tmp_path / "claims" / str(first)).exists()
    assert not plan.claim_port(first)
    assert plan.claim_port(first, now=time.time() + plan.CLAIM_S + 1)  # an old claim lapses
