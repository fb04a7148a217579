"""`make demo`: the main job on this one machine, step by step.

A cluster of N local ranks (127.0.0.1 repeated, started locally by mlx.launch
and mpirun, no SSH) goes through the same commands a user runs on a cluster:

    mlxcluster doctor --local --collect DIR/captures
    mlxcluster hostfile generate -i <local inventory> --backend ring|mpi
    mlxcluster smoke --backend ring --local N --bench --json   (saved as DIR/smoke-ring.json)
    mlxcluster smoke --backend mpi --local N
    mlxcluster train --local N --config demo -- --steps S --out DIR

Each step runs the real command as a subprocess (what the user would type),
streams its output to ``on_output`` and returns a ``StepResult``. Nothing is
simulated: a step that fails is reported as failed. At the end
``write_demo_report`` makes DIR/report.html (as ``mlxcluster report``) from
what the steps left: the captures, the smoke JSON, the training run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from mlxcluster import interrupts
from mlxcluster.errors import InputError, Interrupted
from mlxcluster.inventory.inventory import local_inventory
from mlxcluster.jobs import process
from mlxcluster.launch.trainer import parse_trainer_args


@dataclass
class StepResult:
    name: str
    ok: bool
    detail: str
    command: list[str]
    seconds: float = 0.0


@dataclass(frozen=True)
class Step:
    name: str
    args: list[str]  # after `python -m mlxcluster`
    timeout: float
    summarize: Callable[[subprocess.CompletedProcess, Path], tuple[bool, str]]
    show_output: bool = True  # False: machine-readable output, kept by summarize


def write_local_inventory(n: int, path: Path, python: str) -> Path:
    """The embedded default cluster as an inventory file (for `hostfile generate`)."""
    inv = local_inventory(n, python)
    doc = {
        "cluster": inv.cluster,
        "python": inv.python,
        "hosts": [{"name": h.name, "ssh": h.ssh, "ips": list(h.ips)} for h in inv.hosts],
    }
    path.write_text("# mlxcluster demo: N ranks on this machine\n" + yaml.safe_dump(doc, sort_keys=False))
    return path


def demo_steps(ranks: int, workdir: Path, steps: int, config: str = "demo") -> list[Step]:
    inventory = workdir / "local.yaml"
    train_out = workdir / "train"
    return [
        Step("doctor", ["doctor", "--local", "--collect", str(workdir / "captures")], 120,
             _by_exit_code("no failing check")),
        Step("hostfile ring", ["hostfile", "generate", "-i", str(inventory), "--backend", "ring",
                               "-o", str(workdir / "hostfile-ring.json"), "--force"], 60,
             _by_exit_code(f"{workdir / 'hostfile-ring.json'} (for mlx.launch --hostfile)")),
        Step("hostfile mpi", ["hostfile", "generate", "-i", str(inventory), "--backend", "mpi",
                              "-o", str(workdir / "hostfile-mpi.txt"), "--force"], 60,
             _by_exit_code(f"{workdir / 'hostfile-mpi.txt'} + .args (for mpirun)")),
        Step("smoke ring", ["smoke", "--backend", "ring", "--local", str(ranks), "--bench", "--json",
                            "--sizes", "1K:1M", "--dtypes", "float32,bfloat16,int32",
                            "--stall-dir", str(workdir)], 300,
             _smoke_json(workdir / SMOKE_JSON), show_output=False),
        Step("smoke mpi", ["smoke", "--backend", "mpi", "--local", str(ranks),
                           "--sizes", "1K:1M", "--dtypes", "float32,int32",
                           "--stall-dir", str(workdir)], 300,
             _by_exit_code("all_sum, all_gather, send/recv correct on every rank")),
        Step("train", ["train", "--local", str(ranks), "--config", config, "--",
                       "--steps", str(steps), "--out", str(train_out)], 600,
             _train_summary(train_out)),
    ]


def run_demo(ranks: int = 2, workdir: Path | str = "runs/demo", steps: int = 100,
             config: str = "demo", python: str | None = None,
             on_output: Callable[[str], None] | None = None,
             on_step: Callable[[StepResult], None] | None = None,
             on_start: Callable[[Step, list[str]], None] | None = None) -> list[StepResult]:
    """Run every step in order; a failed step does not stop the later ones.

    Bad input (a trainer config or steps the trainer refuses, a workdir that
    cannot be made) is an InputError before the first step."""
    parse_trainer_args(("--config", config, "--steps", str(steps)))
    workdir = Path(workdir).resolve()
    py = python or sys.executable
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        write_local_inventory(ranks, workdir / "local.yaml", py)
    except OSError as err:
        where = f" ({err.filename})" if err.filename and str(err.filename) != str(workdir) else ""
        raise InputError(f"--workdir {workdir} cannot be used: {err.strerror}{where}",
                         "give --workdir a directory you can write to (it is created)") from None
    results = []
    planned = demo_steps(ranks, workdir, steps, config)
    for step in planned:
        argv = [py, "-m", "mlxcluster", *step.args]
        if on_start:
            on_start(step, argv)
        started = time.monotonic()
        try:
            proc = _run_streaming(argv, step.timeout, on_output if step.show_output else None)
            ok, detail = step.summarize(proc, workdir)
        except subprocess.TimeoutExpired:
            ok, detail = False, f"did not finish within {step.timeout:.0f} s"
        except KeyboardInterrupt as stop:
            signum = interrupts.signum_of(stop)
            raise Interrupted(signum, f"interrupted ({interrupts.signal_name(signum)}): the demo "
                                      f"stopped in step '{step.name}', after "
                                      f"{len(results)} of {len(planned)} steps") from None
        result = StepResult(step.name, ok, detail, argv, time.monotonic() - started)
        results.append(result)
        if on_step:
            on_step(result)
    return results


CHILD_STOP_GRACE_S = 60.0  # a stopped command cleans its run up on every host first


def _run_streaming(argv: list[str], timeout: float,
                   on_output: Callable[[str], None] | None) -> subprocess.CompletedProcess:
    """Run one step's command, streaming its output, within ``timeout`` (a
    silent command too). Timed out or interrupted, the command is asked to
    stop (SIGTERM, or the signal we got) so that it stops its own run on every
    host; only if it has not ended after CHILD_STOP_GRACE_S is it killed."""
    lines: list[str] = []
    running = process.start(argv, merge_stderr=True)
    proc = running.proc
    deadline = time.monotonic() + timeout
    try:
        while not running.drained():
            got = running.next_line(max(0.0, min(0.5, deadline - time.monotonic())))
            if got is None:
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(argv, timeout) from None
                continue
            lines.append(got[1])
            if on_output:
                on_output(lines[-1])
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        stop_child(proc, signal.SIGTERM)
        raise
    except KeyboardInterrupt as stop:
        with interrupts.deferred():
            stop_child(proc, interrupts.signum_of(stop))
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, "\n".join(lines), "")


def stop_child(proc: subprocess.Popen, signum: int, grace_s: float = CHILD_STOP_GRACE_S) -> None:
    """Send ``signum`` to a step's command (it alone: it stops its own run on
    every host) and wait for it; kill its process group if it has not ended
    within ``grace_s``."""
    interrupts.stop_process(proc, signum, grace_s, group=False)


def _by_exit_code(success: str) -> Callable[[subprocess.CompletedProcess, Path], tuple[bool, str]]:
    def summarize(proc: subprocess.CompletedProcess, _workdir: Path) -> tuple[bool, str]:
        if proc.returncode == 0:
            return True, success
        last = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] or ["no output"]
        return False, f"exit code {proc.returncode}: {last[0]}"
    return summarize


SMOKE_JSON = "smoke-ring.json"
REPORT = "report.html"


def _smoke_json(path: Path) -> Callable[[subprocess.CompletedProcess, Path], tuple[bool, str]]:
    """Keep the smoke's JSON (for the report) and say what it found."""
    def summarize(proc: subprocess.CompletedProcess, _workdir: Path) -> tuple[bool, str]:
        lines = proc.stdout.splitlines()  # stderr is merged in: the JSON starts at its own '{'
        start = next((i for i, ln in enumerate(lines) if ln == "{"), None)
        try:
            doc = json.loads("\n".join(lines[start:])) if start is not None else None
        except json.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict) or not doc.get("backends"):
            return _by_exit_code("")(proc, path.parent)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        backend = doc["backends"][0]
        if proc.returncode != 0:
            return False, f"exit code {proc.returncode}: {backend.get('reason') or backend.get('status')}"
        best = max((b["busbw_gbps"] for b in backend.get("bench", [])), default=0.0)
        return True, (f"all_sum, all_gather, send/recv correct on every rank "
                      f"({backend.get('checks', 0)} checks); busbw up to {best:.2f} GB/s")
    return summarize


def write_demo_report(workdir: Path | str) -> Path:
    """DIR/report.html from what the steps left (the doctor captures, the ring
    smoke's JSON, the training run), each part only if its step left it."""
    from mlxcluster.inventory.inventory import load_inventory
    from mlxcluster.report import build_page, report_from_folder, write_page

    workdir = Path(workdir)
    captures = workdir / "captures"
    smoke = workdir / SMOKE_JSON
    run = workdir / "train"
    report = report_from_folder(
        captures if captures.is_dir() else None,
        inventory=load_inventory(str(workdir / "local.yaml")) if captures.is_dir() else None,
        smoke=smoke if smoke.is_file() else None,
        runs=(run,) if (run / "metrics.jsonl").is_file() else (),
        command=f"mlxcluster demo --workdir {workdir}")
    report.title = "mlxcluster demo report"
    return write_page(build_page(report), workdir / REPORT)


def _train_summary(out: Path) -> Callable[[subprocess.CompletedProcess, Path], tuple[bool, str]]:
    def summarize(proc: subprocess.CompletedProcess, _workdir: Path) -> tuple[bool, str]:
        if proc.returncode != 0:
            return _by_exit_code("")(proc, out)
        records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        losses = [r for r in records if "loss" in r]
        if not losses:
            return False, f"no training step recorded in {out / 'metrics.jsonl'}"
        first, last = losses[0], losses[-1]
        return True, (f"{last['step']} steps, loss {first['loss']:.3f} -> {last['loss']:.3f}, "
                      f"{last.get('tokens_per_s', 0):,.0f} tok/s; outputs in {out}")
    return summarize
