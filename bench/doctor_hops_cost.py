"""What judging every host-to-host pair costs doctor, measured on the lab (root + Linux).

``doctor --backend mpi`` on an N-host lab, alternating: as built (every host
hops to every other, ``mlxcluster.doctor.live.collect_host_to_host``) and with
only the first host's hops (what doctor did before every pair was judged).
The lab's hosts share this machine's cores, so the N*(N-1) ssh logins are
paid here at once; on Macs each host makes and takes its own N-1.

    sudo .venv/bin/python bench/doctor_hops_cost.py [--hosts 12] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import mlxcluster.doctor.live as live  # noqa: E402
from mlxcluster.doctor.doctor import run_doctor  # noqa: E402
from mlxcluster.inventory.inventory import load_inventory  # noqa: E402
from mlxcluster.ssh.hops import run_hops  # noqa: E402
from tests.lab import start_lab  # noqa: E402

OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"


def first_only(runner, hosts, links, connect_timeout):
    first = hosts[0]
    if not links[first.name].result().ok:
        return first.name, {}, {}
    return first.name, run_hops(runner, first, hosts[1:], connect_timeout), {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    every_pair = live.collect_host_to_host
    with start_lab(args.hosts) as lab:
        path = lab.state / "bench.yaml"
        lab.write_inventory(path)
        libmpi = Path(sys.executable).parent.parent / "lib" / "libmpi.so.40"
        with path.open("a") as f:
            f.write(f"env:\n  LD_PRELOAD: {OPENBLAS}\n  MLX_MPI_LIBNAME: {libmpi}\n")
        os.environ["PATH"] = lab.env()["PATH"]
        for _ in range(args.rounds):
            for name, collect in (("every pair", every_pair), ("first host only", first_only)):
                live.collect_host_to_host = collect
                started = time.monotonic()
                report = run_doctor(load_inventory(path), backend="mpi", connect_timeout=5.0)
                print(f"{name:16s} {time.monotonic() - started:6.2f} s  {report.verdict}", flush=True)
        print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
