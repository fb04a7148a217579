"""What `mlxcluster doctor`'s flags ask for, as one value built and checked
here (``doctor_request``), then run (``examine``: this machine, a replayed
capture folder or the live hosts). The CLI parses the flags into it and
renders what comes back.

Every flag combination doctor refuses, and every input it can check
without a host (the model folder, the hostfile, the --collect folder, the
--mlx-version asked for, the --imports names), is refused here: exit 2
before any host is probed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from mlxcluster.doctor.checks.software import check_imports
from mlxcluster.doctor.doctor import DoctorReport, replay_doctor, run_doctor, run_local_doctor
from mlxcluster.errors import InputError
from mlxcluster.facts.capture import prepare_capture_dir, read_capture_dir
from mlxcluster.fit.model_folder import read_model_folder
from mlxcluster.hostfile.hostfile import load_hostfile
from mlxcluster.inventory.inventory import Inventory, load_inventory
from mlxcluster.inventory.inventory_search import find_inventory


@dataclass(frozen=True)
class DoctorRequest:
    """`mlxcluster doctor`'s flags (docs/doctor.md), by their names."""

    inventory_path: str | None = None
    as_json: bool = False
    strict: bool = False
    collect_dir: str | None = None
    from_dir: str | None = None
    local: bool = False
    accept_new_host_keys: bool = False
    backend: str | None = None
    connect_timeout: float = 5.0
    no_data_path: bool = False
    hostfile: str | None = None
    verbose: bool = False
    fix: bool = False
    dry_run: bool = False
    yes: bool = False
    fix_timeout: float = 60.0
    mlx_version: str | None = None
    train_data: str | None = None
    imports: tuple[str, ...] = ()
    model: str | None = None
    pipeline: bool = False
    undo_path: str | None = None
    shared_path: str | None = None
    html_path: str | None = None
    # Not flags: whether a yes can be asked for (a terminal), and the modules
    # the ranks import besides the trainer's (--imports, --train-data's).
    can_ask: bool = False
    trainer_modules: tuple[str, ...] = field(default=())

    @property
    def mode(self) -> str:
        """What doctor does: "shared-path", "undo", "fix", or a check of
        "local" (this machine), "replay" (--from) or "live" hosts."""
        if self.shared_path is not None:
            return "shared-path"
        if self.undo_path:
            return "undo"
        if self.fix:
            return "fix"
        return "local" if self.local else "replay" if self.from_dir else "live"


def doctor_request(data_modules: Callable[[str], tuple[str, ...]] = lambda data: (),
                   **flags) -> DoctorRequest:
    """The request of ``flags`` (``DoctorRequest``'s fields), checked:
    InputError (exit 2) for a combination doctor refuses or an input that
    is not good, before any host is probed. ``data_modules(DIR)``: what
    the ranks import for --train-data DIR (launch/trainer.py's, above this
    layer)."""
    request = DoctorRequest(**flags)
    r = request
    if r.shared_path is not None:
        others = {"--fix": r.fix, "--undo": bool(r.undo_path), "--from": bool(r.from_dir),
                  "--local": r.local, "--collect": bool(r.collect_dir), "--html": bool(r.html_path),
                  "--train-data": bool(r.train_data), "--imports": bool(r.imports),
                  "--model": bool(r.model)}
        given = [flag for flag, on in others.items() if on]
        if given:
            raise InputError(f"--shared-path asks the hosts one question; it excludes {', '.join(given)}",
                             "run doctor without --shared-path for the other checks")
        return request
    check_fix_flags(r)
    if r.undo_path:
        return request
    if r.from_dir and r.collect_dir:
        raise InputError("--from and --collect exclude each other",
                         "--collect saves a live run; --from replays a saved one")
    if r.local and (r.from_dir or r.inventory_path):
        raise InputError("--local checks this machine; it excludes -i and --from")
    for flag, given in (("--train-data", r.train_data), ("--imports", r.imports)):
        if given and (r.local or r.from_dir):
            raise InputError(f"{flag} goes with a live check of the inventory's hosts",
                             f"drop --local / --from, or {flag}")
    if r.pipeline and not r.model:
        raise InputError("--pipeline goes with --model", "mlxcluster doctor --model DIR --pipeline")
    if r.model and r.local:
        raise InputError("--model judges the inventory's hosts; --local has none",
                         "drop --local (serve --local N checks the split on this machine itself)")
    if r.model:
        read_model_folder(r.model)  # not a model folder: exit 2 before any host is probed
    modules = check_imports(r.imports)
    if r.train_data:
        modules = (*data_modules(r.train_data), *modules)
    if r.hostfile:
        load_hostfile(r.hostfile)
    if r.collect_dir:
        prepare_capture_dir(r.collect_dir)
    if r.mlx_version:
        from mlxcluster.doctor.fixes import mlx_version as mlx_version_fix

        mlx_version_fix.check_mlx_version(r.mlx_version)  # an unknown version: exit 2 here
    return replace(request, trainer_modules=modules)


def check_fix_flags(r: DoctorRequest) -> None:
    """Flag combinations --fix, --dry-run, --yes, --mlx-version and --undo
    refuse (exit 2, before any host is probed)."""
    others = {"--json": r.as_json, "--collect": bool(r.collect_dir), "--from": bool(r.from_dir),
              "--local": r.local,
              **({"--train-data": bool(r.train_data), "--imports": bool(r.imports),
                  "--model": bool(r.model)} if r.undo_path else {}),
              **({"-i": bool(r.inventory_path), "--hostfile": bool(r.hostfile),
                  "--html": bool(r.html_path)} if r.undo_path else {})}
    given = [name for name, on in others.items() if on]
    if r.undo_path:
        clash = [n for n, on in (("--fix", r.fix), ("--dry-run", r.dry_run), ("--yes", r.yes),
                                 ("--mlx-version", bool(r.mlx_version))) if on] + given
        if clash:
            raise InputError(f"--undo JOURNAL excludes {', '.join(clash)}",
                             "run 'mlxcluster doctor --undo JOURNAL' alone")
        return
    if r.mlx_version and not r.fix:
        raise InputError("--mlx-version goes with --fix", "mlxcluster doctor --fix --mlx-version X")
    if (r.dry_run or r.yes) and not r.fix:
        raise InputError(f"{'--dry-run' if r.dry_run else '--yes'} goes with --fix",
                         "mlxcluster doctor --fix --dry-run (the plan only) or --fix --yes (apply it)")
    if not r.fix:
        return
    if r.dry_run and r.yes:
        raise InputError("--dry-run and --yes exclude each other",
                         "--dry-run prints the plan only; --yes applies it without asking")
    if given:
        raise InputError(f"--fix excludes {', '.join(given)}",
                         "--fix works on live hosts and prints its plan; run doctor with those flags apart")
    if not r.dry_run and not r.yes and not r.can_ask:
        raise InputError("--fix asks before it changes anything, and there is no terminal to ask on",
                         "pass --yes to apply the plan without asking, or --dry-run to print it only")
    if not r.dry_run:
        from mlxcluster.doctor.fixes.journal import check_writable, fixes_dir

        check_writable(fixes_dir())


def check_options(r: DoctorRequest) -> dict:
    """The options a check of the hosts runs with (doctor --fix's checks too)."""
    return dict(backend=r.backend, connect_timeout=r.connect_timeout, data_path=not r.no_data_path,
                hostfile=r.hostfile, trainer_modules=r.trainer_modules, model=r.model,
                pipeline=r.pipeline)


def request_inventory(r: DoctorRequest, note: Callable[[str], None]) -> Inventory | None:
    """The inventory ``r`` runs on, loaded: -i, else the default one
    (inventory_search.py), named first through ``note`` (the CLI shows it on
    stderr, stdout stays clean for --json; before loading, so a default file
    that does not load is named too). A replay (--from) names its hosts by
    folder, so it uses one only when -i was given; --local and --undo use none."""
    if r.mode == "undo" or r.local:
        return None
    if r.from_dir:
        return load_inventory(r.inventory_path) if r.inventory_path else None
    others = "" if r.mode == "shared-path" else "--from DIR to replay captures, or --local"
    choice = find_inventory(r.inventory_path, other_sources=others)
    if not choice.given:
        note(choice.describe())
    return load_inventory(choice.path)


def examine(r: DoctorRequest, inventory) -> DoctorReport:
    """The check ``r`` asks for: this machine (--local), a capture folder
    replayed (--from; ``inventory`` only when -i was given) or the live
    hosts of ``inventory``."""
    if r.local:
        return run_local_doctor(backend=r.backend)
    if r.from_dir:
        folder = read_capture_dir(r.from_dir)
        report = replay_doctor(folder.captures, inventory=inventory, backend=r.backend,
                               hostfile=r.hostfile, model=r.model, pipeline=r.pipeline)
        report.extra["ignored"] = folder.ignored
        return report
    return run_doctor(inventory, accept_new_host_keys=r.accept_new_host_keys, **check_options(r))
