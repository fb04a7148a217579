"""`mlxcluster tune` on a slow lab link, twice (the repeat-run check), then
what limits MPI's all_sum there: CPU per rank, syscalls of one rank, and
Open MPI's allreduce algorithms (docs/performance-runs.md, "tune on a slow link").

    python bench/tune_slow_link.py --budget 15m --out /tmp/tune-bench.json   # root: a 3-host lab

Steps, on one 3-host lab (tests/lab) with every host's egress throttled to
``--rate`` (tc tbf):

1. ``mlxcluster tune --sizes 16M:32M --iters 3 --json`` twice (runs A and B),
   sampling the CPU of every process inside the lab's namespaces meanwhile;
2. the MPI all_sum at 32 MiB through smoke's launcher with Open MPI's
   default allreduce and with ``coll_tuned_allreduce_algorithm N`` for a few
   N, alternating over ``--mpi-rounds`` rounds;
3. one more default MPI all_sum with ``strace -c -f`` attached to rank 1's
   worker (syscall counts and time);
4. the bytes each host sends per 32 MiB all_sum (its eth0 counter), ring
   against MPI's default and two of its algorithms.

Prints a JSON document with everything (load average before and after each
step: this machine is shared) and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from mlxcluster.facts.mpi import allreduce_args  # noqa: E402
from mlxcluster.inventory.inventory import load_inventory  # noqa: E402
from mlxcluster.jobs.hosts import hosts_from_inventory  # noqa: E402
from mlxcluster.smoke.launch import WorkerOptions  # noqa: E402
from mlxcluster.smoke.run import run_backend  # noqa: E402

# Open MPI's coll/tuned allreduce algorithms (ompi_info --param coll tuned --level 9).
ALLREDUCE_ALGORITHMS = {0: "default (decision rules)", 2: "nonoverlapping", 3: "recursive doubling",
                        4: "ring", 6: "rabenseifner"}
MiB = 1 << 20


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def netns_inodes(lab) -> set[int]:
    return {os.stat(f"/run/netns/{h.netns}").st_ino for h in lab.hosts}


def pids_in(inodes: set[int]) -> list[int]:
    out = []
    for p in psutil.pids():
        try:
            if os.stat(f"/proc/{p}/ns/net").st_ino in inodes:
                out.append(p)
        except OSError:
            continue
    return out


class CpuSampler(threading.Thread):
    """CPU share of each worker process inside the lab (user + system over its life)."""

    def __init__(self, inodes: set[int], marker: str = "worker.py"):
        super().__init__(daemon=True)
        self.inodes, self.marker = inodes, marker
        self.last: dict[int, float] = {}  # pid -> latest (cpu s / wall s)
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.wait(0.5):
            for pid in pids_in(self.inodes):
                try:
                    p = psutil.Process(pid)
                    if self.marker not in " ".join(p.cmdline()):
                        continue
                    t = p.cpu_times()
                    age = time.time() - p.create_time()
                    if age > 2:
                        self.last[pid] = (t.user + t.system) / age
                except psutil.Error:
                    continue

    def summary(self) -> dict:
        shares = sorted(self.last.values())
        if not shares:
            return {"processes": 0}
        return {"processes": len(shares), "min": round(shares[0], 3),
                "median": round(shares[len(shares) // 2], 3), "max": round(shares[-1], 3)}


def tune_run(lab, inventory: Path, args) -> dict:
    sampler = CpuSampler(netns_inodes(lab))
    sampler.start()
    before = load()
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "mlxcluster", "tune", "-i", str(inventory), "--sizes", "16M:32M",
         "--iters", "3", "--rounds", str(args.rounds), "--budget", args.budget, "--phase-timeout", args.timeout,
         "-o", "-", "--json"],
        env=lab.env(), capture_output=True, text=True, timeout=4 * 3600, cwd=REPO)
    sampler.stop_flag.set()
    doc = json.loads(proc.stdout) if proc.stdout.strip() else {"stderr": proc.stderr[-3000:]}
    return {"rc": proc.returncode, "load_before": before, "load_after": load(),
            "wall_s": round(time.time() - started, 1), "cpu_per_rank": sampler.summary(), "tune": doc}


def mpi_allreduce(hosts, algorithm: int, timeout_s: float) -> dict:
    opts = WorkerOptions(dtypes=("float32",), lo_bytes=32 * MiB, hi_bytes=32 * MiB, bench=True,
                         check=False, warmup=1, iters=3, ops=("all_sum",))
    extra = () if algorithm == 0 else allreduce_args(algorithm)
    report = run_backend("mpi", hosts, opts, timeout_s, mpi_args=extra)
    row = next((b for b in report.bench if b.op == "all_sum"), None)
    return {"algorithm": algorithm, "status": report.status, "reason": report.reason[:200],
            "busbw_gbps": row.busbw_gbps if row else None, "p50_s": row.p50_s if row else None}


def strace_rank(lab, hosts, timeout_s: float) -> dict:
    """Default MPI all_sum with ``strace -c -f`` attached to one rank's worker."""
    inodes = {os.stat(f"/run/netns/{lab.hosts[1].netns}").st_ino}
    result: dict = {}

    def attach() -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            for pid in pids_in(inodes):
                try:
                    cmd = " ".join(psutil.Process(pid).cmdline())
                except psutil.Error:
                    continue
                if "worker.py" in cmd and "python" in cmd:
                    out = subprocess.run(["strace", "-c", "-f", "-p", str(pid)], capture_output=True,
                                         text=True, timeout=600)
                    result["pid"] = pid
                    result["summary"] = out.stderr[-6000:]
                    return
            time.sleep(0.2)

    t = threading.Thread(target=attach, daemon=True)
    t.start()
    result["run"] = mpi_allreduce(hosts, 0, timeout_s)
    t.join(timeout=60)
    return result


def tx_bytes(lab) -> list[int]:
    return [int(lab.netns_exec(h, ["cat", "/sys/class/net/eth0/statistics/tx_bytes"]).stdout)
            for h in lab.hosts]


def bytes_per_all_sum(lab, hosts, backend: str, algorithm: int = 0) -> dict:
    """Bytes each host sends (eth0 tx counter) per 32 MiB all_sum: one run of
    warm-up + 3 timed all_sums, less a run with none (start-up, barriers)."""
    sent = []
    for iters in (0, 3):
        opts = WorkerOptions(dtypes=("float32",), lo_bytes=32 * MiB, hi_bytes=32 * MiB, bench=iters > 0,
                             check=False, warmup=1, iters=max(iters, 1), ops=("all_sum",))
        extra = () if algorithm == 0 else allreduce_args(algorithm)
        before = tx_bytes(lab)
        report = run_backend(backend, hosts, opts, 300, mpi_args=extra if backend == "mpi" else ())
        sent.append([a - b for a, b in zip(tx_bytes(lab), before, strict=True)])
        if not report.passed:
            return {"backend": backend, "algorithm": algorithm, "status": report.reason[:200]}
    per_op = [(full - base) / 4 for base, full in zip(*sent, strict=True)]  # warm-up + 3 timed
    return {"backend": backend, "algorithm": algorithm, "mb_per_host_per_all_sum": [round(b / 1e6, 1) for b in per_op],
            "payload_mb": 32 * MiB / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--budget", default="15m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--phase-timeout", dest="timeout", default="2m")
    parser.add_argument("--mpi-rounds", type=int, default=2)
    parser.add_argument("--skip-tune", action="store_true", help="leave out step 1")
    parser.add_argument("--skip-algorithms", action="store_true", help="leave out step 2")
    parser.add_argument("--skip-strace", action="store_true", help="leave out step 3")
    parser.add_argument("--out", default="/tmp/tune-slow-link.json")
    args = parser.parse_args()

    from tests.lab import start_lab

    doc: dict = {"rate": args.rate, "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}

    def save() -> None:
        Path(args.out).write_text(json.dumps(doc, indent=2))

    with start_lab(3) as lab:
        for h in lab.hosts:
            lab.slow_link(h, args.rate)
        inventory = lab.write_inventory(lab.state / "lab.yaml")
        os.environ.update({k: v for k, v in lab.env().items() if k in ("PATH", "TMPDIR")})
        hosts = hosts_from_inventory(load_inventory(inventory))
        if not args.skip_tune:
            for name in ("A", "B"):
                print(f"tune run {name} ...", file=sys.stderr, flush=True)
                doc[f"run_{name}"] = tune_run(lab, inventory, args)
                save()
        doc["mpi_algorithms"] = {"load_before": load(), "rounds": []}
        order = list(ALLREDUCE_ALGORITHMS)
        for r in range(0 if args.skip_algorithms else args.mpi_rounds):
            for alg in (order if r % 2 == 0 else order[::-1]):
                print(f"mpi allreduce algorithm {alg} (round {r + 1}) ...", file=sys.stderr, flush=True)
                sampler = CpuSampler(netns_inodes(lab))
                sampler.start()
                row = mpi_allreduce(hosts, alg, 300)
                sampler.stop_flag.set()
                row["round"], row["cpu_per_rank"] = r + 1, sampler.summary()
                doc["mpi_algorithms"]["rounds"].append(row)
                save()
        doc["mpi_algorithms"]["load_after"] = load()
        if not args.skip_strace:
            print("strace on one MPI rank ...", file=sys.stderr, flush=True)
            doc["strace"] = strace_rank(lab, hosts, 300)
        print("bytes sent per all_sum ...", file=sys.stderr, flush=True)
        doc["bytes_per_all_sum"] = [bytes_per_all_sum(lab, hosts, "ring"), bytes_per_all_sum(lab, hosts, "mpi")]
        doc["bytes_per_all_sum"] += [bytes_per_all_sum(lab, hosts, "mpi", alg) for alg in (4, 6)]
        save()
        doc["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        save()
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
