"""Launch plans, launcher output parsing and cleanup scripts: pure logic."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlxcluster.errors import InputError
from mlxcluster.jobs import hosts as job_hosts
from mlxcluster.jobs import plan as job_plan
from mlxcluster.jobs.cleanup import bracketed
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.jobs.rank_wrapper import RANK_ENV_VAR, apply_rank_env
from mlxcluster.jobs.watch import parse_launcher_exit
from mlxcluster.smoke import launch, remote
from mlxcluster.smoke.launch import WorkerOptions
from mlxcluster.smoke.watch import parse_event
from tests import waits
from tests.conftest import require

LAB = tuple(RankHost(f"labhost{i}", f"10.77.5.{10 + i}", (f"10.77.5.{10 + i}",), "/venv/bin/python",
                     user="root") for i in (1, 2, 3))


def test_a_ring_with_uneven_ip_counts_takes_each_hosts_first_ip():
    """MLX's ring fails at init when hosts list different numbers of IPs
    (inventory/example.yaml: one host with Ethernet and Thunderbolt IPs)."""
    two = replace(LAB[1], ips=(LAB[1].ips[0], "10.0.0.2"))
    plan = launch.plan_mlx_launch("ring", (LAB[0], two, LAB[2]), WorkerOptions(), {}, run_id="mlxsmoke-ab")
    hostfile = json.loads(plan.files["/tmp/mlxsmoke-ab/hostfile.json"])
    assert [h["ips"] for h in hostfile["hosts"]] == [[h.ips[0]] for h in LAB]
    even = tuple(replace(h, ips=(h.ips[0], f"10.0.0.{i}")) for i, h in enumerate(LAB))
    plan = launch.plan_mlx_launch("ring", even, WorkerOptions(), {}, run_id="mlxsmoke-ac")
    assert [h["ips"] for h in json.loads(plan.files["/tmp/mlxsmoke-ac/hostfile.json"])["hosts"]] == \
        [list(h.ips) for h in even]  # as many each: every link is used


def test_mpirun_plan_works_with_open_mpi_4_and_5(tmp_path):
    prefix = tmp_path / "mpi"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "bin" / "mpirun").write_text("")
    (prefix / "lib" / "libmpi.so.40").write_text("")
    plan = launch.plan_mpirun(LAB, WorkerOptions(), {"MLXCLUSTER_SMOKE_FAIL_RANK": "1", "HOME": "/r"},
                              run_id="mlxsmoke-0123456789", mpirun=str(prefix / "bin" / "mpirun"),
                              is_root=True)
    argv = plan.argv
    assert argv[:2] == [str(prefix / "bin" / "mpirun"), "--allow-run-as-root"]
    assert "--output" not in argv  # Open MPI 5 only; mlx.launch --backend mpi passes it
    pairs = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}
    assert pairs["btl"] == "tcp,self"
    assert pairs["btl_tcp_links"] == "4"
    assert pairs["btl_tcp_if_include"] == pairs["oob_tcp_if_include"] == "10.77.5.0/24"
    exports = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert f"MLX_MPI_LIBNAME={prefix / 'lib' / 'libmpi.so.40'}" in exports
    assert "MLXCLUSTER_SMOKE_FAIL_RANK=1" in exports and not any("HOME" in e for e in exports)
    assert "PYTHONPATH=/tmp/mlxsmoke-0123456789" in exports
    program = argv[argv.index("/venv/bin/python") + 1:]
    assert program[:5] == ["-X", "mlxcluster_run=mlxsmoke-0123456789", "-m",
                           "mlxcluster.jobs.rank_wrapper", "/tmp/mlxsmoke-0123456789/worker.py"]
    # Each host as the inventory logs in to it (user@, as in the JSON hostfile below)
    assert plan.files == {"/tmp/mlxsmoke-0123456789/mpi_hosts":
                          "root@10.77.5.11 slots=1\nroot@10.77.5.12 slots=1\nroot@10.77.5.13 slots=1\n"}
    assert "mlxsmoke-0123456789" in argv  # the marker cleanup looks for
    assert plan.env["PRTE_MCA_mlxcluster_run"] == "mlxsmoke-0123456789"  # and Open MPI's daemons carry
    assert plan.data_ports == tuple((h.ips[0], job_plan.MPI_BTL_PORT) for h in LAB)
    not_root = launch.plan_mpirun(LAB, WorkerOptions(), {}, mpirun=str(prefix / "bin" / "mpirun"),
                                  is_root=False)
    assert "--allow-run-as-root" not in not_root.argv


def test_mlx_launch_plan_writes_an_mlx_hostfile():
    plan = launch.plan_mlx_launch("ring", LAB, WorkerOptions(bench=True), {}, run_id="mlxsmoke-aa")
    hostfile = json.loads(plan.files["/tmp/mlxsmoke-aa/hostfile.json"])
    assert hostfile["backend"] == "ring"
    assert hostfile["hosts"][0] == {"ssh": "root@10.77.5.11", "ips": ["10.77.5.11"], "rdma": []}
    argv = plan.argv
    assert argv[argv.index("--python") + 1] == "/venv/bin/python"
    # Every rank runs under the jobs layer's rank wrapper, as train's and run's do.
    assert argv[argv.index("--") + 1:][:5] == [
        "-X", "mlxcluster_run=mlxsmoke-aa", "-m", "mlxcluster.jobs.rank_wrapper",
        "/tmp/mlxsmoke-aa/worker.py"]
    assert "--env=PYTHONPATH=/tmp/mlxsmoke-aa" in argv  # where the wrapper is staged
    assert "--bench" in argv and argv[argv.index("--expect") + 1] == "3"
    assert plan.data_ports == (("10.77.5.11", 32323), ("10.77.5.12", 32324), ("10.77.5.13", 32325))


def test_connections_per_ip_reach_mlx_launch_and_shift_the_ports():
    plan = launch.plan_mlx_launch("ring", LAB, WorkerOptions(connections_per_ip=2), {},
                                  run_id="mlxsmoke-ab")
    argv = plan.argv
    assert argv[argv.index("--connections-per-ip") + 1] == "2"
    assert argv.index("--connections-per-ip") < argv.index("--")  # a launcher flag, not the worker's
    # mlx.launch gives each rank one port per IP and connection: 2 here.
    assert plan.data_ports == (("10.77.5.11", 32323), ("10.77.5.12", 32325), ("10.77.5.13", 32327))
    default = launch.plan_mlx_launch("ring", LAB, WorkerOptions(), {}, run_id="mlxsmoke-ac")
    assert "--connections-per-ip" not in default.argv  # mlx.launch's own default (1)


def test_mlx_launch_refuses_what_it_cannot_do():
    mixed = (LAB[0], RankHost("x", "10.77.5.20", ("10.77.5.20",), "/other/python"))
    with pytest.raises(InputError, match="different pythons"):
        launch.plan_mlx_launch("ring", mixed, WorkerOptions(), {})
    with pytest.raises(InputError, match="RDMA device matrix"):
        launch.plan_mlx_launch("jaccl", LAB, WorkerOptions(), {})


def test_hosts_from_the_mlx_docs_hostfile(macos_fixtures, tmp_path):
    hosts, backend = job_hosts.hosts_from_hostfile(
        str(macos_fixtures / "mlx_hostfile_jaccl_4node_m3ultra_mlx_docs_list_form.json"), "/py")
    assert backend == ""
    assert [h.ssh for h in hosts] == ["m3-ultra-1", "m3-ultra-2", "m3-ultra-3", "m3-ultra-4"]
    assert hosts[0].ips == ("123.123.123.1",) and hosts[1].ips == ()
    assert hosts[2].rdma == ("rdma_en4", "rdma_en3", None, "rdma_en5")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        job_hosts.hosts_from_hostfile(str(bad))


def test_local_mpi_runs_over_loopback(tmp_path):
    prefix = tmp_path / "mpi"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "bin" / "mpirun").write_text("")
    (prefix / "lib" / "libmpi.so.40").write_text("")
    plan = launch.plan_mpirun(job_hosts.local_hosts(3), WorkerOptions(), {},
                              mpirun=str(prefix / "bin" / "mpirun"), is_root=False)
    pairs = {plan.argv[i + 1]: plan.argv[i + 2] for i, a in enumerate(plan.argv) if a == "--mca"}
    assert pairs["btl_tcp_if_include"] == "lo" and "oob_tcp_if_include" not in pairs
    assert list(plan.files.values()) == ["localhost slots=3\n"]


def test_launcher_exit_lines():
    pending = [None]
    # mlx.launch (seen here: rank 1 exited 3, launcher exit code 0)
    assert parse_launcher_exit("\x1b[33m[WARN] Node with rank 1 exited with code 3 \x1b[0m", pending) == (1, 3)
    assert parse_launcher_exit("[WARN] Node with rank 2 was killed", pending) == (2, None)
    # Open MPI 5.0.11, captured here
    assert parse_launcher_exit("   Process name: [prterun-vm-4304@1,1]", pending) is None
    assert parse_launcher_exit("   Exit code:    3", pending) == (1, 3)
    # Open MPI 4 (public issue thread: "Process name: [[56171,1],6] / Exit code: 3")
    assert parse_launcher_exit("  Process name: [[56171,1],6]", pending) is None
    assert parse_launcher_exit("  Exit code:    3", pending) == (6, 3)
    assert parse_launcher_exit("  Exit code:    3", pending) is None  # no process named before


def test_protocol_lines_survive_interleaving():
    line = 'garbage from another rank MLXSMOKE {"event": "done", "rank": 1, "ok": true}'
    assert parse_event(line) == {"event": "done", "rank": 1, "ok": True}
    assert parse_event('MLXSMOKE {"event": "done", "rank"') is None
    assert parse_event("plain output") is None


def test_cleanup_script_never_names_the_run_id_literally():
    plan = launch.plan_mlx_launch("ring", LAB, WorkerOptions(), {}, run_id="mlxsmoke-c0ffee1234")
    script = remote.remote_cleanup_script(plan, kill=True)
    assert "mlxsmoke-c0ffee1234" not in script  # pkill -f would match its own shell
    assert re.search(bracketed(plan.run_id), "python worker.py --run-id mlxsmoke-c0ffee1234")
    assert "pkill -TERM -f '[m]lxsmoke-c0ffee1234'" in script


@pytest.mark.parametrize("login_shell", ["bash", "zsh"])
@pytest.mark.parametrize("err_files", [0, 2])
def test_the_cleanup_script_reads_tails_and_removes_the_folder_under_either_login_shell(
        login_shell, err_files):
    """sshd runs the script through the user's login shell: zsh on a Mac. zsh
    fails a glob that matches nothing and drops the rest of the line, so a
    host whose run folder held no stderr file kept the folder (and the
    script exited 1). Run by the real shell, both cases: tails read, folder
    gone, exit 0."""
    require(shutil.which(login_shell) is not None,
            f"{login_shell} is not installed (make system-deps installs it)")
    run_id = f"mlxsmoke-shelltest{os.getpid()}{login_shell}{err_files}"
    plan = launch.plan_mlx_launch("ring", LAB, WorkerOptions(), {}, run_id=run_id)
    folder = Path("/tmp") / run_id
    folder.mkdir()
    try:
        (folder / "worker.py").write_text("staged\n")
        for rank in range(err_files):
            (folder / f"{run_id}.rank{rank}.err").write_text(f"rank {rank} said this\n")
        done = waits.run([login_shell, "-c", remote.remote_cleanup_script(plan, kill=True)])
        assert done.returncode == 0, done.stderr
        assert not folder.exists()
        expected = {rank: f"rank {rank} said this" for rank in range(err_files)}
        assert remote.parse_tails(done.stdout) == expected
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_stderr_tails_by_rank():
    out = ("==> /tmp/mlxsmoke-ab/mlxsmoke-ab.rank0.err\n\n"
           "==> /tmp/mlxsmoke-ab/mlxsmoke-ab.rank2.err\nTraceback...\nRuntimeError: boom\n\n")
    assert remote.parse_tails(out) == {0: "", 2: "Traceback...\nRuntimeError: boom"}
    # The rank wrapper's exit line lands in the worker's stderr file: not shown.
    wrapped = out + "==> /tmp/mlxsmoke-ab/mlxsmoke-ab.rank1.err\nboom\n@@mlxcluster-exit 1 3 1.5\n"
    assert remote.parse_tails(wrapped)[1] == "boom"


def test_the_staged_files_give_the_ranks_the_rank_wrapper_without_mlxcluster(tmp_path):
    """What stage sends every host, run by a real shell: the worker and the
    wrapper's package land in the run folder, and a python started as the
    ranks are (PYTHONPATH from the plan, another working directory) imports
    the wrapper from there and runs the worker under it."""
    plan = launch.plan_mlx_launch("ring", LAB, WorkerOptions(), {},
                                  run_id=f"mlxsmoke-stagetest{os.getpid()}")
    worker = "import sys\nprint('worker ran', sys.argv[1:])\nsys.exit(3)\n"
    script = remote.write_files_script(launch.staged_files(plan, worker))
    try:
        subprocess.run(["/bin/sh", "-s"], input=script, text=True, check=True, timeout=30)
        env = dict(e.split("=", 1) for e in launch.rank_env(LAB, {}, plan.run_dir))
        program = plan.argv[plan.argv.index("--") + 1:]
        done = waits.run([sys.executable, *program[:5], "--x"], cwd=tmp_path,
                              env={"PATH": os.environ["PATH"], **env, "MLX_RANK": "1",
                                   "MLXCLUSTER_STACKS_DIR": str(tmp_path / "stacks")})
    finally:
        shutil.rmtree(plan.run_dir, ignore_errors=True)
    assert done.stdout == "worker ran ['--x']\n"
    assert done.returncode == 3 and done.stderr.startswith("@@mlxcluster-exit 1 3 ")
    assert (tmp_path / "stacks" / "rank1.pid").read_text().split()[0].isdigit()
    with pytest.raises(ValueError, match="ends a staged file"):
        remote.write_files_script({"/tmp/x": f"a\n{remote.STAGE_END}\nb\n"})


def test_inventory_env_reaches_every_rank(tmp_path):
    from mlxcluster.inventory.inventory import parse_inventory

    inv = parse_inventory("cluster: c\npython: /venv/bin/python\nenv: {MLX_METAL_FAST_SYNCH: '1'}\n"
                          "hosts:\n  - {name: a, ssh: 10.0.0.1, ips: [10.0.0.1]}\n"
                          "  - {name: b, ssh: 10.0.0.2, ips: [10.0.0.2]}\n")
    hosts = job_hosts.hosts_from_inventory(inv)
    plan = launch.plan_mlx_launch("ring", hosts, WorkerOptions(), {"MLXCLUSTER_SMOKE_HANG_RANK": "0"})
    assert [a for a in plan.argv if a.startswith("--env=")] == [
        "--env=MLXCLUSTER_SMOKE_HANG_RANK=0", "--env=MLX_METAL_FAST_SYNCH=1",
        f"--env=PYTHONPATH={plan.run_dir}"]
    # A host's own env goes to its rank through the rank wrapper; a loader
    # variable cannot (it is read before the wrapper runs): refused, named.
    odd = (RankHost("a", "10.0.0.1", ("10.0.0.1",), "/venv/bin/python", env=(("X", "0"),)),
           RankHost("c", "10.0.0.3", ("10.0.0.3",), "/venv/bin/python", env=(("X", "1"), ("Y", "2"))))
    plan = launch.plan_mlx_launch("ring", odd, WorkerOptions(), {})
    env = dict(a.removeprefix("--env=").split("=", 1) for a in plan.argv if a.startswith("--env="))
    assert "X" not in env and "Y" not in env
    for rank, expected in enumerate(({"X": "0"}, {"X": "1", "Y": "2"})):
        environ = {RANK_ENV_VAR: env[RANK_ENV_VAR]}
        assert apply_rank_env(environ, str(rank)) == expected and environ == expected
    loader = (odd[0], replace(odd[1], env=(("LD_LIBRARY_PATH", "/other/lib"),)))
    with pytest.raises(InputError, match="LD_LIBRARY_PATH differs between hosts \\(c\\)"):
        launch.plan_mlx_launch("ring", loader, WorkerOptions(), {})


def test_user_mpi_args_override_the_plans_mca_parameters(tmp_path):
    """mpirun refuses one MCA parameter twice with different values: the
    user's --mpi-arg (mlxcluster train) replaces the plan's own."""
    prefix = tmp_path / "ompi"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "bin" / "mpirun").write_text("")
    (prefix / "lib" / "libmpi.so.40").write_text("")
    plan = launch.plan_mpirun(job_hosts.local_hosts(2), WorkerOptions(), {}, mpirun=str(prefix / "bin" / "mpirun"),
                              mpi_args=("--mca", "btl_tcp_links", "2"))
    links = [plan.argv[i + 2] for i, a in enumerate(plan.argv) if a == "--mca" and plan.argv[i + 1] == "btl_tcp_links"]
    assert links == ["2"]
    assert job_plan.without_mca(["--mca", "a", "1", "-x", "E=1", "--mca", "b", "2"], ("--mca", "b", "3")) == [
        "--mca", "a", "1", "-x", "E=1"]
