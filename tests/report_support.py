"""Inputs for the HTML report tests: capture folders built from the real
macOS captures (tests/fixtures/macos), this machine's real probe, and
synthetic-but-realistic smoke and training results for the size test."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

from mlxcluster.facts import capture as C
from mlxcluster.facts.collect import probe_source
from tests.topology_helpers import MACCLUSTER, OMLX, OSAURUS, make_capture_dir

VENV_BIN = Path(sys.executable).parent
# Raw macOS outputs every host gets, so that the facts table has OS, build, chip, memory.
FACT_FILES = {
    C.SW_VERS: "sw_vers_macos26.6.2_25G83.txt",
    C.HARDWARE: "sp_hardware_cnquery_m4max_mbp_mac16_5.json",
}


def this_machines_probe() -> str:
    """The probe's JSON on this machine, as doctor saves it (probe.json)."""
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": f"{VENV_BIN}:/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-"], input=probe_source(), capture_output=True, text=True,
                          env=env, timeout=60, check=True).stdout


# What doctor --backend jaccl fails on failing_cluster's captures.
FAILING_CHECKS = ("thunderbolt-links", "ring-or-mesh", "rdma-devices", "thunderbolt-bridge", "rdma-enabled")


def failing_cluster(fixtures: Path, root: Path) -> Path:
    """Four Macs from real captures whose cabling does not match up and whose
    RDMA is off or unknown: doctor --backend jaccl fails five checks (FAILING_CHECKS)."""
    layout = {host: {**files, **FACT_FILES} for host, files in {**MACCLUSTER, **OSAURUS}.items()}
    return make_capture_dir(fixtures, root, layout)


def eight_hosts(fixtures: Path, root: Path, probe: str) -> Path:
    """Eight hosts: each the raw captures of a real Mac (the two of OMLX in
    turn) plus this machine's real probe renamed to the host."""
    names = [f"mac-studio-{i}" for i in range(1, 9)]
    layout = {name: {**list(OMLX.values())[i % 2], **FACT_FILES} for i, name in enumerate(names)}
    make_capture_dir(fixtures, root, layout)
    for name in names:
        doc = json.loads(probe)
        doc["hostname"] = f"{name}.local"
        (root / name / C.PROBE).write_text(json.dumps(doc))
    return root


def smoke_doc(ranks: int = 8, backends=("ring", "mpi", "jaccl"), lo: int = 2**10,
              hi: int = 2**24) -> dict:
    """A `smoke --bench --json` document for ``ranks`` hosts: every op from
    ``lo`` to ``hi`` bytes, bandwidth rising to a plateau as on a real link."""
    docs = []
    for b, backend in enumerate(backends):
        peak = (2.0, 1.5, 6.0)[b % 3]
        bench = []
        for op, factor in (("all_sum", 2 * (ranks - 1) / ranks), ("all_gather", (ranks - 1) / ranks),
                           ("send_recv", 1.0)):
            size = lo
            while size <= hi:
                t = 40e-6 * (1 + b) + size / (peak * 1e9)
                algbw = size / t / 1e9
                bench.append({"op": op, "dtype": "float32", "bytes": size, "ranks": ranks, "p50_s": t,
                              "p90_s": t * 1.2, "algbw_gbps": algbw, "busbw_gbps": algbw * factor,
                              "min_s": t * 0.9})
                size *= 2
        docs.append({
            "backend": backend, "status": "passed", "reason": "", "host_reasons": {}, "hint": "",
            "run_id": f"mlxsmoke-{b:010x}", "duration_s": 41.5, "checks": 96,
            "ranks": [{"rank": r, "host": f"mac-studio-{r + 1}", "status": "passed", "detail": "",
                       "cause": False, "failures": [], "stderr_tail": ""} for r in range(ranks)],
            "bench": bench,
            "fits": [{"op": "all_sum", "alpha_s": 40e-6, "beta_gbps": peak}],
            "cleanup_problems": [],
            "command": ["mlx.launch", "--backend", backend, "--hostfile", "/tmp/hostfile.json", "--",
                        "/tmp/worker.py", "--expect", str(ranks), "--dtypes", "float32,bfloat16",
                        "--sizes", f"{lo}:{hi}", "--ops", "all_sum,all_gather,send_recv", "--bench"],
        })
    return {"version": 1, "ok": True, "exit_code": 0, "backends": docs}


def metrics_rows(steps: int = 300, ranks: int = 8, eval_every: int = 25) -> list[dict]:
    """metrics.jsonl records of a ``steps``-step run logged every step."""
    rows = []
    for step in range(1, steps + 1):
        loss = 2.0 + 4.5 * math.exp(-step / 60) + 0.05 * math.sin(step)
        rows.append({"step": step, "loss": loss, "tokens_per_s": 51234.5 + 800 * math.sin(step / 7),
                     "lr": 3e-4, "grad_norm": 1.0 + 0.1 * math.cos(step),
                     "peak_mem_mb": [8123.4 + 10 * r + min(step, 50) for r in range(ranks)],
                     "peak_rss_mb": [9000.0 + r for r in range(ranks)], "ranks": ranks})
        if step % eval_every == 0:
            rows.append({"step": step, "val_loss": loss + 0.1})
    return rows


def write_run(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


EXTERNAL = ("http://", "https://", "@import", "<script", "<link", "<img", "<iframe",
            "<object", "<embed", "src=", "//fonts", "ftp://")


def external_references(html: str) -> list[str]:
    """Every way the page could reach outside itself, found in its text."""
    low = html.lower()
    found = [s for s in EXTERNAL if s in low]
    # url(...) only to an id in the page (matplotlib's clip paths: url(#p1a2b3c)).
    found += re.findall(r"url\(\s*['\"]?(?!#)[^)]*\)", low)
    return found
