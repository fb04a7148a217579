"""How doctor's wall time grows with the number of hosts (lab, root + Linux).

For 1, 4, 8 and 16 lab hosts it times, in one run:
  doctor      the full live doctor (probe, SSH both ways, host-to-host with
              --backend mpi, data path)
  reach       just the SSH reachability part through our paramiko runner
              (connect + `true` on every host in parallel)
  ssh-procs   the same reachability check done the way mlx.distributed_config
              does it: one `ssh -o BatchMode=yes -o ConnectTimeout=5 host echo
              success` subprocess per host, one thread each
and prints each time and its ratio to the 1-host time. Goal: 16 hosts within
1.5x of 1 host. Every lab "host" shares this machine's CPUs, so CPU-bound
steps (the probe, sshd and ssh key exchanges) cannot scale here as on real
Macs. So it also prints the CPU one doctor run costs (doctor itself, the
OpenSSH clients it starts, the lab hosts' sessions) and the "CPU floor": that
CPU divided by this machine's CPU count, the least wall time any schedule
needs here. doctor / floor near 1 means doctor waits on nothing but the CPUs.

    sudo python bench/doctor_scale.py [--sizes 1,4,8,16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlxcluster.doctor.doctor import run_doctor  # noqa: E402
from mlxcluster.inventory.inventory import load_inventory  # noqa: E402
from mlxcluster.ssh.remote import ParamikoRunner, run_parallel  # noqa: E402
from tests.lab import start_lab  # noqa: E402


def lab_cpu_seconds(lab) -> float:
    """CPU used so far by the lab hosts' finished sessions: each sshd master's
    cutime + cstime (sessions and their commands are reaped up to it)."""
    total = 0
    for h in lab.hosts:
        fields = Path(f"/proc/{h.sshd.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[13]) + int(fields[14])  # cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


CPU: dict[str, list[float]] = {}


def children_cpu_seconds() -> float:
    """CPU of this process's reaped children: the OpenSSH clients doctor runs
    (the lab's sshd masters stay alive, so they are not in it)."""
    t = os.times()
    return t.children_user + t.children_system


def time_doctor(inventory, lab) -> float:
    started, own, hosts_cpu = time.monotonic(), time.process_time(), lab_cpu_seconds(lab)
    clients = children_cpu_seconds()
    # mpi: the only backend for which doctor also makes the host-to-host hops.
    report = run_doctor(inventory, backend="mpi", connect_timeout=5.0)
    elapsed = time.monotonic() - started
    CPU.setdefault("own", []).append(time.process_time() - own)
    CPU.setdefault("clients", []).append(children_cpu_seconds() - clients)
    time.sleep(0.5)  # let the last sessions be reaped
    CPU.setdefault("hosts", []).append(lab_cpu_seconds(lab) - hosts_cpu)
    if report.failed():
        raise SystemExit(f"doctor failed on a healthy lab: {[r.id for r in report.failed()]}")
    return elapsed


def time_reach(inventory) -> float:
    started = time.monotonic()
    with ParamikoRunner(inventory.ssh_config, connect_timeout=5.0) as runner:
        out = run_parallel([h.name for h in inventory.hosts],
                           lambda n: runner.run(inventory.host(n).ssh, "true", timeout=30))
    assert all(o.ok for o in out.values()), {n: o.error for n, o in out.items() if not o.ok}
    return time.monotonic() - started


def time_ssh_procs(inventory) -> float:
    """mlx.distributed_config's check_ssh_connections: a thread + ssh process per host."""
    ok = {}

    def check(host):
        proc = subprocess.run(["ssh", "-F", inventory.ssh_config, "-o", "BatchMode=yes", "-o",
                               "ConnectTimeout=5", host.ssh, "echo", "success"],
                              capture_output=True, timeout=60)
        ok[host.name] = proc.returncode == 0

    started = time.monotonic()
    threads = [threading.Thread(target=check, args=(h,)) for h in inventory.hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(ok.values()), ok
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,8,16")
    parser.add_argument("--repeat", type=int, default=3, help="median of this many runs")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        with start_lab(n) as lab, tempfile.TemporaryDirectory() as tmp:
            path = lab.write_inventory(Path(tmp) / "lab.yaml")
            with path.open("a") as f:  # a healthy Linux lab: optimised BLAS (see docs/doctor-checks.md, reference-blas)
                f.write("env:\n  LD_PRELOAD: /usr/lib/x86_64-linux-gnu/libopenblas.so.0\n")
            inventory = load_inventory(path)
            times = {"doctor": statistics.median(time_doctor(inventory, lab) for _ in range(args.repeat))}
            times.update({name: statistics.median(fn(inventory) for _ in range(args.repeat))
                          for name, fn in (("reach", time_reach), ("ssh-procs", time_ssh_procs))})
        times["own_cpu"] = statistics.median(CPU.pop("own"))
        times["ssh_cpu"] = statistics.median(CPU.pop("clients"))
        times["hosts_cpu"] = statistics.median(CPU.pop("hosts"))
        # The least wall time this machine needs for the CPU work of one doctor run.
        times["floor"] = (times["own_cpu"] + times["ssh_cpu"] + times["hosts_cpu"]) / os.cpu_count()
        rows.append((n, times))
        print(f"{n:>3} hosts: " + "  ".join(f"{k} {v:.2f} s" for k, v in times.items()), flush=True)
    base = rows[0][1]
    print(f"\nmachine: {os.cpu_count()} CPUs shared by every lab host; medians of {args.repeat} runs")
    print("hosts  doctor s (x1)      reach s (x1)      ssh-procs s (x1)   "
          "CPU s: doctor  ssh clients  lab hosts   CPU floor s  doctor / floor")
    for n, t in rows:
        print(f"{n:>5}  {t['doctor']:6.2f} ({t['doctor'] / base['doctor']:5.2f}x)  "
              f"{t['reach']:6.2f} ({t['reach'] / base['reach']:5.2f}x)  "
              f"{t['ssh-procs']:6.2f} ({t['ssh-procs'] / base['ssh-procs']:5.2f}x)  "
              f"{t['own_cpu']:13.2f}  {t['ssh_cpu']:11.2f}  {t['hosts_cpu']:9.2f}   {t['floor']:11.2f}  "
              f"{t['doctor'] / t['floor']:13.2f}")

if __name__ == "__main__":
    main()
