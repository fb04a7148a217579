"""Does Open MPI 5 need SSH between the hosts? Measured on the lab (root + Linux).

For each lab size it takes host-to-host SSH trust away (``Lab.deny_host_to_host``:
every lab host's ssh offers a key no host accepts; this machine keeps its
access, as when only this machine's key was copied to the Macs) and runs the
mpirun command ``mlxcluster hostfile generate --backend mpi`` prints, with
tests/lab/allsum.py as the program, in these variants:

  generated        the command as generated (--mca plm_ssh_no_tree_spawn 1)
  tree-spawn       the same with plm_ssh_no_tree_spawn 0 (Open MPI's default;
                   what the generator gave before, and what mlx.launch
                   --backend mpi or a hand-written mpirun run)
  radix2 ...       both again with --prtemca routed_radix 2: PRRTE's launch
                   tree has fan-out 64 by default, so a lab (at most 60 hosts)
                   never reaches the size where daemons ssh onward; radix 2
                   makes every daemon with children do so
  ... trusted      radix 2 + tree spawn with trust left in place (the
                   control: tree spawn itself works)

and prints per run: pass (exit 0 and all_sum == N on every rank) or fail, the
wall time, the ssh calls the hosts made to each other (from the lab's log) and
the calls PRRTE's radix tree predicts (without trust only the first
level is tried: a daemon that never started calls nobody). Each run is bounded (90 s).

    sudo .venv/bin/python bench/host_to_host_mpi.py [--sizes 2,3,4,8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlxcluster.facts.mpi import ROUTED_RADIX  # noqa: E402
from mlxcluster.hostfile.hostfile_generate import generate_mpi  # noqa: E402
from mlxcluster.inventory.inventory import load_inventory  # noqa: E402
from tests.lab import start_lab  # noqa: E402

VENV = Path(sys.executable).parent.parent
PROGRAM = REPO / "tests" / "lab" / "allsum.py"
RUN_TIMEOUT_S = 90


def radix_children(vpid: int, n_procs: int, radix: int) -> list[int]:
    """PRRTE's routed/radix tree: the daemons ``vpid`` starts when tree
    spawn is on (vpid 0 is mpirun itself, 1..N the hosts in hostfile order)."""
    total, in_level = 1, 1
    while total < vpid + 1:
        in_level *= radix
        total += in_level
    return [c for c in range(vpid + in_level, vpid + in_level * (radix + 1), in_level) if c < n_procs]


def predicted_onward(ips: list[str], radix: int) -> list[str]:
    """'FROM_IP->TO_IP' for each ssh a host's daemon makes with tree spawn on."""
    n = len(ips) + 1
    return sorted(f"{ips[v - 1]}->{ips[c - 1]}" for v in range(1, n) for c in radix_children(v, n, radix))


def run_variant(lab, files, hostfile: Path, extra: list[str]) -> tuple[bool, float, list[str], str]:
    cmd = files.command(str(hostfile), [lab.python, str(PROGRAM), "mpi"], str(VENV / "bin" / "mpirun"))
    cmd[1:1] = ["--allow-run-as-root", *extra]
    before = len(lab.host_to_host_attempts())
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=lab.env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = "timeout", str(exc.stdout or ""), str(exc.stderr or "")
    seconds = time.monotonic() - started
    n = len(lab.hosts)
    rows = [ln.split()[1:] for ln in out.splitlines() if ln.startswith("RESULT ")]
    ok = rc == 0 and len(rows) == n and all(r[1] == str(n) and r[2] == str(n) for r in rows)
    by_name = {h.name: h.ip for h in lab.hosts}
    onward = sorted(f"{by_name[src]}->{next(a for a in args if a in by_name.values())}"
                    for src, args in lab.host_to_host_attempts()[before:])
    detail = f"rc {rc}" + (f", stderr: {err.strip().splitlines()[-1][:100]}" if err.strip() else ", stderr empty")
    return ok, seconds, onward, detail


def measure(n: int) -> None:
    with start_lab(n) as lab:
        inv = lab.write_inventory(lab.state / "inventory.yaml")
        libmpi = str(VENV / "lib" / "libmpi.so.40")
        generated = generate_mpi(load_inventory(inv), libmpi=libmpi)
        tree = generate_mpi(load_inventory(inv), libmpi=libmpi,
                            extra_args=("--mca", "plm_ssh_no_tree_spawn", "0"))
        hostfile = lab.state / "mpi_hosts"
        hostfile.write_text(generated.hostfile)
        ips = [h.ip for h in lab.hosts]
        variants = [("radix2 tree-spawn trusted", tree, ["--prtemca", "routed_radix", "2"], 2, True),
                    ("generated", generated, [], ROUTED_RADIX, False),
                    ("tree-spawn", tree, [], ROUTED_RADIX, True),
                    ("radix2 generated", generated, ["--prtemca", "routed_radix", "2"], 2, False),
                    ("radix2 tree-spawn", tree, ["--prtemca", "routed_radix", "2"], 2, True)]
        for name, files, extra, radix, tree_on in variants:
            trusted = name.endswith("trusted")
            if not trusted:
                lab.deny_host_to_host()
            ok, seconds, onward, detail = run_variant(lab, files, hostfile, extra)
            predicted = predicted_onward(ips, radix) if tree_on else []
            logged = "not logged (trusted)" if trusted else (" ".join(onward) or "none")
            print(f"{n:>2} hosts  {name:<26} {'pass' if ok else 'FAIL':<4} {seconds:6.2f} s  "
                  f"host->host ssh: {logged}  predicted: {' '.join(predicted) or 'none'}  ({detail})",
                  flush=True)
            if trusted:
                continue
            # A daemon that never started tries nothing: without trust only the
            # first level of onward calls happens, a subset of the prediction.
            assert set(onward) <= set(predicted) and bool(onward) == bool(predicted), (onward, predicted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,3,4,8")
    args = parser.parse_args()
    for n in (int(s) for s in args.sizes.split(",")):
        measure(n)


if __name__ == "__main__":
    main()
