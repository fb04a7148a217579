"""`mlxcluster tune` on the 3-host lab: real ring and MPI candidates through
mlx.launch / mpirun between network namespaces, the raw TCP stream beside
them, the decision, and the hostfile written with the winner. Kept short:
few candidates, one small size, a small budget."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

pytestmark = pytest.mark.lab


def test_tune_measures_real_candidates_and_writes_the_winner(lab3, tmp_path):
    inventory = lab3.write_inventory(tmp_path / "lab.yaml")
    out = tmp_path / "tuned.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mlxcluster", "tune", "-i", str(inventory), "--backend", "ring,mpi",
         "--connections", "1,2", "--tcp-links", "4", "--sizes", "256K", "--iters", "3",
         "--rounds", "2", "--budget", "30s", "-o", str(out), "--json"],
        env=lab3.env(), capture_output=True, text=True, timeout=600)
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
        assert out.read_text().splitlines()[0] == f"{lab3.hosts[0].ip} slots=1"
        assert args[args.index("btl_tcp_links") + 1] == "4"
    # Nothing of any run (smoke workers, MPI daemons, TCP stream ends) is left
    # inside the lab's hosts: only their sshd listeners run there.
    for host in lab3.hosts:
        pids = lab3.netns_exec(host, ["ip", "netns", "pids", host.netns]).stdout.split()
        names = {psutil.Process(int(pid)).name() for pid in pids if psutil.pid_exists(int(pid))}
        assert names <= {"sshd", "unshare", "sh"}, (host.name, names)
