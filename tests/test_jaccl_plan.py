"""`mlxcluster train` / `run --backend jaccl|jaccl-ring`: the plan (hostfile
bytes, env, mlx.launch argv) built from real macOS captures (no Mac here),
and the "unavailable" path (exit 3 naming every host, nothing launched)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main
from mlxcluster.errors import BackendUnavailable, HostfileError, MlxclusterError
from mlxcluster.facts.capture import load_capture_dir
from mlxcluster.hostfile.jaccl_plan import (
    FAST_SYNCH_WARNING,
    JacclUnavailable,
    fast_synch_warning,
    hostfile_from_captures,
    jaccl_env,
)
from mlxcluster.inventory.inventory import parse_inventory
from mlxcluster.jobs import process
from mlxcluster.jobs import run as job_run
from mlxcluster.jobs.job import job_from_hostfile, job_from_inventory, job_local, plan_jaccl_job
from mlxcluster.jobs.plan import LaunchPlan, launcher_argv, mlx_launch_path, write_hostfile
from mlxcluster.launch.preflight import SMOKE_OPTIONS, smoke_ranks
from mlxcluster.smoke.launch import plan_launch
from tests.fakes import OK, FakeSsh
from tests.inventory_support import inventory_text
from tests.topology_helpers import (
    OSAURUS,
    RecordingCollect,
    make_capture_dir,
    slow_osaurus,
    tb5_pair,
)

PAIR_ROWS = {"jaccl": [[None, "rdma_en1"], ["rdma_en3", None]],
             "jaccl-ring": [[None, "rdma_en1"], ["rdma_en3", None]]}
FOUR_MAC = "mlx_hostfile_jaccl_4node_m3ultra_mlx_docs_list_form.json"
FOUR_MAC_MATRIX = "mlx_ibv_devices_matrix_MLX_IBV_DEVICES_mlx_docs.json"
PROGRAM = ["-m", "mlxcluster.jobs.rank_wrapper", "/abs/script.py", "--lr", "0.1"]


def flags(argv: list[str]) -> dict[str, str]:
    """mlx.launch's --env=K=V flags as a dict."""
    return dict(a[len("--env="):].split("=", 1) for a in argv if a.startswith("--env="))


def value_after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.fixture
def pair(macos_fixtures, tmp_path):
    """The two-Mac Thunderbolt 5 pair (omlx captures): inventory path, captures dir."""
    return tb5_pair(macos_fixtures, tmp_path)


def generated(inv_path: Path, backend: str, captures_dir: Path) -> str:
    """What `hostfile generate --backend B --from DIR -o -` writes."""
    result = CliRunner().invoke(main, ["hostfile", "generate", "-i", str(inv_path), "--backend",
                                       backend, "--from", str(captures_dir), "-o", "-"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("backend", ["jaccl", "jaccl-ring"])
def test_the_tb5_pair_plan_is_what_hostfile_generate_writes(pair, tmp_path, backend):
    inv_path, captures_dir = pair
    inventory = parse_inventory(inv_path.read_text(), str(inv_path))
    collect = RecordingCollect(load_capture_dir(captures_dir))
    job = plan_jaccl_job(job_from_inventory(inventory, backend), inventory, {}, collect)
    assert collect.probed == [["mbp", "studio"]]
    hostfile = write_hostfile(job, tmp_path)
    assert hostfile.read_text() == generated(inv_path, backend, captures_dir)
    assert [h["rdma"] for h in json.loads(hostfile.read_text())["hosts"]] == PAIR_ROWS[backend]
    assert job.env == {"MLX_JACCL_COORDINATOR": "10.9.0.1:32323"}  # fast synch: MLX's default

    argv = launcher_argv(job, hostfile, PROGRAM)
    assert argv[0] == mlx_launch_path() and argv[0].endswith("mlx.launch")
    assert value_after(argv, "--backend") == backend
    assert value_after(argv, "--hostfile") == str(hostfile)
    assert value_after(argv, "--python") == "/usr/bin/python3"
    assert value_after(argv, "--starting-port") == "32323"
    env = flags(argv)
    assert "MLX_METAL_FAST_SYNCH" not in env
    assert env["MLX_JACCL_COORDINATOR"] == "10.9.0.1:32323"  # rank 0's IP, as mlx.launch sets it
    assert env["MLXCLUSTER_HEARTBEAT"] == "1" and "PYTHONPATH" in env
    assert argv[argv.index("--") + 1:] == PROGRAM

    # The preflight's all_sum runs on the same rows (smoke's mlx.launch plan);
    # inside the ranks jaccl-ring is jaccl (mlx.launch adds MLX_JACCL_RING=1).
    assert [h.rdma for h in smoke_ranks(job)] == [tuple(r) for r in PAIR_ROWS[backend]]
    smoke = plan_launch(backend, smoke_ranks(job), SMOKE_OPTIONS, {})
    assert value_after(smoke.argv, "--backend") == backend
    worker = smoke.argv.index(f"{smoke.run_dir}/worker.py")  # after the rank wrapper
    assert smoke.argv[worker + 1:][:2] == ["--backend", "jaccl"]
    [smoke_hostfile] = smoke.files.values()
    assert [h["rdma"] for h in json.loads(smoke_hostfile)["hosts"]] == PAIR_ROWS[backend]


@pytest.mark.parametrize("backend", ["jaccl", "jaccl-ring"])
def test_the_four_mac_hostfile_plan(macos_fixtures, tmp_path, backend):
    """MLX's own four-Mac example (the docs' list form, IPs only on rank 0):
    the rdma matrix mlx.launch hands to every rank (MLX_IBV_DEVICES) is the docs' one."""
    job = job_from_hostfile(macos_fixtures / FOUR_MAC, backend, "/usr/bin/python3")
    job = plan_jaccl_job(job, None, {})
    hostfile = json.loads(write_hostfile(job, tmp_path).read_text())
    assert hostfile["backend"] == backend
    assert [h["ssh"] for h in hostfile["hosts"]] == [f"m3-ultra-{i}" for i in (1, 2, 3, 4)]
    matrix = json.loads((macos_fixtures / FOUR_MAC_MATRIX).read_text())
    assert [h["rdma"] for h in hostfile["hosts"]] == matrix
    argv = launcher_argv(job, tmp_path / "hosts.json", PROGRAM)
    assert value_after(argv, "--backend") == backend
    assert flags(argv)["MLX_JACCL_COORDINATOR"] == "123.123.123.1:32323"
    assert "MLX_METAL_FAST_SYNCH" not in flags(argv)


def test_users_fast_synch_wins_inventory_first(pair):
    inv_path, captures_dir = pair
    captures = load_capture_dir(captures_dir)
    inventory = parse_inventory(inv_path.read_text())
    job = plan_jaccl_job(job_from_inventory(inventory, "jaccl"), inventory,
                         {"MLX_METAL_FAST_SYNCH": "0"}, lambda inv: captures)
    assert job.env["MLX_METAL_FAST_SYNCH"] == "0" and fast_synch_warning(job.env) is None
    inventory = parse_inventory(inventory_text(["mbp", "studio"],
                                               env="env:\n  MLX_METAL_FAST_SYNCH: '0'\n"))
    job = plan_jaccl_job(job_from_inventory(inventory, "jaccl"), inventory,
                         {"MLX_METAL_FAST_SYNCH": "1"}, lambda inv: captures)
    assert job.env["MLX_METAL_FAST_SYNCH"] == "0"
    hostfile = hostfile_from_captures(inventory, captures)
    assert jaccl_env(hostfile, 40000, {}, {}) == {"MLX_JACCL_COORDINATOR": "10.9.0.1:40000"}
    assert jaccl_env(hostfile, 40000, {}, {"MLX_METAL_FAST_SYNCH": "1"}) == {
        "MLX_JACCL_COORDINATOR": "10.9.0.1:40000", "MLX_METAL_FAST_SYNCH": "1"}
    assert fast_synch_warning({"MLX_METAL_FAST_SYNCH": "1"}) == FAST_SYNCH_WARNING
    assert "mlx#3142" in FAST_SYNCH_WARNING


def test_a_hostfile_without_rdma_rows_is_refused_before_launch(tmp_path, macos_fixtures):
    ring = tmp_path / "ring.json"
    ring.write_text(json.dumps({"backend": "ring", "hosts": [
        {"ssh": "a", "ips": ["10.1.0.1"]}, {"ssh": "b", "ips": ["10.1.0.2"]}]}))
    with pytest.raises(HostfileError, match="cannot start jaccl") as err:
        plan_jaccl_job(job_from_hostfile(ring, "jaccl", "/py"), None, {})
    assert "'rdma' has 0 entries, needs 2" in err.value.message and err.value.exit_code == 2
    no_ip = json.loads((macos_fixtures / FOUR_MAC).read_text())
    no_ip[0]["ips"] = []
    (tmp_path / "noip.json").write_text(json.dumps(no_ip))
    with pytest.raises(HostfileError, match="rank 0"):
        plan_jaccl_job(job_from_hostfile(tmp_path / "noip.json", "jaccl", "/py"), None, {})


def test_an_unplanned_jaccl_job_is_never_launched_as_another_backend(tmp_path):
    inventory = parse_inventory(inventory_text(["mbp", "studio"]))
    with pytest.raises(MlxclusterError, match="no rdma rows"):
        write_hostfile(job_from_inventory(inventory, "jaccl"), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_local_ranks_cannot_use_jaccl():
    with pytest.raises(BackendUnavailable, match="not as several ranks on this machine") as err:
        plan_jaccl_job(job_local(2, "jaccl", "/usr/bin/env"), None, {})
    assert err.value.exit_code == 3


def test_rdma_off_and_tb4_hosts_are_named(macos_fixtures, tmp_path):
    inventory = parse_inventory(inventory_text(["local", "peer"]))
    off = load_capture_dir(make_capture_dir(macos_fixtures, tmp_path / "off", OSAURUS))
    with pytest.raises(JacclUnavailable) as err:
        plan_jaccl_job(job_from_inventory(inventory, "jaccl"), inventory, {}, lambda inv: off)
    assert err.value.reasons == {
        "local": "no rdma_* devices (ibv_devices lists none: RDMA is disabled)"}
    tb4 = load_capture_dir(make_capture_dir(macos_fixtures, tmp_path / "tb4", OSAURUS, slow_osaurus))
    with pytest.raises(JacclUnavailable) as err:
        plan_jaccl_job(job_from_inventory(inventory, "jaccl-ring"), inventory, {}, lambda inv: tb4)
    assert err.value.reasons["peer"] == "no Thunderbolt link faster than 40 Gb/s (en6 -> local 40 Gb/s)"
    assert err.value.message.startswith("jaccl-ring cannot run: 2 of 2 host(s)")


@pytest.fixture
def launches(monkeypatch):
    """What the launcher would run: argv and the hostfile's text (nothing starts)."""
    seen = []

    def fake_start_plan(plan: LaunchPlan) -> process.Running:
        plan.write_files()
        seen.append((plan.argv, Path(value_after(plan.argv, "--hostfile")).read_text()))
        return process.start(["true"])  # a launcher that starts no rank and exits 0

    monkeypatch.setattr(process, "start_plan", fake_start_plan)
    monkeypatch.setattr(job_run, "sweep", lambda hosts, run_id, env: [])
    # The hosts are not there: no code is sent to them (tests/test_code_sync.py sends it).
    monkeypatch.setattr("mlxcluster.launch.code.sync_code", lambda job, env, on_event: job)
    return seen


COMMANDS = {"train": ["train", "--no-preflight", "--config", "tiny"],
            "run": ["run", "--no-preflight", "--logs", "LOGS"]}
PROGRAMS = {"train": ["--", "--steps", "1"], "run": ["--", "python", "/abs/script.py"]}


@pytest.mark.parametrize("fast_synch", [None, "1"])
@pytest.mark.parametrize("command", ["train", "run"])
def test_cli_launches_the_pair_plan_and_warns_only_on_fast_synch(pair, tmp_path, monkeypatch,
                                                                 launches, command, fast_synch,
                                                                 hosts_run_by):
    """Fast synch stays MLX's default (unset) unless the user sets it; set, it
    is passed on and the deadlock warning printed. The hosts answer doctor's probe with
    real Macs' outputs (the one fake host)."""
    monkeypatch.chdir(tmp_path)  # train's record (default --out runs/reference) goes here
    inv_path, captures_dir = pair
    captures = load_capture_dir(captures_dir)
    # (the launch's other questions, the runs already there, answered with none)
    hosts_run_by(FakeSsh.probed(parse_inventory(inv_path.read_text()), captures, default=OK))
    monkeypatch.delenv("MLX_METAL_FAST_SYNCH", raising=False)
    args = [a.replace("LOGS", str(tmp_path / "logs")) for a in COMMANDS[command]]
    result = CliRunner().invoke(main, [*args, "-i", str(inv_path), "--backend", "jaccl",
                                       *PROGRAMS[command]],
                                env={"MLX_METAL_FAST_SYNCH": fast_synch} if fast_synch else None)
    assert result.exit_code == 0, result.output
    assert (f"warning: {FAST_SYNCH_WARNING}" in result.output) == (fast_synch == "1")
    [(argv, hostfile)] = launches
    assert hostfile == generated(inv_path, "jaccl", captures_dir)
    assert value_after(argv, "--backend") == "jaccl"
    assert flags(argv).get("MLX_METAL_FAST_SYNCH") == fast_synch
    assert flags(argv)["MLX_JACCL_COORDINATOR"] == "10.9.0.1:32323"


@pytest.mark.parametrize("command", ["train", "run"])
def test_cli_with_a_tb4_host_exits_3_naming_it_before_anything(macos_fixtures, tmp_path,
                                                               monkeypatch, launches, command,
                                                               hosts_run_by):
    """Preflight on: the topology verdict comes before doctor, the probe and the smoke."""
    tb4 = load_capture_dir(make_capture_dir(macos_fixtures, tmp_path / "tb4", OSAURUS, slow_osaurus))
    inv_path = tmp_path / "inv.yaml"
    inv_path.write_text(inventory_text(["local", "peer"]))
    # the hosts answer doctor's probe with real Macs' outputs; any other command (the
    # job's probe, doctor's checks, the smoke) fails the test
    hosts_run_by(FakeSsh.probed(parse_inventory(inv_path.read_text()), tb4))
    args = [a for a in COMMANDS[command] if a != "--no-preflight"]
    args = [a.replace("LOGS", str(tmp_path / "logs")) for a in args]
    result = CliRunner().invoke(main, [*args, "-i", str(inv_path), "--backend", "jaccl",
                                       *PROGRAMS[command]])
    assert result.exit_code == 3, result.output
    assert "jaccl cannot run: 2 of 2 host(s) cannot take part" in result.output
    assert "  peer: no Thunderbolt link faster than 40 Gb/s (en6 -> local 40 Gb/s)" in result.output
    assert "  local: no rdma_* devices" in result.output
    assert "rdma_ctl enable" in result.output and "Traceback" not in result.output
    assert launches == [] and not (tmp_path / "logs").exists()
