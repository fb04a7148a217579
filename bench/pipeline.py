"""Pipeline-parallel training against data-parallel and one process: speed, memory per
rank, the bubble, and a model that does not fit one rank's memory limit.

    python bench/pipeline.py                       # both parts: 3 minutes quiet, ~20 loaded
    python bench/pipeline.py --part speed --rounds 3
    python bench/pipeline.py --part limit           # the model too big for one rank
    python bench/pipeline.py --quick                # tiny model, one round: a smoke run
    python bench/pipeline.py --part speed --focus --rounds 5 --steps 12
                                                    # --pipeline 2 M=8, compiled and eager,
                                                    # against data-parallel 2 only

Every case is the real trainer on local ranks (mlx.launch --backend ring, started
as mlxcluster starts ranks that all run here: without its busy loop; or one
plain process), the same model, data (the offline corpus) and global batch:
one process, data-parallel over 2 and 4 ranks (`python -m reference_train.train`),
and `--pipeline 2` / `--pipeline 4` with a few --micro_batches and both schedules
(PIPELINE_MODULE), the pipeline's step compiled (the default) and, at 2 stages and
M=8, eager (`--compile false`) beside it; a pipeline's row also says its tokens/s
against data-parallel 2's (the median of the per-round ratios). Each rank runs inside this script (`--as-rank MODULE ARGS`),
which runs the trainer's module as `python -m` would and, at its end, reports what
only the rank knows: the bytes of the weights it holds (its stage's, or the whole
model's), its MLX peak (mx.get_peak_memory) and peak RSS, and, for a pipeline,
every step's phases (compute_s, wait_s, comm_s: loop.StepResult) from which the
bubble is measured as wait_s / compute_s. tokens/s is the trainer's own record
(OUT/metrics.jsonl, a record a step; the first `--warmup` steps dropped).

Part 1 (speed) runs the cases in alternating rounds so all see the same load on a
shared machine; figures are medians over rounds with their spread (min-max), and
ratios to one process are medians of the per-round ratios.

Part 2 (limit): each rank process sets RLIMIT_DATA (its heap and private
mappings: what malloc can get) to `--limit_mib` before it imports anything, as if
it ran on a machine with that much memory and no swap. mx.set_memory_limit is no
such limit on MLX's CPU backend (a guideline: measured, 1.25 GiB allocated past a
200 MiB limit without complaint) and mx.set_wired_limit is Metal's only. Past the
limit malloc returns NULL; mlx 0.32.4's CPU backend does not check it and dies
with SIGSEGV, which is how one process and data-parallel ranks, each holding the
whole model, fail; pipeline ranks, each holding its stage, train.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and sys.argv[1:2] == ["--as-rank"]:
    # A rank: limit its memory before anything (mlx, numpy) is imported.
    import os
    import resource

    _limit = int(os.environ.get("BENCH_RLIMIT_DATA", "0"))
    if _limit:
        resource.setrlimit(resource.RLIMIT_DATA, (_limit, _limit))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The trainer module that takes --pipeline (reference_train.pipeline_train, a stand-in
# loop, until the trainer took it).
PIPELINE_MODULE = "reference_train.train"
DATA_PARALLEL_MODULE = "reference_train.train"
# Where each rank writes its report (rank_R.json): a file, not a line of its output,
# which mlx.launch relays in 8 KiB chunks from each rank in turn, so that two ranks'
# lines can run into one (seen: "json.decoder.JSONDecodeError: Extra data").
REPORTS_DIR = "BENCH_REPORTS_DIR"


# ---------------------------------------------------------------- inside a rank


def run_as_rank(module: str, argv: list[str]) -> int:
    """Run `python -m MODULE ARGV` in this process; write this rank's report after."""
    import faulthandler
    import resource
    import runpy

    faulthandler.enable()  # a crash past the memory limit says where, on stderr
    from mlx.utils import tree_flatten

    from reference_train import loop, pipeline

    seen: dict = {"held": None, "splits": []}

    def held_by(model) -> int:
        return sum(v.nbytes for _, v in tree_flatten(model.parameters()))

    step_init, step_call, train_loop = (pipeline.PipelineStep.__init__,
                                        pipeline.PipelineStep.__call__, loop.train_loop)

    def init(self, stage, *args, **kwargs):
        seen["held"] = held_by(stage)
        step_init(self, stage, *args, **kwargs)

    def call(self, *args, **kwargs):
        result = step_call(self, *args, **kwargs)
        # filled on the steps the loop logs (every step here: --log_every 1)
        split = result.phases
        if split:
            seen["splits"].append(split)
        return result

    def looped(model, *args, **kwargs):
        if seen["held"] is None:
            seen["held"] = held_by(model)
        return train_loop(model, *args, **kwargs)

    pipeline.PipelineStep.__init__, pipeline.PipelineStep.__call__ = init, call
    loop.train_loop = looped  # before the module imports it by name
    sys.argv = [module, *argv]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    import mlx.core as mx

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin"
                                                                 else 1024)
    rank = int(os.environ.get("MLX_RANK", "0"))
    (Path(os.environ[REPORTS_DIR]) / f"rank_{rank}.json").write_text(json.dumps(
        {"rank": rank, "exit": code, "held": seen["held"], "mlx_peak": mx.get_peak_memory(),
         "rss_peak": rss, "vm_data": vm_data(), "splits": seen["splits"]}))
    return code


def vm_data() -> int:
    """This process's VmData (what RLIMIT_DATA limits) in bytes; 0 where /proc has none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ---------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    """One way to train the model: `ranks` processes, a pipeline of `pipeline` stages
    (0: data-parallel, or one process) of `micro_batches` with `schedule`."""

    ranks: int
    pipeline: int = 0
    micro_batches: int = 0
    schedule: str = "1f1b"
    compile: bool = True
    split: str = ""  # --pipeline_split; "" the trainer's own (balanced by bytes)

    @property
    def name(self) -> str:
        if self.pipeline:
            return (f"pipeline {self.pipeline}, M={self.micro_batches}, {self.schedule}"
                    + ("" if self.compile else ", eager")
                    + (f", split {self.split}" if self.split else ""))
        if self.ranks == 1:
            return "1 process" + ("" if self.compile else ", eager")
        return f"data-parallel {self.ranks}"

    def argv(self) -> tuple[str, list[str]]:
        """(the trainer's module, this case's own flags)."""
        eager = [] if self.compile else ["--compile", "false"]
        if self.pipeline:
            return PIPELINE_MODULE, ["--pipeline", str(self.pipeline), "--micro_batches",
                                     str(self.micro_batches), "--pipeline_schedule",
                                     self.schedule, *eager,
                                     *(["--pipeline_split", self.split] if self.split else [])]
        return DATA_PARALLEL_MODULE, eager


@dataclass
class Outcome:
    """One run of a case: the launcher's exit, each rank's report, the trainer's records."""

    case: Case
    exit: int
    ranks: list[dict]  # the reports of the ranks that got to the end, by rank
    records: list[dict]  # OUT/metrics.jsonl's step records
    stderr: str

    @property
    def trained(self) -> bool:
        return (self.exit == 0 and len(self.ranks) == self.case.ranks
                and all(r["exit"] == 0 for r in self.ranks))


def rank_env(limit: int) -> dict[str, str]:
    from bench_support import trainer_env

    env = trainer_env(threads=1)  # one BLAS thread per rank: ranks share 2 cores
    if limit:
        env["BENCH_RLIMIT_DATA"] = str(limit)
    return env


def local_ranks(ranks: int, rank_cmd: list[str], env: dict[str, str]) -> list[str]:
    """The command that runs `rank_cmd` as `ranks` local ranks of the ring backend, `env`'s
    PYTHONPATH, OpenBLAS and memory limit passed on: mlx.launch as mlxcluster starts
    ranks that all run here, without its busy loop (mlxcluster/jobs/quiet_launch.py),
    which took one of this machine's two cores."""
    from mlxcluster.jobs.hosts import local_hosts
    from mlxcluster.jobs.plan import free_port_block
    from mlxcluster.jobs.process import launcher_argv

    launcher = Path(sys.executable).parent / "mlx.launch"
    cmd = [str(launcher), "-n", str(ranks), "--backend", "ring", "--starting-port",
           str(free_port_block(ranks)), "--python", sys.executable]
    cmd += [f"--env={k}={env[k]}" for k in ("PYTHONPATH", "LD_PRELOAD", "OPENBLAS_NUM_THREADS",
                                             "BENCH_RLIMIT_DATA", REPORTS_DIR)
            if k in env]
    return launcher_argv([*cmd, "--", *rank_cmd], local_hosts(ranks, sys.executable))


def launch(case: Case, model: list[str], out: Path, limit: int = 0,
           timeout: float = 1200) -> Outcome:
    """Run `case` on `model`'s flags, each rank under this script (`--as-rank`)."""
    module, own = case.argv()
    rank_cmd = [str(Path(__file__).resolve()), "--as-rank", module, *model, *own,
                "--out", str(out)]
    env = rank_env(limit)
    reports_dir = Path(f"{out}.reports")  # beside --out: the trainer's folder stays its own
    reports_dir.mkdir(parents=True, exist_ok=True)
    env[REPORTS_DIR] = str(reports_dir)
    cmd = [sys.executable, *rank_cmd] if case.ranks == 1 else \
        local_ranks(case.ranks, rank_cmd, env)
    # A session of its own, so that a timeout ends mlx.launch's ranks too.
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\n(timed out after {timeout:.0f} s)"
    reports = sorted((json.loads(f.read_text()) for f in reports_dir.glob("rank_*.json")),
                     key=lambda r: r["rank"])
    metrics = out / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()
               if line.strip()] if metrics.exists() else []
    return Outcome(case, proc.returncode, reports, [r for r in records if "loss" in r], stderr)


# ---------------------------------------------------------------- part 1: speed, memory, bubble


def speed_cases(quick: bool, focus: bool = False, split: str = "") -> list[Case]:
    """quick: a smoke run; focus: issue 49's goal only, `--pipeline 2` at M=8 compiled
    and eager against data-parallel 2 (and one process, the ratios' base); `split`:
    focus's eager case replaced by the compiled one with that --pipeline_split."""
    if quick:
        return [Case(1), Case(2, 2, 2)]
    if focus:
        last = Case(2, 2, 8, split=split) if split else Case(2, 2, 8, compile=False)
        return [Case(1), Case(2), Case(2, 2, 8), last]
    return [Case(1), Case(1, compile=False), Case(2), Case(4),
            Case(2, 2, 2), Case(2, 2, 8), Case(2, 2, 8, compile=False), Case(2, 2, 8, "gpipe"),
            Case(4, 4, 4), Case(4, 4, 8), Case(4, 4, 8, "gpipe")]


def tokens_per_s(outcome: Outcome, warmup: int) -> float:
    speeds = [r["tokens_per_s"] for r in outcome.records if r["step"] > warmup]
    if not outcome.trained or not speeds:
        raise SystemExit(f"{outcome.case.name}: exit {outcome.exit}, "
                         f"{len(outcome.ranks)} rank reports\n{outcome.stderr[-3000:]}")
    return statistics.median(speeds)


def bubble(outcome: Outcome, warmup: int) -> list[float]:
    """Each rank's median share of its passes spent waiting for a neighbour."""
    return [statistics.median(s["wait_s"] / s["compute_s"] for s in r["splits"][warmup:])
            for r in outcome.ranks]


def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    """"median (min-max)"."""
    text = fmt.format(statistics.median(values))
    return text if len(values) == 1 else (f"{text} ({fmt.format(min(values))}-"
                                          f"{fmt.format(max(values))})")


def mib(values, digits: int = 0) -> str:
    return "/".join(f"{v / 2**20:.{digits}f}" for v in values)


def part_speed(model: list[str], rounds: int, warmup: int, quick: bool, tmp: Path,
               focus: bool = False, split: str = "") -> dict:
    from reference_train.stages import bubble_fraction

    cases = speed_cases(quick, focus, split)
    runs: dict[Case, list[Outcome]] = {c: [] for c in cases}
    for n in range(rounds):
        for case in cases:
            outcome = launch(case, model, tmp / f"speed{n}-{len(runs[case])}-{case.ranks}")
            speed = tokens_per_s(outcome, warmup)
            runs[case].append(outcome)
            print(f"  round {n + 1}  {case.name:<34} {speed:>8,.0f} tok/s  MLX peak MiB per "
                  f"rank {mib(r['mlx_peak'] for r in outcome.ranks)}", flush=True)
    one = runs[cases[0]]
    data_parallel = runs.get(Case(2))  # a pipeline's rows also say x data-parallel 2
    print(f"\n{'case':<34}{'tokens/s: median (min-max)':>30}{'x 1 process':>13}{'x DP 2':>8}"
          f"{'held MiB':>22}{'MLX peak MiB':>16}{'RSS peak MiB':>18}{'bubble: measured':>34}"
          f"{'formula':>9}")
    table = []
    for case, outcomes in runs.items():
        speeds = [tokens_per_s(o, warmup) for o in outcomes]
        ratio = statistics.median(s / tokens_per_s(o, warmup) for s, o in zip(speeds, one,
                                                                              strict=True))
        last = outcomes[-1].ranks
        peaks = [statistics.median(o.ranks[i]["mlx_peak"] for o in outcomes)
                 for i in range(case.ranks)]
        rss = [statistics.median(o.ranks[i]["rss_peak"] for o in outcomes)
               for i in range(case.ranks)]
        row = {"case": case.name, "ranks": case.ranks, "pipeline": case.pipeline,
               "micro_batches": case.micro_batches, "schedule": case.schedule,
               "tokens_per_s": speeds, "ratio": ratio, "held": [r["held"] for r in last],
               "mlx_peak": peaks, "rss_peak": rss}
        waited = ""
        formula = ""
        if case.pipeline:
            per_round = [bubble(o, warmup) for o in outcomes]
            per_rank = [statistics.median(b[i] for b in per_round) for i in range(case.ranks)]
            row["bubble"] = per_rank
            row["bubble_formula"] = bubble_fraction(case.pipeline, case.micro_batches)
            mean = [sum(b) / len(b) for b in per_round]
            waited = f"{spread(mean, '{:.0%}')} [{'/'.join(f'{b:.0%}' for b in per_rank)}]"
            formula = f"{row['bubble_formula']:.0%}"
        versus_dp = ""
        if case.pipeline and data_parallel:
            row["ratio_data_parallel_2"] = statistics.median(
                s / tokens_per_s(o, warmup) for s, o in zip(speeds, data_parallel, strict=True))
            versus_dp = f"{row['ratio_data_parallel_2']:.2f}x"
        table.append(row)
        print(f"{case.name:<34}{spread(speeds):>30}{ratio:>12.2f}x{versus_dp:>8}"
              f"{mib(row['held'], 2):>22}"
              f"{mib(peaks):>16}{mib(rss):>18}{waited:>34}{formula:>9}")
    print("held: weights each rank holds; bubble: wait_s / compute_s, the mean over ranks "
          "(median over rounds, min-max) [each rank's median]")
    return {"rounds": rounds, "warmup_steps": warmup, "model": model, "cases": table}


# ---------------------------------------------------------------- part 2: the memory limit


def limit_cases() -> list[Case]:
    return [Case(1), Case(2), Case(4), Case(2, 2, 2), Case(4, 4, 4)]


def first_error(stderr: str) -> str:
    """The line saying why a run ended, from its stderr, with where a crash happened (the
    innermost Python frame faulthandler printed)."""
    lines = stderr.splitlines()
    for mark in ("Fatal Python error", "MemoryError", "error:", "Error"):
        for n, line in enumerate(lines):
            if mark in line:
                frame = next((f.strip() for f in lines[n + 1:n + 6]
                              if f.strip().startswith("File ")), "")
                return line.strip()[:160] + (f" ({frame[:160]})" if frame else "")
    return lines[-1][:160] if lines else ""


def part_limit(model: list[str], limit_mib: int, tmp: Path) -> dict:
    limit = limit_mib * 2**20
    print(f"each rank process: RLIMIT_DATA {limit_mib} MiB ({limit} bytes)")
    rows = []
    for case in limit_cases():
        outcome = launch(case, model, tmp / f"limit-{case.ranks}-{case.pipeline}", limit=limit)
        free = launch(case, model, tmp / f"free-{case.ranks}-{case.pipeline}")  # no limit
        held = [r["held"] for r in free.ranks]
        row = {"case": case.name, "trained": outcome.trained, "exit": outcome.exit,
               "steps_logged": len(outcome.records),
               "loss": outcome.records[-1]["loss"] if outcome.records else None,
               "free_loss": free.records[-1]["loss"] if free.records else None,
               "ranks_reported": len(outcome.ranks), "held": held,
               "free_vm_data": [r["vm_data"] for r in free.ranks],
               "free_rss_peak": [r["rss_peak"] for r in free.ranks],
               "free_mlx_peak": [r["mlx_peak"] for r in free.ranks],
               "limited_vm_data": [r["vm_data"] for r in outcome.ranks],
               "why": "" if outcome.trained else first_error(outcome.stderr)}
        rows.append(row)
        state = (f"trained {row['steps_logged']} steps, loss {row['loss']:.6f} (unlimited: "
                 f"{row['free_loss']:.6f})" if row["trained"]
                 else f"FAILED exit {outcome.exit} after {row['steps_logged']} logged steps: "
                      f"{row['why']}")
        print(f"  {case.name:<26} held MiB {mib(held, 1):>12}  unlimited: VmData MiB "
              f"{mib(row['free_vm_data']):>16}, MLX peak {mib(row['free_mlx_peak']):>12}"
              f"\n  {'':<26} limited: {state}", flush=True)
    return {"limit_bytes": limit, "model": model, "cases": rows}


# ---------------------------------------------------------------- main


SPEED_MODEL = ["--config", "demo", "--block_size", "64", "--global_batch", "8"]
# --size wide: a model whose micro-batches are work, not dispatch (8 blocks of width
# 256, 128-token rows, 16 a step: M=8 is 2 rows a micro-batch), as a model that
# needs a pipeline is; the demo model's M=8 micro-batch is one 64-token row.
WIDE_MODEL = ["--config", "demo", "--dim", "256", "--n_layers", "8", "--n_heads", "4",
              "--hidden_dim", "768", "--block_size", "128", "--global_batch", "16"]
LIMIT_MODEL = ["--config", "demo", "--dim", "512", "--n_layers", "8", "--n_heads", "8",
               "--hidden_dim", "1536", "--block_size", "32", "--global_batch", "4"]
QUICK_MODEL = ["--config", "tiny"]


def model_flags(base: list[str], steps: int, data: Path) -> list[str]:
    return [*base, "--data", str(data), "--steps", str(steps), "--log_every", "1",
            "--eval_every", "0", "--checkpoint_every", "0", "--sample_tokens", "0"]


def main() -> int:
    if sys.argv[1:2] == ["--as-rank"]:
        return run_as_rank(sys.argv[2], sys.argv[3:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("speed", "limit", "both"), default="both")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6, help="steps per run (part 1)")
    p.add_argument("--warmup", type=int, default=2, help="first steps not timed (compilation)")
    p.add_argument("--limit_steps", type=int, default=3, help="steps per run (part 2)")
    p.add_argument("--limit_mib", type=int, default=600, help="RLIMIT_DATA per rank (part 2)")
    p.add_argument("--quick", action="store_true", help="tiny model, one round, part 1 only")
    p.add_argument("--focus", action="store_true",
                   help="part 1 with issue 49's cases only: --pipeline 2 at M=8 compiled and "
                        "eager, data-parallel 2, one process")
    p.add_argument("--size", choices=("demo", "wide"), default="demo",
                   help="part 1's model: the demo model (dispatch-bound at M=8) or a wider "
                        "one (WIDE_MODEL)")
    p.add_argument("--split", default="",
                   help="with --focus: the eager case replaced by --pipeline 2 M=8 with this "
                        "--pipeline_split (e.g. 3,1)")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    if args.quick:
        args.part, args.rounds, args.steps, args.warmup = "speed", 1, 2, 1
    from reference_train.prepare import prepare_offline

    result: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "load_average_start": os.getloadavg(), "pipeline_module": PIPELINE_MODULE}
    print(f"{result['started']}, load average {os.getloadavg()[0]:.1f}; pipeline: "
          f"python -m {PIPELINE_MODULE}", flush=True)
    with tempfile.TemporaryDirectory(prefix="pipeline_bench.") as name:
        tmp = Path(name)
        prepare_offline(tmp / "data")
        if args.part in ("speed", "both"):
            base = QUICK_MODEL if args.quick else (WIDE_MODEL if args.size == "wide"
                                                   else SPEED_MODEL)
            model = model_flags(base, args.steps, tmp / "data")
            print(f"\n1. speed, memory and bubble: {' '.join(base)}, {args.steps} steps "
                  f"a run ({args.warmup} untimed), {args.rounds} alternating rounds", flush=True)
            result["speed"] = part_speed(model, args.rounds, args.warmup, args.quick, tmp,
                                         args.focus, args.split)
        if args.part in ("limit", "both"):
            model = model_flags(LIMIT_MODEL, args.limit_steps, tmp / "data")
            print(f"\n2. a per-rank memory limit: {' '.join(LIMIT_MODEL)}, full fine-tuning, "
                  f"{args.limit_steps} steps", flush=True)
            result["limit"] = part_limit(model, args.limit_mib, tmp)
    result["load_average_end"] = os.getloadavg()
    print(f"\nended {time.strftime('%H:%M:%S UTC', time.gmtime())}, load average "
          f"{os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
