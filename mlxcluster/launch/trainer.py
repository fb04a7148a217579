"""Hand-off to the reference trainer: what is trainer-specific about a job.

The trainer's arguments are parsed once, here, before anything starts on the
hosts (``parse_trainer_args``: the same ``build_config`` every rank runs) into
a ``TrainerArgs``; what mlxcluster adds to them (a checkpoint interval for
restarts, ``--resume``, a new ``--grad_accum`` after a lost host) is set on
that value, never edited into a command line. ``trainer_job`` makes the job's
program from it: to the jobs layer the trainer is one program among others.

``TrainerRun`` is a training run across launches: it keeps the run's record
here (launch/record.py), and decides what a restart resumes from and what a
dropped host changes; ``run_trainer`` launches it until done
(jobs.restarts.launch_until_done).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlxcluster.errors import InputError
from mlxcluster.facts.facts import HostFacts
from mlxcluster.jobs.cleanup import new_run_id
from mlxcluster.jobs.events import Note, OnEvent, Restarting, Warned
from mlxcluster.jobs.job import Job, program_command
from mlxcluster.jobs.restarts import (
    Dropped,
    Restarts,
    accumulation_for,
    without_hosts,
)
from mlxcluster.jobs.run import run_job
from mlxcluster.jobs.running import RunningJob, register_run_kind
from mlxcluster.jobs.watch import RunOutcome
from mlxcluster.launch.fetch import fetch_folder
from mlxcluster.launch.on_hosts import HeldOnHosts
from mlxcluster.launch.pipeline_launch import (
    Pipeline,
    check_pipeline,
    check_stages,
    model_sizes,
    pipeline_of,
    resplit,
    split_files,
    stage_files_left_out,
    stage_split,
)
from mlxcluster.launch.record import RECORD_ENV, RunRecord
from mlxcluster.launch.session import LaunchFlags, LaunchRequest
from mlxcluster.launch.supervisor import JobResult, Words, supervise
from reference_train.config import TrainConfig, build_config
from reference_train.fine_tune import ADAPTER_FILES, trains_adapters
from reference_train.metrics import STOP_ENV, plot_metrics

TRAINER_MODULE = "reference_train.train"
# The trainer's progress bar off (output arrives line by line): added, not typed.
PROGRESS_OFF = ("--progress", "false")
TRAIN_PREFIX = register_run_kind("mlxtrain", "train", detachable=True,
                                 added=PROGRESS_OFF)  # its run ids
# How to go on after a failed or stalled run, in every message that says so.
RESUME_THEN = ", then rerun with '-- --resume auto' to continue from the last checkpoint"
# --detach without --max-restarts: how a detached run that failed goes on.
RESUME_AFTER_DETACHED = " (a detached job that fails: rerun with -- --resume auto)"


@dataclass(frozen=True)
class TrainerHelp:
    """The trainer's own help text, asked for with `-- --help`."""

    text: str


@dataclass(frozen=True)
class TrainerArgs:
    """The trainer's arguments: what the user gave, the config every rank
    builds from them, and the flags mlxcluster sets on top (last on the
    command line: argparse takes the last value of a flag)."""

    given: tuple[str, ...]
    config: TrainConfig
    ours: dict[str, str] = field(default_factory=dict)  # flag name -> value, in the order set
    # --download-on: a view here of the --init_from only the hosts hold (launch/on_hosts.py)
    model_view: str | None = None

    def with_flags(self, **values) -> TrainerArgs:
        """These flags set (or set again) by mlxcluster; the config follows."""
        ours = dict(self.ours)
        for name, value in values.items():
            ours.pop(name, None)  # set again: moves to the end, as a later flag wins
            ours[name] = str(value)
        return dataclasses.replace(self, ours=ours, config=dataclasses.replace(self.config, **values))

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline the ranks will run (--pipeline 1: none)."""
        return pipeline_of(self.config)

    @property
    def config_here(self) -> TrainConfig:
        """The config as this machine reads its --init_from (the stages' plan
        and memory): with ``model_view``, the view stands in for the folder
        the ranks open on the hosts."""
        if self.model_view is None:
            return self.config
        return dataclasses.replace(self.config, init_from=self.model_view)

    def argv(self) -> tuple[str, ...]:
        return (*self.given, *(part for name, value in self.ours.items()
                               for part in (f"--{name}", value)))


def parse_trainer_args(args: tuple[str, ...]) -> TrainerArgs | TrainerHelp:
    """Parse the trainer's own flags here, before anything starts on the hosts:
    a typo must not cost a launch on every host to find out. Returns the
    arguments with the config every rank will build, or the trainer's help
    when ``args`` ask for it (`-- --help`)."""
    shown, said = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(shown), contextlib.redirect_stderr(said):
            return TrainerArgs(tuple(args), build_config(list(args)))
    except SystemExit as done:  # argparse: the help (exit 0), or an unknown flag or missing value
        if done.code in (0, None):
            return TrainerHelp(shown.getvalue())
        lines = [ln for ln in said.getvalue().splitlines() if ln.strip()]
        raise InputError(f"trainer arguments rejected: {lines[-1] if lines else ' '.join(args)}",
                         "python -m reference_train.train --help lists every --field") from None
    except ValueError as err:  # a config file's problem, a type or a value out of range
        raise InputError(f"trainer arguments rejected: {err}",
                         "configs are tiny, demo, blog or a YAML file; docs/training-reference.md lists "
                         "every field, its type and its allowed values") from None


def data_modules(data: str | None) -> tuple[str, ...]:
    """What the ranks import for a ``--data`` folder besides the trainer's own
    imports: ``tokenizers`` when it (read here: it is sent to the hosts as
    it is) was tokenized with a tokenizer.json or a Hugging Face name (every
    rank makes its tokenizer); nothing for byte-level data, the default
    corpus (None), or data this machine cannot read."""
    if not data:
        return ()
    try:
        spec = json.loads((Path(data) / "meta.json").read_text()).get("tokenizer")
    except (OSError, ValueError, AttributeError):
        return ()
    kind = spec.get("kind") if isinstance(spec, dict) else spec
    return () if kind in (None, "byte") else ("tokenizers",)


def trainer_job(job: Job, args: TrainerArgs) -> Job:
    """``job`` running the trainer with ``args``: its progress bar off (output
    arrives line by line, and mpirun gives ranks a terminal; the user's
    --progress still wins), shown as the user would type it; the preflight
    checks every host imports it (and what its data needs: ``data_modules``);
    its metrics records come to this machine."""
    return dataclasses.replace(
        job, program=("-m", TRAINER_MODULE, *PROGRESS_OFF, *args.argv()),
        shown_program=("-m", TRAINER_MODULE, *args.argv()),
        imports=(TRAINER_MODULE, *data_modules(args.config.data)),
        title="training", then=RESUME_THEN, env={**job.env, RECORD_ENV: "1", STOP_ENV: "1"})


def training_job(job: Job, args: TrainerArgs) -> Job:
    """The chosen job running the trainer (``trainer_job``), the global batch
    first checked to split over its ranks (``check_batch_split``), or with
    --pipeline the world, the split and the micro-batches (``check_pipeline``):
    before any preflight or launch, the ranks are known."""
    pipeline = args.pipeline
    if pipeline.on:
        check_pipeline(args.config_here, pipeline, len(job.hosts), job.backend)
    else:
        check_batch_split(args.config, len(job.hosts))
    return trainer_job(job, args)


def training_check(job: Job, args: TrainerArgs, env: dict[str, str], on_event: OnEvent) -> None:
    """`train`'s check in its launch session, before anything is sent: no run
    training into the same --out on the hosts (``check_not_running``); with
    --pipeline, each stage against its host's memory (``check_stages``, the
    facts serve's split check asks for)."""
    check_not_running(job, args.config.out, env)
    pipeline = args.pipeline
    if pipeline.on:
        from mlxcluster.jobs.preflight import probe_facts  # a pipeline-only chore

        check_stages(job, args.config_here, pipeline, probe_facts(job, env), on_event)
        if args.model_view is not None:
            on_event(Note(f"pipeline: every host holds the whole of {args.config.init_from} "
                          "(--download-on): each stage reads its own weight files there, "
                          "nothing sent"))


def training_request(args: TrainerArgs, flags: LaunchFlags, *, detached: bool,
                     send_folders: bool) -> LaunchRequest:
    """The launch session's request for `mlxcluster train`: the trainer on
    every rank, no run training into the same --out on the hosts
    (``check_not_running``), and unless not ``send_folders`` its --init_from
    (a model) and --data folders on every host: with --pipeline over a
    sharded model, each host only the weight files of its stages
    (``stage_files_left_out``). A model only the hosts hold (``model_view``)
    is on every host already, whole and checked: not sent."""
    cfg, pipeline = args.config, args.pipeline
    sends_model = bool(cfg.init_from) and send_folders and args.model_view is None
    return LaunchRequest(
        flags, TRAIN_PREFIX, program=lambda job: training_job(job, args), detached=detached,
        check=lambda job, env, on_event: training_check(job, args, env, on_event),
        models=(cfg.init_from,) if sends_model else (),
        data=(cfg.data,) if cfg.data and send_folders else (),
        model_files=(lambda job, folder: stage_files_left_out(job, cfg, pipeline, folder))
        if pipeline.on and split_files(args.config_here) else None)


def sends_stage_files(request: LaunchRequest) -> bool:
    """Whether ``request`` (``training_request``'s) sends each host only its stages'
    weight files of a model it sends: then a re-split sends the hosts left their new
    blocks' files before the relaunch (``run_trainer``'s ``stage_files``)."""
    return request.model_files is not None and bool(request.models)


def with_stage_split(args: TrainerArgs) -> TrainerArgs:
    """--pipeline over a sharded --init_from: the split planned here from the
    whole folder given to the ranks (--pipeline_split), as each host is sent
    only its stage's weight files (``training_request``) and a rank cannot
    balance the stages from those (reference_train pipeline_setup.run_plans).
    A split the user gave stays."""
    cfg, pipeline = args.config_here, args.pipeline
    if not pipeline.on or pipeline.split is not None or not split_files(cfg):
        return args
    split = stage_split(cfg, pipeline)
    return args if split is None else args.with_flags(pipeline_split=",".join(map(str, split)))


# With restarts on and no checkpoint_every, a checkpoint every steps/20 steps: a
# restart redoes at most 5% of the run. Its cost: docs/performance-runs.md.
RESTART_CHECKPOINTS_PER_RUN = 20


def restart_checkpoint_every(steps: int) -> int:
    """The checkpoint interval `train --max-restarts` gives a trainer that set none."""
    return max(1, -(-steps // RESTART_CHECKPOINTS_PER_RUN))


def with_model_folder(args: TrainerArgs) -> TrainerArgs:
    """--init_from given as a Hugging Face id: its folder in huggingface_hub's
    cache here (downloaded there when missing: launch/pull.py), which every
    rank is then given and every host sent."""
    from mlxcluster.launch.pull import as_folder

    init_from = args.config.init_from
    folder = as_folder(init_from) if init_from else init_from
    return args.with_flags(init_from=folder) if folder != init_from else args


def model_to_download(args: TrainerArgs) -> str:
    """The --init_from a host downloads (`train --download-on HOST`);
    InputError (exit 2) when the trainer is given none."""
    if not args.config.init_from:
        raise InputError("--download-on HOST downloads the trainer's --init_from, and none is given",
                         "add the model's Hugging Face id after '--', e.g. -- --init_from "
                         "mlx-community/Llama-3.2-1B-Instruct-4bit")
    return args.config.init_from


def with_model_on_hosts(args: TrainerArgs, folder: str, view: str) -> TrainerArgs:
    """--init_from as the ranks open it on every host (``folder``, pulled
    there with --download-on), read here from ``view`` (launch/on_hosts.py)."""
    return dataclasses.replace(args.with_flags(init_from=folder), model_view=view)


def with_model(args: TrainerArgs, held: HeldOnHosts | None) -> TrainerArgs:
    """--init_from as the ranks open it: pulled to every host from the one that
    downloaded it (``held``, `--download-on`), else resolved here (an id: its
    folder in the cache here, then sent to every host)."""
    if held is None:
        return with_model_folder(args)
    return with_model_on_hosts(args, held.folder, held.view)


def with_restart_checkpoints(args: TrainerArgs, max_restarts: int) -> TrainerArgs:
    """With restarts on, a checkpoint interval when the run set none: a
    restart then loses at most 1/20 of the run."""
    if max_restarts and not args.config.checkpoint_every:
        return args.with_flags(checkpoint_every=restart_checkpoint_every(args.config.steps))
    return args


def check_batch_split(cfg: TrainConfig, ranks: int) -> None:
    """InputError when the global batch does not split over ``ranks`` x
    ``grad_accum`` micro-batches. The ranks check this too (reference_train
    split_batch), but only after a launch on every host, and then every rank
    dies with the same error; the number of ranks is known here before that."""
    unit = ranks * cfg.grad_accum
    rest = cfg.global_batch % unit
    if not rest:
        return
    over = f"{ranks} ranks" if cfg.grad_accum == 1 else \
        f"{ranks} ranks x grad_accum {cfg.grad_accum} = {unit} micro-batches"
    below, above = cfg.global_batch - rest, cfg.global_batch - rest + unit
    choices = f"{below} or {above}" if below else f"{above}"
    divisors = [n for n in range(1, cfg.global_batch + 1)
                if cfg.global_batch % (n * cfg.grad_accum) == 0]
    raise InputError(
        f"global_batch {cfg.global_batch} does not split over {over} "
        f"({cfg.global_batch} % {unit} = {rest}): use --global_batch {choices}",
        f"pass it to the trainer after '--' (e.g. -- --global_batch {above}) or set it in the "
        f"config; or run on a number of ranks it splits over: "
        f"{', '.join(map(str, divisors[:8]))}{', ...' if len(divisors) > 8 else ''}")


def check_out_here(out: str) -> None:
    """For ranks on this machine: rank 0 writes the run to the trainer's
    ``--out``, so it must be a directory here or creatable here (checked by
    creating and removing a directory beside where it will be made)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise InputError(f"trainer --out {out} exists and is not a directory",
                         "give --out a directory path (new or existing), e.g. -- --out runs/mine")
    base = path
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise InputError(f"trainer --out {out} cannot be created: {base} is not a directory",
                         "give --out a path under a directory, e.g. -- --out runs/mine")
    try:
        probe = tempfile.mkdtemp(prefix=".mlxcluster-out-probe.", dir=base)
    except OSError as err:
        raise InputError(f"trainer --out {out} cannot be created: {err.strerror} in {base}",
                         "give --out a path in a directory you can write to") from None
    os.rmdir(probe)


def trainer_out(program: Sequence[str]) -> str | None:
    """The trainer's --out in ``program`` (its arguments), the last one given
    (argparse's rule), or None when it gives none."""
    found = None
    for i, arg in enumerate(program):
        if arg == "--out" and i + 1 < len(program):
            found = program[i + 1]
        elif arg.startswith("--out="):
            found = arg[len("--out="):]
    return found


def same_run(jobs: Sequence[RunningJob], out: str) -> RunningJob | None:
    """The running job that trains into ``out`` (the trainer's --out), if
    any: the same path as given, or the same absolute path from here (ranks
    start in the directory mlxcluster runs in)."""
    wanted = {os.path.normpath(out), os.path.abspath(out)}
    for job in jobs:
        for rank in job.ranks:
            theirs = trainer_out(rank.command.split())
            if theirs and {os.path.normpath(theirs), os.path.abspath(theirs)} & wanted:
                return job
    return None


def check_not_running(job: Job, out: str, env: dict[str, str]) -> None:
    """InputError when a job training into ``out`` still runs on the hosts:
    a second copy would write the same checkpoints (seen, issue 39: orphans
    of a killed controller and a relaunch). One ssh call per host."""
    from mlxcluster.jobs.running import list_running  # a train-only chore

    jobs, _ = list_running(job.hosts, env)
    running = same_run(jobs, out)
    if running is None:
        return
    since = f" since {running.started:%Y-%m-%d %H:%M:%S}" if running.started else ""
    raise InputError(
        f"run {running.run_id} still trains into --out {out} ({len(running.ranks)} rank(s) on "
        f"{', '.join(running.hosts)}{since}): a second launch would write the same checkpoints",
        f"stop it with 'mlxcluster stop {running.run_id}' (a last checkpoint first; then "
        f"'-- --resume auto' goes on from it), or give another --out")


class TrainerRun:
    """A training run across its launches: its record kept here, at --out
    (the ranks print their records; rank 0's Mac may be lost), and what a
    restart or a lost host changes in the trainer's arguments."""

    def __init__(self, args: TrainerArgs, ranks: int, env: dict[str, str] | None = None,
                 facts: Callable[[Job], dict[str, HostFacts | None]] | None = None,
                 on_stage_files: OnEvent | None = None):
        self.args = args
        self.env = env  # how the hosts are reached, to bring their outputs here
        self.ranks = ranks
        # set when each host holds only its stages' weight files (training_request):
        # after a re-split, the hosts left are sent their new blocks' files, said there
        self.on_stage_files = on_stage_files
        self.resplit_files = False  # a re-split's files still to send (resume sends them)
        # the hosts' memory facts, asked again when a pipeline re-splits over fewer
        self.facts = facts or self._probe_facts
        self.record = RunRecord(args.config.out)
        # what each rank holds now: a smaller world never gets more per rank
        self.micro_batch = args.config.global_batch // (ranks * args.config.grad_accum)

    def job(self, job: Job) -> Job:
        return trainer_job(job, self.args)

    def resume(self, job: Job, k: int) -> tuple[Job, list[str]]:
        """Restart ``k``'s job: from the newest checkpoint every host has
        before the first step the record lacks (launch/record.py)."""
        cfg = self.args.config
        bound = self.record.resume_bound(cfg.log_every, cfg.eval_every)
        flags = {"resume": "auto"} if k == 1 else {}
        self.args = self.args.with_flags(**flags, resume_before=bound)
        self.send_stage_files(job)
        return self.job(job), [f"resuming from the newest checkpoint every host has before step "
                               f"{bound} (the steps after it are not all in the record yet)"]

    def drop(self, job: Job, dropping: list[Dropped]) -> tuple[Job, list[str]]:
        """The job without ``dropping``'s hosts, the global batch kept
        (grad_accum raised where the rest cannot hold it otherwise)."""
        job = without_hosts(job, {d.host for d in dropping})
        if self.args.pipeline.on:
            return self.resplit(job, dropping)
        ranks, cfg = len(job.hosts), self.args.config
        new_accum = accumulation_for(cfg.global_batch, ranks, self.micro_batch)
        notes = []
        for d in dropping:
            self.record.add({"event": "host_dropped", "host": d.host, "reason": d.reason,
                             "ranks": ranks, "grad_accum": new_accum})
            notes.append(f"dropped {d.host} ({d.reason}): going on with {ranks} rank(s) on "
                         f"{', '.join(dict.fromkeys(h.name for h in job.hosts))}")
        if new_accum != cfg.grad_accum:
            notes.append(f"grad_accum {cfg.grad_accum} -> {new_accum}: the global batch stays "
                         f"{cfg.global_batch} = {ranks} ranks x {new_accum} accum x "
                         f"{cfg.global_batch // (ranks * new_accum)}")
            self.args = self.args.with_flags(grad_accum=new_accum)
        return self.job(job), notes

    def resplit(self, job: Job, dropping: list[Dropped]) -> tuple[Job, list[str]]:
        """A pipeline without ``dropping``'s hosts: its stages re-split over the
        hosts left (pipeline_launch.resplit; the trainer re-cuts the checkpoints),
        or the run stopped naming why."""
        before, dropped = self.args.pipeline, [d.host for d in dropping]
        cfg = self.args.config_here
        done = resplit(cfg, before, self.ranks, job, dropped, self.facts(job), model_sizes(cfg))
        after = done.pipeline
        flags: dict[str, object] = {"pipeline": after.stages}
        if after.split is not None:
            flags["pipeline_split"] = ",".join(map(str, after.split))
        self.args = self.args.with_flags(**flags)
        self.ranks = len(job.hosts)
        hosts = ", ".join(dict.fromkeys(h.name for h in job.hosts))
        notes = []
        for d in dropping:
            self.record.add({"event": "host_dropped", "host": d.host, "reason": d.reason,
                             "ranks": self.ranks, "pipeline": after.stages})
            notes.append(f"dropped {d.host} ({d.reason}): going on with --pipeline "
                         f"{after.stages} on {hosts}"
                         + (f", --pipeline_split {flags['pipeline_split']}"
                            if "pipeline_split" in flags else " (balanced by bytes)"))
        notes += [f"pipeline: {line}" for line in done.lines]
        self.resplit_files = self.on_stage_files is not None
        return self.job(job), notes

    def send_stage_files(self, job: Job) -> None:
        """After a re-split, before the launch on the hosts left: each is sent
        the weight files of its new stages it lacks (launch/sync.py: a host's
        copy checked, only what is missing sent, verified on arrival)."""
        if not self.resplit_files or self.on_stage_files is None:
            return
        from mlxcluster.launch.sync import sync_model  # a re-split's chore

        self.resplit_files = False
        cfg = self.args.config
        sync_model(job, cfg.init_from, self.env or {}, self.on_stage_files,
                   left_out=stage_files_left_out(job, cfg, self.args.pipeline, cfg.init_from))

    def _probe_facts(self, job: Job) -> dict[str, HostFacts | None]:
        from mlxcluster.jobs.preflight import probe_facts  # a pipeline-only chore

        return probe_facts(job, self.env)

    def noted(self, on_event: OnEvent) -> OnEvent:
        """``on_event``, with each restart kept in the record first."""
        def emit(event: object) -> None:
            if isinstance(event, Restarting):
                self.record.add({"event": "restart", "restart": event.done,
                                 "max_restarts": event.max_restarts, "cause": event.cause})
            on_event(event)
        return emit

    def bring_adapters(self, job: Job, env: dict[str, str]) -> list[Note | Warned]:
        """LoRA's or DoRA's OUT/adapters here: from the record, or, when its lines did not arrive
        whole (launch/fetch.py says why), read from the first host of ``job`` that has
        them (rank 0's first)."""
        cfg = self.args.config
        if not trains_adapters(cfg.fine_tune) or all(
                self.record.arrived(f"adapters/{name}") for name in ADAPTER_FILES):
            return []  # both: a cut line may lose adapter_config.json alone (a piece of its own)
        tried = []
        for host in dict.fromkeys(h for h in job.hosts if not h.is_local):
            try:
                files = fetch_folder(host, Path(cfg.out) / "adapters", env)
            except (OSError, subprocess.SubprocessError) as err:
                tried.append(f"{host.name}: {err}")
                continue
            self.record.fetched("adapters", files, host.name)
            return [Note(f"adapters: the record's copy did not arrive whole; read "
                         f"{len(files)} file(s) from {host.name} into {Path(cfg.out) / 'adapters'}")]
        if not tried:  # every rank ran here: the trainer wrote them in place
            return []
        return [Warned(f"the adapters did not arrive here, and no host gave them "
                       f"({'; '.join(tried)}): every host that ran to the end has its copy at "
                       f"{Path(cfg.out) / 'adapters'}")]

    def bring_model(self, job: Job) -> list[Note | Warned]:
        """A pipeline's full fine-tune: OUT/model here, whole. Each stage wrote
        its shard on its own host, rank 0 the config, index and tokenizer
        (reference_train/pipeline_outputs.py); each host of the first copy of
        the pipeline gives its files (launch/fetch.py), then the index says
        whether every shard is here."""
        cfg, pipeline = self.args.config, self.args.pipeline
        if not pipeline.on or trains_adapters(cfg.fine_tune):
            return []
        folder = Path(cfg.out) / "model"
        first_copy = job.hosts[:pipeline.stages]
        tried, brought = [], []
        for host in dict.fromkeys(h for h in first_copy if not h.is_local):
            try:
                files = fetch_folder(host, folder, env=self.env)
            except (OSError, subprocess.SubprocessError) as err:
                tried.append(f"{host.name}: {err}")
                continue
            brought.append(f"{len(files)} file(s) from {host.name}")
        missing = missing_shards(folder)
        if missing is None and not brought:  # every stage ran here: written in place
            return []
        if missing == []:
            return [Note(f"model: the stages' shards gathered into {folder} here "
                         f"({', '.join(brought) or 'written here'})")]
        where = ", ".join(dict.fromkeys(h.name for h in first_copy))
        lacking = "no model.safetensors.index.json" if missing is None else \
            f"{', '.join(missing)} missing"
        return [Warned(f"{folder} here is not whole ({lacking}"
                       f"{'; ' + '; '.join(tried) if tried else ''}): each stage's host keeps "
                       f"its shard at {folder} ({where})")]

    def close(self) -> list[Note | Warned]:
        return close_record(self.record)


def missing_shards(folder: Path) -> list[str] | None:
    """The shard files ``folder``'s model.safetensors.index.json names that are
    not in it ([] when whole); None without a readable index."""
    try:
        weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return sorted({f for f in weight_map.values() if not (folder / f).is_file()})


def close_record(record: RunRecord) -> list[Note | Warned]:
    """Close the record and draw loss.png beside it, here (the trainer
    leaves it to us when we keep the record); returns what plotting said
    and what of the record did not arrive whole."""
    record.close()
    said: list[Note | Warned] = []
    if record.metrics.is_file():
        plotted = plot_metrics(record.metrics, record.out / "loss.png")
        if plotted:
            said.append(Note(plotted))
    if damage := record.damage():
        said.append(Warned(damage))
    return said


# How a training run's end is worded (launch/supervisor.py ``ending``): a stop
# asked for may come from the lease too, and every rank checkpoints first.
TRAIN_WORDS = Words("train", asked_by="mlxcluster stop, or the lease of the machine running "
                    "mlxcluster ran out",
                    stop_done="wrote its checkpoint at that step; go on with '-- --resume auto'")


def run_trainer(job: Job, args: TrainerArgs, restarts: Restarts, env: dict[str, str], *,
                timeout: float | None, stall_timeout: float | str | None,
                on_line, on_event: OnEvent, run_id: str | None = None,
                stage_files: bool = False) -> JobResult:
    """Run the trainer on ``job``'s ranks until it ends well or the restarts
    are spent (launch/supervisor.py ``supervise``), with the record kept at
    --out here. ``on_line(stream, line)`` gets the job's lines (record lines
    kept out), ``on_event`` every step. ``stage_files``: each host was sent
    only its stages' weight files (the request's ``model_files``); a re-split
    sends the hosts left their new stages' files before the relaunch."""
    run_id = run_id or new_run_id(TRAIN_PREFIX)
    run = TrainerRun(args, len(job.hosts), env,
                     on_stage_files=on_event if stage_files else None)

    def show(stream: str, line: str) -> None:
        shown = run.record.feed(line)
        if shown is not None:
            on_line(stream, shown)

    def launch_one(job: Job, k: int, say) -> RunOutcome:
        run.record.start_launch(say(job, program_command(job)))
        outcome = run_job(job, show, env=env, timeout=timeout, stall_timeout=stall_timeout,
                          run_id=run_id, report_dir=Path(args.config.out))
        if outcome.exit_code and run.record.stopped_at is not None:  # asked: not restarted
            outcome = dataclasses.replace(outcome, asked_to_stop=True)
        return outcome

    words = dataclasses.replace(TRAIN_WORDS, record=args.config.out)
    try:
        result = supervise(run.job(job), launch_one, restarts, env, run_id=run_id, words=words,
                           on_event=run.noted(on_event), again=run.resume, drop=run.drop)
        if result.outcome.exit_code == 0 and not result.interrupted:
            for said in [*run.bring_adapters(result.job, env), *run.bring_model(result.job)]:
                on_event(said)
    finally:
        for said in run.close():
            on_event(said)
    return dataclasses.replace(result, stopped_at=run.record.stopped_at)
