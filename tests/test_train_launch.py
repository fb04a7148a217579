"""mlxcluster train: job building, launcher commands, failure handling, and the CLI on --local.

The launchers are real (mlx.launch with local ranks, Open MPI's mpirun on
localhost); only the programs they start are small stand-ins where a test
needs one rank to fail.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main as cli
from mlxcluster.errors import BackendUnavailable, InputError
from mlxcluster.facts.mpi import find_mpirun
from mlxcluster.inventory.inventory import parse_inventory
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.jobs.job import job_from_hostfile, job_from_inventory, job_local, rank_env
from mlxcluster.jobs.plan import launcher_argv, write_hostfile
from mlxcluster.jobs.preflight import HostProbe, check_probes, common_openblas, openblas_env
from mlxcluster.jobs.rank_wrapper import RANK_ENV_VAR
from mlxcluster.jobs.watch import failed_rank, launcher_error, run_streaming
from mlxcluster.launch.trainer import check_batch_split
from reference_train.config import build_config
from reference_train.data import split_batch
from tests import waits

from .conftest import require
from .train_launch_support import INVENTORY, nothing_may_start  # noqa: F401 (a fixture)
from .train_support import MLX_LAUNCH


def test_job_from_inventory_and_hostfile(tmp_path):
    job = job_from_inventory(parse_inventory(INVENTORY), "ring")
    assert [(h.name, h.ssh, h.ip) for h in job.hosts] == [("mac1", "mac1.local", "10.0.0.1"),
                                                          ("mac2", "10.0.0.2", "10.0.0.2")]
    assert job.python == "/opt/venv/bin/python" and job.ssh_config == "/tmp/ssh_config"
    hostfile = tmp_path / "h.json"
    hostfile.write_text(json.dumps({"backend": "mpi", "hosts": [
        {"ssh": "a", "ips": ["10.1.0.1"]}, {"ssh": "b", "ips": []}]}))
    job = job_from_hostfile(hostfile, None, "/py")
    assert job.backend == "mpi" and [h.ip for h in job.hosts] == ["10.1.0.1", "b"]
    with pytest.raises(BackendUnavailable, match="not 'nccl'"):
        job_from_hostfile(hostfile, "nccl", "/py")
    # jaccl is planned from the file's rdma rows; a ring/mpi file has none (tests/test_jaccl_plan.py)
    assert job_from_hostfile(hostfile, "jaccl", "/py").mlx_hostfile.hosts[0].rdma == ()
    hostfile.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        job_from_hostfile(hostfile, None, "/py")


def test_hosts_with_different_pythons_or_env_are_refused():
    text = INVENTORY + "    python: /other/python\n"
    with pytest.raises(InputError, match="different python paths"):
        job_from_inventory(parse_inventory(text), "ring")
    text = INVENTORY + "    env: {MLX_MPI_LIBNAME: /x/libmpi.so}\n"  # the last host's own: per rank
    job = job_from_inventory(parse_inventory(text), "ring")
    assert "MLX_MPI_LIBNAME" not in job.env and RANK_ENV_VAR in rank_env(job)
    text = INVENTORY + "    env: {DYLD_LIBRARY_PATH: /x}\n"  # read before a rank could set it
    with pytest.raises(InputError, match="DYLD_LIBRARY_PATH differs between hosts"):
        rank_env(job_from_inventory(parse_inventory(text), "ring"))
    shared = INVENTORY.replace("hosts:", "env: {MLX_MPI_LIBNAME: /x/libmpi.so}\nhosts:")
    job = job_from_inventory(parse_inventory(shared), "mpi")
    assert job.env == {"MLX_MPI_LIBNAME": "/x/libmpi.so"}
    argv = launcher_argv(job, Path("/tmp/h"), ["-m", "x"])
    assert argv.count("MLX_MPI_LIBNAME=/x/libmpi.so") == 1  # the inventory's value wins
    assert not any(a.startswith("MLX_MPI_LIBNAME=/tmp") for a in argv)


def test_launcher_commands_for_ring_and_mpi(tmp_path):
    job = job_from_inventory(parse_inventory(INVENTORY), "ring")
    argv = launcher_argv(job, write_hostfile(job, tmp_path), ["-m", "reference_train.train"])
    assert Path(argv[0]).name == "mlx.launch"
    assert argv[argv.index("--python") + 1] == "/opt/venv/bin/python"
    assert any(a.startswith("--env=PYTHONPATH=") for a in argv)
    assert argv[-3:] == ["--", "-m", "reference_train.train"]
    hosts = json.loads((tmp_path / "hosts.json").read_text())["hosts"]
    assert hosts == [{"ssh": "mac1.local", "ips": ["10.0.0.1"]}, {"ssh": "10.0.0.2", "ips": ["10.0.0.2"]}]

    mpi = job_from_inventory(parse_inventory(INVENTORY), "mpi",
                             mpi_args=("--mca btl_tcp_if_include 10.0.0.0/24",))
    argv = launcher_argv(mpi, write_hostfile(mpi, tmp_path), ["-m", "x"])
    assert Path(argv[0]).name == "mpirun"
    assert (tmp_path / "mpi_hosts").read_text() == "10.0.0.1 slots=1\n10.0.0.2 slots=1\n"
    assert any(a.startswith("MLX_MPI_LIBNAME=") for a in argv)
    assert argv[-7:] == ["--mca", "btl_tcp_if_include", "10.0.0.0/24",
                         "--", "/opt/venv/bin/python", "-m", "x"]


def probe(name, **facts):
    return HostProbe(RankHost(name, name, (name,), "/py"), facts)


def test_probe_problems_and_openblas_choice():
    job = job_local(2, "ring", sys.executable)
    good = probe("a", mlx="0.32.4", reference_train=True, platform="linux", openblas="/lib/ob.so")
    assert check_probes(job, [good]) == []
    problems = check_probes(job, [
        good,
        probe("b", mlx="0.31.0", reference_train=True, platform="linux", openblas=None),
        probe("c", mlx_error="ModuleNotFoundError: No module named 'mlx'"),
        HostProbe(RankHost("d", "d", ("d",), "/py"), {}, "ssh: connect to host d port 22: Connection refused"),
    ])
    assert problems[0] == "c: mlx does not import: ModuleNotFoundError: No module named 'mlx'"
    assert problems[1].startswith("d: cannot run") and "Connection refused" in problems[1]
    assert problems[2] == "mlx versions differ between hosts: a 0.32.4, b 0.31.0"
    assert common_openblas([good, good]) == "/lib/ob.so"
    assert common_openblas([good, probe("b", platform="linux", openblas=None)]) is None
    assert common_openblas([probe("m", platform="darwin", openblas="/x")]) is None
    # 2 local ranks on an 8-core host: 4 OpenBLAS threads each
    assert openblas_env(job, [probe("127.0.0.1", platform="linux", openblas="/o.so", cpus=8)]) == {
        "LD_PRELOAD": "/o.so", "OPENBLAS_NUM_THREADS": "4"}
    assert openblas_env(job, [probe("127.0.0.1", platform="darwin", cpus=8)]) == {}
    # Every rank runs under mlxcluster.jobs.rank_wrapper: a host where it does not import is named.
    assert check_probes(job, [probe("e", mlx="0.32.4", reference_train=True,
                                    rank_wrapper_error="ModuleNotFoundError: No module named "
                                                       "'mlxcluster'")]) == [
        "e: mlxcluster.jobs.rank_wrapper (every rank runs under it) does not import: "
        "ModuleNotFoundError: No module named 'mlxcluster'"]


def test_failed_rank_from_real_launcher_messages():
    ring = ["\x1b[33m[WARN] Node with rank 1 exited with code 7 \x1b[0m",
            "\x1b[33m[WARN] Node with rank 0 was killed \x1b[0m"]
    assert failed_rank(ring, 0) == (7, 1)
    mpi = ["prterun detected that one or more processes exited with non-zero status,",
           "   Process name: [prterun-vm-1873@1,2]", "   Exit code:    3"]
    assert failed_rank(mpi, 3) == (3, 2)
    assert failed_rank(["all good"], 0) == (0, None)


def test_a_rank_the_launcher_stopped_is_not_blamed_before_the_one_that_failed():
    """mlx.launch TERMs the other ranks once one failed; if their warnings
    come before the lost host's (a CI run under heavy load reported "a rank
    exited with code -15" for a lost labhost3), rank 2 and 255 it is still;
    with nothing but stopped ranks, the first of them."""
    lost = ["\x1b[33m[WARN] Node with rank 0 exited with code -15 \x1b[0m",
            "\x1b[33m[WARN] Node with rank 1 exited with code -15 \x1b[0m",
            "\x1b[33m[WARN] Node with rank 2 exited with code 255 \x1b[0m"]
    assert failed_rank(lost, 0) == (255, 2)
    assert failed_rank(lost[:2], 0) == (-15, 0)


LAUNCHER_OUTPUT = Path(__file__).parent / "fixtures" / "launcher_output"  # README.md there


def captured(name: str) -> list[str]:
    return (LAUNCHER_OUTPUT / name).read_text().splitlines()


@pytest.mark.parametrize("name, returncode", [
    ("mpirun_abort_cascade.txt", 14),          # mpirun names rank 0's abort and exits 14
    ("mpirun_first_process_named.txt", 3),     # mpirun names rank 1 itself
    ("mlx_launch_rank1_exit3.txt", 0),         # ranks 0 and 2 failed after it, with exit lines
])
def test_the_first_failing_rank_and_its_own_code_from_real_output(name, returncode):
    """Rank 1 of 3 exited 3 while the others were in all_sum (lab, real
    launchers): whatever the cascade that followed, rank 1 and code 3."""
    lines = captured(name)
    assert failed_rank(lines, returncode) == (3, 1)
    assert launcher_error(lines) is None  # ranks ran: not "did not start the job"
    # The exit lines in any order of arrival: the earliest time decides.
    exits = [ln for ln in lines if "@@mlxcluster-exit" in ln]
    rest = [ln for ln in lines if "@@mlxcluster-exit" not in ln]
    assert failed_rank(rest + exits[::-1], returncode) == (3, 1)


def test_an_abort_cascade_without_exit_lines_is_not_a_refused_launch():
    """Before the rank wrapper wrote exit lines, mpirun's cascade (rank 2
    'calling abort' after rank 1 exited 3) was read as the launcher refusing
    the job: 'mpirun did not start the job', exit 1. The code stands, no rank
    is named (the abort's rank is not the one that failed first)."""
    lines = captured("mpirun_abort_cascade_before_exit_lines.txt")
    assert launcher_error(lines) is None
    assert failed_rank(lines, 3) == (3, None)


def test_exit_lines_are_read_only_in_their_own_form():
    mark = "[2] @@mlxcluster-exit 2 1 1795447955.8"
    assert failed_rank([mark, "[1] @@mlxcluster-exit 1 3 1795447955.6"], 0) == (3, 1)
    assert failed_rank([mark], 0) == (1, 2)
    # A program that prints the words itself, mid-line or unfinished, is not an exit line.
    assert failed_rank(["[0] said @@mlxcluster-exit 0 9 1.0", "[0] @@mlxcluster-exit 0 9"], 0) == \
        (0, None)


def test_exit_lines_are_read_not_shown():
    shown = []
    outcome = run_streaming(["sh", "-c", "echo a; echo '@@mlxcluster-exit 0 3 1.5' >&2; exit 3"],
                            lambda stream, line: shown.append(line))
    assert shown == ["a"]
    assert (outcome.exit_code, outcome.failed_rank) == (3, 0)


# What mpirun (Open MPI 5.0) printed here for a bad option, a bad directive and a
# missing program: none of them started a rank.
MPIRUN_UNKNOWN_OPTION = """--------------------------------------------------------------------------
An unrecognized option was included on the mpirun command line:

  Option: --bogus-flag

Please use the "mpirun --help" command to obtain a list of all
supported options.
--------------------------------------------------------------------------"""
MPIRUN_BAD_DIRECTIVE = """--------------------------------------------------------------------------
The specified mapby directive is not recognized:

  Directive: foo
  Valid directives: slot:hwthread:core:l1cache:l2cache:l3cache:numa:package:node:seq:ppr:rankfile:pe-list=

Please check for a typo or ensure that the directive is a supported one.
--------------------------------------------------------------------------"""
MPIRUN_NO_PROGRAM = """--------------------------------------------------------------------------
prterun was unable to launch the specified application as it could not
access an executable:

   Executable: /nonexistent/x
   Node: vm

while attempting to start process rank 0.
--------------------------------------------------------------------------"""


def test_launcher_error_only_when_no_rank_is_named():
    """mpirun refusing --mpi-arg=--bogus-flag (exit 213) was reported as 'a rank
    exited with code 213' though no rank ever started."""
    assert launcher_error(MPIRUN_UNKNOWN_OPTION.splitlines()) == (
        "An unrecognized option was included on the mpirun command line (Option: --bogus-flag)")
    assert launcher_error(MPIRUN_BAD_DIRECTIVE.splitlines()).startswith(
        "The specified mapby directive is not recognized (Directive: foo; Valid directives: ")
    assert launcher_error(MPIRUN_NO_PROGRAM.splitlines()) == (
        "prterun was unable to launch the specified application as it could not access an "
        "executable (Executable: /nonexistent/x; Node: vm)")
    assert launcher_error(["usage: mlx.launch [-h] ...", "mlx.launch: error: The hostfile is "
                           "malformed: no RDMA device is listed for a to b"]) == (
        "The hostfile is malformed: no RDMA device is listed for a to b")
    rank_failed = ["-" * 74, "prterun detected that one or more processes exited with non-zero "
                   "status,", "   Process name: [prterun-vm-1873@1,2]", "   Exit code:    3", "-" * 74]
    assert launcher_error(rank_failed) is None
    assert launcher_error(["\x1b[33m[WARN] Node with rank 1 exited with code 7 \x1b[0m"]) is None
    assert launcher_error(["error: global_batch 7 does not split evenly"]) is None


def test_unknown_backend_is_input_and_known_unsupported_is_unavailable():
    with pytest.raises(InputError, match="unknown backend 'bogus'"):
        job_from_inventory(parse_inventory(INVENTORY), "bogus")
    with pytest.raises(BackendUnavailable, match="not 'nccl'"):
        job_from_inventory(parse_inventory(INVENTORY), "nccl")


def test_train_hostfile_with_unknown_backend_exits_2(tmp_path):
    hostfile = tmp_path / "h.json"
    hostfile.write_text(json.dumps({"backend": "bogus", "hosts": [
        {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]}))
    result = CliRunner().invoke(cli, ["train", "--hostfile", str(hostfile), "--config", "tiny"])
    assert result.exit_code == 2, result.output
    assert "bogus" in result.output


def test_mpirun_refusing_an_option_is_not_blamed_on_a_rank(tmp_path):
    require(find_mpirun() is not None, "Open MPI's mpirun is not installed")
    result = CliRunner().invoke(cli, ["train", "--local", "2", "--backend", "mpi", "--no-preflight",
                                      "--mpi-arg=--bogus-flag", "--config", "tiny", "--",
                                      "--out", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert ("train failed: mpirun did not start the job, no rank ran: An unrecognized option "
            "was included on the mpirun command line (Option: --bogus-flag)") in result.output
    assert "rank exited" not in result.output


# Every rank prints its pid and leaves a mark in READY; rank 1 fails once all
# three marks are there (a fixed half second was too short under load: rank 2
# had not started when rank 1 failed, so it never printed its pid); rank 0
# would sleep for a minute unless stopped.
FAILING = ("import os, sys, time; r = int(os.environ.get('MLX_RANK') or "
           "os.environ['OMPI_COMM_WORLD_RANK']); print(f'rank {r} pid {os.getpid()}', flush=True);"
           " open(os.path.join('READY', str(r)), 'w').close();"
           " deadline = time.monotonic() + 20;"
           " [time.sleep(0.05) for _ in iter(lambda: len(os.listdir('READY')) < 3 and "
           "time.monotonic() < deadline, False)] if r == 1 else None;"
           " time.sleep(60 if r == 0 else 0.2); sys.exit(5 if r == 1 else 0)")


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_one_failing_rank_stops_all_and_gives_its_code(backend, tmp_path):
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    job = job_local(3, backend, sys.executable)
    ready = tmp_path / "ready"
    ready.mkdir()
    argv = launcher_argv(job, write_hostfile(job, tmp_path), ["-c", FAILING.replace("READY", str(ready))])
    lines: list[str] = []
    start = time.monotonic()
    outcome = run_streaming(argv, lambda stream, line: lines.append(line), timeout=60)
    assert time.monotonic() - start < 30, "rank 0 was not stopped"
    assert (outcome.exit_code, outcome.failed_rank) == (5, 1), lines
    pids = [int(ln.split()[-1]) for ln in lines if ln.startswith("rank ") and " pid " in ln]
    assert len(pids) == 3
    time.sleep(0.5)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
            f"/proc/{pid}/status").read_text().lower(), f"rank pid {pid} still running"


def test_cli_needs_a_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./cluster.yaml
    result = CliRunner().invoke(cli, ["train", "--config", "tiny"])
    assert result.exit_code == 2 and "no inventory: none given" in result.output
    assert "--hostfile FILE or --local N" in result.output
    (tmp_path / "h.json").write_text('{"hosts": [{"ssh": "a"}, {"ssh": "b"}]}')
    result = CliRunner().invoke(cli, ["train", "--config", "tiny", "--local", "2", "--hostfile", "h.json"])
    assert result.exit_code == 2 and "not several" in result.output


def test_cli_trains_on_two_local_ranks(tmp_path):
    require(MLX_LAUNCH is not None, "mlx.launch is not installed beside the test python")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    data = tmp_path / "data"
    from reference_train.prepare import prepare_offline

    prepare_offline(data, n_stories=300)
    proc = waits.run([sys.executable, "-m", "mlxcluster", "train", "--local", "2",
                           "--config", "tiny", "--", "--steps", "3", "--data", str(data),
                           "--out", str(tmp_path / "run"), "--sample_tokens", "0"],
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[✓] smoke: all_sum over 2 ranks on ring = 2" in proc.stdout
    assert "step      3/3 | loss" in proc.stdout
    assert "train finished on 2 rank(s)" in proc.stdout
    if sys.platform.startswith("linux") and "preloading OpenBLAS" in proc.stdout:
        assert "LD_PRELOAD=" in proc.stdout
    records = [json.loads(ln) for ln in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    assert records[0]["ranks"] == 2

    # A data folder that is missing on the hosts: only the ranks can tell, and
    # the one that fails is named with its exit code.
    bad = waits.run([sys.executable, "-m", "mlxcluster", "train", "--local", "2",
                          "--no-preflight", "--config", "tiny", "--",
                          "--data", str(tmp_path / "no-data"), "--out", str(tmp_path / "bad")],
                         env=env, cwd=tmp_path)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert f"error: {tmp_path / 'no-data' / 'meta.json'} not found" in bad.stderr
    assert "train failed: rank" in bad.stderr and "exited with code 2" in bad.stderr


def test_bad_trainer_arguments_fail_before_launch():
    """A typo in the trainer's flags is an input error (exit 2) found locally,
    before any rank starts."""
    from click.testing import CliRunner

    from mlxcluster.cli import main

    for extra, needle in ((["--config", "nope"], "no config 'nope'"),
                          (["--config", "tiny", "--", "--steps", "x"], "steps"),
                          (["--config", "tiny", "--", "--stepz", "3"], "unrecognized arguments: --stepz")):
        result = CliRunner().invoke(main, ["train", "--local", "2", *extra])
        assert result.exit_code == 2, result.output
        assert needle in result.output and "launching" not in result.output


def test_batch_split_is_checked_for_every_rank_count_like_the_ranks_do():
    """check_batch_split refuses exactly what the ranks' own split_batch refuses,
    and every value it suggests is one the ranks accept."""
    tiny = build_config(["--config", "tiny"])
    refused = 0
    for accum in (1, 2, 3):
        for ranks in range(1, 9):
            for batch in range(1, 41):
                cfg = replace(tiny, global_batch=batch, grad_accum=accum)
                try:
                    split_batch(batch, ranks, accum)
                    ranks_accept = True
                except ValueError:
                    ranks_accept = False
                if ranks_accept:
                    check_batch_split(cfg, ranks)
                    continue
                refused += 1
                with pytest.raises(InputError) as err:
                    check_batch_split(cfg, ranks)
                suggested = err.value.message.split("use --global_batch ")[1].split(" or ")
                assert suggested, err.value.message
                for value in map(int, suggested):
                    split_batch(value, ranks, accum)  # raises if the ranks would refuse it
                    assert abs(value - batch) < ranks * accum
    assert refused > 700  # the loop did exercise the refusals


def test_batch_split_message_shows_the_arithmetic_and_the_fix():
    tiny = build_config(["--config", "tiny"])
    with pytest.raises(InputError) as err:
        check_batch_split(tiny, 3)
    assert err.value.message == ("global_batch 8 does not split over 3 ranks (8 % 3 = 2): "
                                 "use --global_batch 6 or 9")
    assert "-- --global_batch 9" in err.value.hint and "1, 2, 4, 8" in err.value.hint
    accum = build_config(["--config", "tiny", "--grad_accum", "2", "--global_batch", "4"])
    with pytest.raises(InputError) as err:
        check_batch_split(accum, 3)
    assert err.value.message == ("global_batch 4 does not split over 3 ranks x grad_accum 2 = 6 "
                                 "micro-batches (4 % 6 = 4): use --global_batch 6")
    check_batch_split(tiny, 4)  # 8 over 4: fine


def test_batch_that_does_not_split_fails_before_anything_starts(tmp_path, nothing_may_start):  # noqa: F811
    """The tiny config's 8 sequences over 3 ranks: exit 2 with the arithmetic,
    from an inventory, a hostfile or --local, with or without the preflight;
    no probe, no smoke, no launcher."""
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(INVENTORY + "  - name: mac3\n    ssh: 10.0.0.3\n")
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps({"backend": "ring", "hosts": [
        {"ssh": f"10.0.0.{i}", "ips": [f"10.0.0.{i}"]} for i in (1, 2, 3)]}))
    for source in (["-i", str(inventory)], ["--hostfile", str(hostfile)], ["--local", "3"],
                   ["--local", "3", "--no-preflight"], ["-i", str(inventory), "--backend", "mpi"]):
        start = time.monotonic()
        result = CliRunner().invoke(cli, ["train", *source, "--config", "tiny", "--",
                                          "--out", str(tmp_path / "run")])
        assert result.exit_code == 2, (source, result.output)
        assert ("error: global_batch 8 does not split over 3 ranks (8 % 3 = 2): "
                "use --global_batch 6 or 9") in result.output, result.output
        assert "launching" not in result.output and "[✓]" not in result.output
        assert time.monotonic() - start < 5
    assert nothing_may_start == []
    # The same hosts with a batch that splits reach the hosts (which the fixture stops): the
    # python looked for first (missing is exit 2), before the code is sent and the preflight.
    result = CliRunner().invoke(cli, ["train", "-i", str(inventory), "--config", "tiny", "--",
                                      "--global_batch", "9", "--out", str(tmp_path / "run")])
    assert nothing_may_start == ["require_job_python"], result.output


def test_resume_alone_means_auto(tmp_path, monkeypatch):
    """`--resume` with no value (for the trainer, before or after `--`) is
    `--resume auto`; `--resume PATH` and `--resume auto` are kept."""
    monkeypatch.chdir(tmp_path)  # the run's record (default --out runs/reference) goes here
    assert build_config(["--resume"]).resume == "auto"
    assert build_config(["--resume", "--steps", "3"]).resume == "auto"
    assert build_config(["--steps", "3", "--resume"]).steps == 3
    assert build_config(["--resume", "auto"]).resume == "auto"
    assert build_config(["--resume", "runs/x/checkpoints/step_000005"]).resume == \
        "runs/x/checkpoints/step_000005"
    assert build_config([]).resume == ""

    import mlxcluster.launch.trainer as trainer
    from mlxcluster.jobs.watch import RunOutcome

    launched: list[tuple[str, ...]] = []

    def fake_launch(job, on_line, env=None, timeout=None, **_stall):
        launched.append(job.program[2:])
        return RunOutcome(exit_code=0, failed_rank=None, seconds=0.1)

    monkeypatch.setattr(trainer, "run_job", fake_launch)
    for args, want in ((["--", "--steps", "2", "--resume"], "auto"),
                       (["--", "--resume"], "auto"),
                       (["--", "--resume", "auto"], "auto"),
                       (["--", "--resume", str(tmp_path / "ck")], str(tmp_path / "ck"))):
        result = CliRunner().invoke(cli, ["train", "--local", "2", "--no-preflight",
                                          "--config", "tiny", *args])
        assert result.exit_code == 0, (args, result.output)
        # The ranks parse the same arguments with the same code:
        assert build_config(list(launched[-1])).resume == want, launched[-1]
