"""`mlxcluster tune` on the 3-host lab: real ring and MPI candidates through
mlx.launch / mpirun between network namespaces, the raw TCP stream beside
them, the decision, and the hostfile written with the winner. Kept short:
few candidates, one small size, a small budget."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests import waits
from tests.tune_support import forced_ring, mca

pytestmark = pytest.mark.lab


def test_tune_measures_real_candidates_and_writes_the_winner(lab3, tmp_path):
    inventory = lab3.write_inventory(tmp_path / "lab.yaml")
    out = tmp_path / "tuned.json"
    proc = waits.run(
        [sys.executable, "-m", "mlxcluster", "tune", "-i", str(inventory), "--backend", "ring,mpi",
         "--connections", "1,2", "--tcp-links", "4", "--mpi-allreduce", "default", "--sizes", "256K", "--iters", "3",
         "--rounds", "2", "--budget", "30s", "-o", str(out), "--json"],
        env=lab3.env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert [c["label"] for c in doc["candidates"]] == ["ring x1/ip", "ring x2/ip", "mpi links=4"]
    assert doc["failed"] == {} and doc["rounds"] >= 1
    # Every candidate measured at both ops, each beside the raw TCP stream of as many streams.
    assert {(c["op"], c["bytes"]) for c in doc["choices"]} == {("all_sum", 256 << 10),
                                                               ("all_gather", 256 << 10)}
    decision = doc["decision"]
    assert decision["op"] == "all_sum" and len(decision["rows"]) == 3
    assert all(r["busbw_gbps"] > 0 and r["tcp_gbps"] > 0 and r["p90_s"] >= r["p50_s"]
               for r in decision["rows"])
    assert set(doc["tcp_gbps"]) == {"1", "2", "4"} and doc["tcp_errors"] == {}
    assert decision["winner"] in decision["tied"] and doc["winner"]["label"] == decision["winner"]
    # The winner's hostfile and launcher arguments, as the docs say to use them.
    assert doc["files"] == [str(out), f"{out}.args"]
    args = (tmp_path / "tuned.json.args").read_text().split()
    if doc["winner"]["backend"] == "ring":
        assert json.loads(out.read_text())["hosts"][0]["ips"] == [lab3.hosts[0].ip]
        assert args == ["--connections-per-ip", str(doc["winner"]["connections_per_ip"])]
    else:
        assert out.read_text().splitlines()[0] == f"root@{lab3.hosts[0].ip} slots=1"  # its user:
        assert args[args.index("btl_tcp_links") + 1] == "4"
    # Nothing of any run (smoke workers, MPI daemons, TCP stream ends) is left
    # inside the lab's hosts: only their sshd listeners run there.
    for host in lab3.hosts:
        pids = lab3.netns_exec(host, ["ip", "netns", "pids", host.netns]).stdout.split()
        names = {psutil.Process(int(pid)).name() for pid in pids if psutil.pid_exists(int(pid))}
        assert names <= {"sshd", "unshare", "sh"}, (host.name, names)


RANK_SCRIPT = """
import json, os, sys
import mlx.core as mx
backend = sys.argv[1]
group = mx.distributed.init(strict=True, backend=backend)
total = mx.distributed.all_sum(mx.ones(4))
mx.eval(total)
if backend == "ring":  # mlx.launch's per-rank address list: one port per connection
    seen = len(json.load(open(os.environ["MLX_HOSTFILE"]))[group.rank()])
else:  # mpirun hands every --mca to its processes as OMPI_MCA_*
    seen = os.environ.get("OMPI_MCA_btl_tcp_links")
print(f"RANK {group.rank()} size={group.size()} sum={int(total[0].item())} setting={seen}")
"""


def tune_then_run(lab, tmp_path, backend: str, knob: list[str], out_name: str):
    inventory = lab.write_inventory(tmp_path / "lab.yaml")
    out = tmp_path / out_name
    tuned = waits.run(
        [sys.executable, "-m", "mlxcluster", "tune", "-i", str(inventory), "--backend", backend, *knob,
         "--sizes", "256K", "--iters", "2", "--rounds", "1", "--budget", "10s", "-o", str(out)],
        env=lab.env())
    assert tuned.returncode == 0, tuned.stdout[-2000:] + tuned.stderr[-2000:]
    assert f"wrote {out} and {out}.args" in tuned.stdout
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    ran = waits.run(
        [sys.executable, "-m", "mlxcluster", "run", "--hostfile", str(out), "--no-preflight",
         "--logs", str(tmp_path / "logs"), "--", "python", str(script), backend],
        env=lab.env(), cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    settings = sorted(line.split("RANK ", 1)[1] for line in ran.stdout.splitlines() if "RANK " in line)
    return out, ran, settings


def test_run_launches_with_the_ring_setting_tune_wrote(lab3, tmp_path):
    out, ran, ranks = tune_then_run(lab3, tmp_path, "ring", ["--connections", "2"], "tuned.json")
    assert (tmp_path / "tuned.json.args").read_text().split() == ["--connections-per-ip", "2"]
    assert f"tuned: --connections-per-ip 2 (from {out}.args" in ran.stderr
    # Every rank got two ports on its IP from the real mlx.launch, and the ring ran over them.
    assert ranks == [f"{r} size=3 sum=3 setting=2" for r in range(3)]
    # smoke given the same hostfile runs its ring with the setting too (and says so).
    smoke = waits.run(
        [sys.executable, "-m", "mlxcluster", "smoke", "--hostfile", str(out), "--sizes", "1K:1K",
         "--dtypes", "float32", "--json"], env=lab3.env(),
        cwd=tmp_path)
    assert smoke.returncode == 0, smoke.stdout[-2000:] + smoke.stderr[-2000:]
    assert f"tuned: --connections-per-ip 2 (from {out}.args" in smoke.stderr
    command = json.loads(smoke.stdout)["backends"][0]["command"]
    assert command[command.index("--connections-per-ip") + 1] == "2"


def test_run_launches_with_the_mpi_setting_tune_wrote(lab3, tmp_path):
    out, ran, ranks = tune_then_run(lab3, tmp_path, "mpi", ["--tcp-links", "2", "--mpi-allreduce", "default"],
                                    "tuned-mpi.txt")
    assert out.read_text().splitlines() == [f"root@{h.ip} slots=1" for h in lab3.hosts]
    assert f"tuned: --mca btl_tcp_links 2 (from {out}.args" in ran.stderr
    # The value each rank's process got from the real mpirun.
    assert ranks == [f"{r} size=3 sum=3 setting=2" for r in range(3)]


def test_tune_picks_the_fast_one_of_two_data_interfaces(make_lab, tmp_path):
    """Every host has two data IPs, the first on a throttled link (eth1,
    20 Mbit/s egress): tune tries each alone and both, and picks the fast one."""
    lab = make_lab(3)
    lab.add_second_link()
    for h in lab.hosts:
        lab.slow_link(h, "20mbit", dev="eth1")
    inventory = lab.write_inventory(tmp_path / "lab.yaml",
                                    data_ips={h.name: [h.second_ip, h.ip] for h in lab.hosts})
    out = tmp_path / "tuned.json"
    proc = waits.run(
        [sys.executable, "-m", "mlxcluster", "tune", "-i", str(inventory), "--backend", "ring",
         "--connections", "1", "--sizes", "1M", "--iters", "2", "--rounds", "2", "--budget", "40s",
         "-o", str(out)],
        env=lab.env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    for label in ("ring x1/ip ", "ring x1/ip ip#1", "ring x1/ip ip#2"):
        assert label in text
    decision = next(line for line in text.splitlines() if line.startswith("decision"))
    assert "winner: ring x1/ip ip#2" in decision, text
    assert json.loads(out.read_text())["hosts"] == [{"ssh": f"root@{h.ip}", "ips": [h.ip], "rdma": []}
                                                    for h in lab.hosts]


ALLREDUCE_SCRIPT = """
import os, socket
import mlx.core as mx
group = mx.distributed.init(strict=True, backend="mpi")
x = mx.ones(8 << 20)  # 32 MiB of float32, what nn.average_gradients sends per all_sum
for _ in range(4):
    total = mx.distributed.all_sum(x)
    mx.eval(total)
env = os.environ  # mpirun hands every --mca to its processes as OMPI_MCA_*
print(f"RANK {group.rank()} host={socket.gethostname()} sum={int(total[0].item())} "
      f"dynamic={env.get('OMPI_MCA_coll_tuned_use_dynamic_rules')} "
      f"algorithm={env.get('OMPI_MCA_coll_tuned_allreduce_algorithm')}")
"""


def run_seeing_mpirun(argv: list[str], env: dict[str, str], timeout: float):
    """Run ``argv``, and the command line of every mpirun it starts, read
    from the process table while it runs (each lives for seconds)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[int, list[str]] = {}
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            for child in parent.children(recursive=True):
                try:
                    cmd = child.cmdline()
                except psutil.Error:
                    continue
                if cmd and Path(cmd[0]).name in ("mpirun", "mpiexec", "prterun"):
                    seen.setdefault(child.pid, cmd)
        except psutil.Error:
            pass
        time.sleep(0.05)
    out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), list(seen.values())


def tx_bytes(lab) -> dict[str, int]:
    """Bytes each host has sent on its data link (eth0 counter inside its namespace)."""
    return {h.name: int(lab.netns_exec(h, ["cat", "/sys/class/net/eth0/statistics/tx_bytes"]).stdout)
            for h in lab.hosts}


def run_counting_bytes(lab, tmp_path, hostfile, script, extra: list[str]):
    """``mlxcluster run --hostfile`` of the 4 x 32 MiB all_sums: its result, the
    ranks' lines by rank, and the MB each host sent meanwhile."""
    before = tx_bytes(lab)
    ran = waits.run(
        [sys.executable, "-m", "mlxcluster", "run", "--hostfile", str(hostfile), "--no-preflight",
         "--logs", str(tmp_path / "logs"), *extra, "--", "python", str(script)],
        env=lab.env(), cwd=tmp_path)
    after = tx_bytes(lab)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    ranks = dict(line.split("RANK ", 1)[1].split(" ", 1) for line in ran.stdout.splitlines() if "RANK " in line)
    sent = {name: (after[name] - before[name]) / 1e6 for name in before}
    return ran, ranks, sent


def test_tune_runs_the_ring_allreduce_and_run_uses_it_as_open_mpi_did(lab3, tmp_path):
    """tune restricted to Open MPI's ring allreduce launches the real mpirun
    with its two --mca pairs and writes them; run picks them up from .args,
    and the traffic on the wire is the ring's: every host sends the same,
    where Open MPI's default rules make rank 0 send about 2.5x the others."""
    inventory = lab3.write_inventory(tmp_path / "lab.yaml")
    out = tmp_path / "tuned-mpi.txt"
    tuned, mpiruns = run_seeing_mpirun(
        [sys.executable, "-m", "mlxcluster", "tune", "-i", str(inventory), "--backend", "mpi",
         "--tcp-links", "1", "--mpi-allreduce", "ring", "--sizes", "256K", "--iters", "2",
         "--rounds", "1", "--budget", "10s", "-o", str(out), "--json"], lab3.env(), 600)
    assert tuned.returncode == 0, tuned.stdout[-2000:] + tuned.stderr[-2000:]
    doc = json.loads(tuned.stdout)
    assert [c["label"] for c in doc["candidates"]] == ["mpi links=1 allreduce=ring"]
    assert doc["failed"] == {} and doc["decision"]["rows"][0]["busbw_gbps"] > 0
    assert (doc["winner"]["mpi_allreduce"], doc["winner"]["btl_tcp_links"]) == ("ring", 1)
    # The mpirun the measurement ran: the pairs once each (mpirun refuses a parameter twice).
    assert mpiruns, "no mpirun seen while tune ran"
    for argv in mpiruns:
        assert forced_ring(argv) and mca(argv, "btl_tcp_links") == ["1"], argv
    assert forced_ring(Path(f"{out}.args").read_text().split())

    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE_SCRIPT)
    ran, ranks, ring_sent = run_counting_bytes(lab3, tmp_path, out, script, [])
    assert ("tuned: --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4 "
            f"(from {out}.args") in ran.stderr
    assert sorted(ranks) == ["0", "1", "2"]
    assert all(line.endswith("sum=3 dynamic=1 algorithm=4") for line in ranks.values()), ranks
    # The command line wins: Open MPI's own choice again (algorithm 0, the dynamic rules off).
    _, default_ranks, default_sent = run_counting_bytes(
        lab3, tmp_path, out, script, ["--mpi-arg", "--mca coll_tuned_allreduce_algorithm 0"])
    assert all(line.endswith("sum=3 dynamic=None algorithm=0") for line in default_ranks.values()), default_ranks
    # 4 all_sums of 33.6 MB: the ring sends 2(n-1)/n of it from every host
    # (4 x 44.7 MB); the default rules ~88 MB per all_sum from rank 0, ~35 from
    # the others (docs/performance-runs.md). Rank 0 is the hostfile's first host.
    rank0 = ranks["0"].split()[0].split("=")[1]
    assert rank0 == lab3.hosts[0].name
    others = [mb for name, mb in default_sent.items() if name != rank0]
    assert default_sent[rank0] > 1.8 * max(others), default_sent
    assert max(ring_sent.values()) < 1.25 * min(ring_sent.values()), ring_sent
    assert all(150 < mb < 230 for mb in ring_sent.values()), ring_sent


def test_tune_measures_the_default_rules_and_the_ring_side_by_side(lab3, tmp_path):
    """Both allreduce candidates in one tune: each mpirun it starts forces the
    ring or leaves Open MPI's rules alone, and both are measured."""
    inventory = lab3.write_inventory(tmp_path / "lab.yaml")
    tuned, mpiruns = run_seeing_mpirun(
        [sys.executable, "-m", "mlxcluster", "tune", "-i", str(inventory), "--backend", "mpi",
         "--tcp-links", "1", "--sizes", "256K", "--iters", "2", "--rounds", "1", "--budget", "10s",
         "-o", "-", "--json"], lab3.env(), 600)
    assert tuned.returncode == 0, tuned.stdout[-2000:] + tuned.stderr[-2000:]
    doc = json.loads(tuned.stdout)
    assert [(c["label"], c["mpi_allreduce"]) for c in doc["candidates"]] == [
        ("mpi links=1", "default"), ("mpi links=1 allreduce=ring", "ring")]
    assert doc["failed"] == {} and doc["files"] == []
    assert sorted(r["candidate"] for r in doc["decision"]["rows"]) == ["mpi links=1", "mpi links=1 allreduce=ring"]
    # One run of each candidate (one round), told apart by its run's hostfile
    # (mpirun's forks, caught before they exec ssh, show the same command line).
    runs: dict[str, set[bool]] = {}
    for argv in mpiruns:
        runs.setdefault(argv[argv.index("--hostfile") + 1], set()).add(forced_ring(argv))
    assert sorted(map(sorted, runs.values())) == [[False], [True]], mpiruns
    assert all(mca(argv, "coll_tuned_allreduce_algorithm") == [] for argv in mpiruns if not forced_ring(argv))


def test_open_mpi_takes_the_ring_allreduce_pairs_in_a_smoke_run(lab3, tmp_path):
    inventory = lab3.write_inventory(tmp_path / "lab.yaml")
    smoke = waits.run(
        [sys.executable, "-m", "mlxcluster", "smoke", "-i", str(inventory), "--backend", "mpi",
         "--mpi-arg", "--mca coll_tuned_use_dynamic_rules 1", "--mpi-arg",
         "--mca coll_tuned_allreduce_algorithm 4", "--sizes", "1K:1M", "--dtypes", "float32", "--json"],
        env=lab3.env(), cwd=tmp_path)
    assert smoke.returncode == 0, smoke.stdout[-2000:] + smoke.stderr[-2000:]
    report = json.loads(smoke.stdout)["backends"][0]
    assert report["status"] == "passed"
    assert forced_ring(report["command"]), report["command"]
