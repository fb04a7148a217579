"""`train --data DIR`'s sync rate against a plain copy over ssh, in the lab.

    python bench/data_sync.py                 # 2-host lab, 200 MB of tokens, 3 rounds (root, Linux)
    python bench/data_sync.py --mb 500 --rounds 5

Builds its own 2-host lab (tests/lab: sshd in network namespaces, each host
with its own disk) and a token folder of --mb MB on this machine's disk.
Each round, in turn, on fresh (emptied) host copies: mlxcluster's check +
send by rsync, the same by its ssh stream (the host verifies every file's
sha256 before renaming it into place), and the plain copies a user would
type: `ssh HOST 'cat > FILE' < FILE` per file and `rsync -a DIR HOST:`. All
over the same kind of ssh connection (a shared master, as `train` opens).
Prints MB/s per method (median of rounds) and the ratio to the plain ssh
copy, per round then the median.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlxcluster.inventory.inventory import load_inventory  # noqa: E402
from mlxcluster.jobs.connections import shared_hosts  # noqa: E402
from mlxcluster.jobs.hosts import host_link, hosts_from_inventory, ssh_argv  # noqa: E402
from mlxcluster.launch.sync import check_copy, read_manifest  # noqa: E402
from mlxcluster.transfer.send import send  # noqa: E402
from tests.lab import lab_unavailable_reason, start_lab  # noqa: E402


def make_data(folder: Path, mb: int) -> None:
    """A token folder of about ``mb`` MB (random ids; meta.json as prepare writes it)."""
    import numpy as np

    from reference_train.data import FORMAT
    from reference_train.files import file_sha256

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    splits = {}
    for name, share in (("train", 0.95), ("val", 0.05)):
        tokens = rng.integers(0, 257, size=int(mb * 1e6 * share / 2), dtype=np.uint16)
        tokens.tofile(folder / f"{name}.bin")
        splits[name] = {"file": f"{name}.bin", "tokens": int(tokens.size), "documents": 1,
                        "bytes": (folder / f"{name}.bin").stat().st_size,
                        "sha256": file_sha256(folder / f"{name}.bin")}
    meta = {"format": FORMAT, "dtype": "uint16", "vocab_size": 257, "eos_id": 256,
            "tokenizer": {"kind": "byte"}, "splits": splits, "source": "bench: random tokens"}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    why = lab_unavailable_reason()
    if why:
        print(f"needs the lab: {why}")
        return 2
    with start_lab(2) as lab, tempfile.TemporaryDirectory() as tmp:
        data = lab.disk / "bench-data"
        make_data(data, args.mb)
        manifest = read_manifest(data)
        hosts = hosts_from_inventory(load_inventory(lab.write_inventory(Path(tmp) / "lab.yaml")))
        env = lab.env()
        with shared_hosts(hosts, env) as shared:
            host = shared[1]

            def wipe() -> None:
                subprocess.run(ssh_argv(host, f"rm -rf {shlex.quote(str(data))}"), env=env,
                               check=True, capture_output=True, timeout=60)

            def ours(use_rsync: bool) -> float:
                wipe()
                start = time.monotonic()
                copy = check_copy(manifest, host, env)
                sent = send(manifest, copy, lambda n: None, use_rsync=use_rsync)
                assert sent.bytes == manifest.total_bytes
                return time.monotonic() - start

            def plain_ssh() -> float:
                wipe()
                start = time.monotonic()
                subprocess.run(ssh_argv(host, f"mkdir -p {shlex.quote(str(data))}"), env=env,
                               check=True, timeout=60)
                for f in manifest.files:
                    with open(data / f.name, "rb") as source:
                        subprocess.run(ssh_argv(host, f"cat > {shlex.quote(str(data / f.name))}"),
                                       stdin=source, env=env, check=True, timeout=600)
                return time.monotonic() - start

            def plain_rsync() -> float:
                wipe()
                start = time.monotonic()
                ssh = shlex.join(host_link(host, env).ssh)
                subprocess.run(["rsync", "-a", "-e", ssh, f"{data}/", f"{host.ssh_target}:{data}/"],
                               env=env, check=True, timeout=600)
                return time.monotonic() - start

            methods = {"mlxcluster, rsync": lambda: ours(True),
                       "mlxcluster, ssh stream": lambda: ours(False),
                       "plain ssh cat": plain_ssh, "plain rsync -a": plain_rsync}
            times: dict[str, list[float]] = {m: [] for m in methods}
            for _ in range(args.rounds):
                for name, run in methods.items():
                    times[name].append(run())
        mb = manifest.total_bytes / 1e6
        print(f"{mb:.0f} MB to one lab host, {args.rounds} rounds, median (per-round ratio to "
              "plain ssh cat, median)")
        for name, seconds in times.items():
            ratios = [a / b for a, b in zip(times["plain ssh cat"], seconds, strict=True)]
            print(f"  {name:24s} {statistics.median(seconds):6.2f} s  "
                  f"{mb / statistics.median(seconds):7.1f} MB/s  x{statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
