"""The ``mlxcluster`` command line: parse, call the library, render.

Each command lives in its own module ``mlxcluster.cli.<name>`` exposing a
click command named ``command``; ``COMMAND_MODULES`` lists them, and a
module is imported only when its command is used (or for ``--help``).
Errors from the library (``MlxclusterError``) are converted here, once, into
a message on stderr and the documented exit code; no traceback is shown.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys

import click

from mlxcluster import __version__, interrupts
from mlxcluster.errors import Interrupted, MlxclusterError

# In the order a newcomer uses them (``mlxcluster --help`` lists them so).
COMMAND_MODULES: tuple[str, ...] = (
    "discover",
    "doctor",
    "topology",
    "hostfile",
    "smoke",
    "tune",
    "pull",
    "serve",
    "train",
    "run",
    "jobs",
    "attach",
    "stop",
    "report",
    "demo",
)

# One typical line per command, shown at the end of its --help.
EXAMPLES: dict[str, str] = {
    "discover": "mlxcluster discover --write cluster.yaml --python /opt/venv/bin/python",
    "doctor": "mlxcluster doctor            (then: mlxcluster doctor --fix)",
    "topology": "mlxcluster topology --png cables.png",
    "hostfile": "mlxcluster hostfile generate --backend ring -o hosts.json",
    "smoke": "mlxcluster smoke --backend ring --bench",
    "tune": "mlxcluster tune --budget 5m",
    "pull": "mlxcluster pull mlx-community/Qwen3-4B-4bit",
    "serve": "mlxcluster serve ~/models/Qwen3-4B-4bit --port 8080",
    "train": "mlxcluster train -- --init_from ~/models/Llama-3.2-1B-Instruct-4bit --fine_tune lora "
             "--data data/chat-tokens --out runs/lora",
    "run": "mlxcluster run -- python my_script.py --epochs 2",
    "jobs": "mlxcluster jobs -i cluster.yaml",
    "attach": "mlxcluster attach mlxtrain-1a2b3c4d5e",
    "stop": "mlxcluster stop mlxtrain-1a2b3c4d5e",
    "report": "mlxcluster report bug/ -o report.html",
    "demo": "mlxcluster demo",
}


class _Group(click.Group):
    """The command group: each command's module is imported when that command
    is asked for (``mlxcluster run`` does not import tune's, demo's or the
    report's modules: measured, importing every command took most of a
    short run's start-up, bench/run_overhead.py); ``--help`` imports them all."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMAND_MODULES, *sorted(set(self.commands) - set(COMMAND_MODULES))]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMAND_MODULES:
            command = importlib.import_module(f"mlxcluster.cli.{name}").command
            if name in EXAMPLES and not command.epilog:
                command.epilog = f"Example:\n\n\b\n  {EXAMPLES[name]}"
            self.add_command(command)
        return super().get_command(ctx, name)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1)
            if close:
                raise click.UsageError(f"No such command '{name}'. Did you mean '{close[0]}'?",
                                       ctx)
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context):
        try:
            with interrupts.signals_raise():
                return super().invoke(ctx)
        except MlxclusterError as err:
            report_error(err)
            ctx.exit(err.exit_code)
        except click.UsageError as err:  # a flag or value click refused: the same two lines
            report_usage_error(err)
            ctx.exit(err.exit_code)
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP (after any cleanup)
            _Group.interrupted = True
            ctx.exit(report_interrupt(stop))

    interrupted = False  # set once an interrupt was reported (see ``run``)


def report_error(err: MlxclusterError) -> None:
    """Render a library error as 'error: ...' plus 'fix: ...' on stderr."""
    click.secho(f"error: {err.message}", fg="red", err=True)
    if err.hint:
        click.echo(f"fix: {err.hint}", err=True)


def report_usage_error(err: click.UsageError) -> None:
    """Render click's refusal of the command line (an unknown option with its
    "did you mean", a bad value) as the library's errors are: 'error: ...'
    plus 'fix: ...' (the command's hint, else where its options are listed)."""
    click.secho(f"error: {err.format_message()}", fg="red", err=True)
    command = err.ctx.command_path if err.ctx is not None else "mlxcluster"
    click.echo(f"fix: {getattr(err, 'hint', None) or f'{command} --help lists its options'}",
               err=True)


def report_interrupt(stop: KeyboardInterrupt) -> int:
    """Say what was stopped; the exit code is 128 + the signal, as a shell's."""
    if isinstance(stop, Interrupted):
        click.secho(stop.message, fg="yellow", err=True)
        if stop.hint:
            click.echo(f"fix: {stop.hint}", err=True)
        return stop.exit_code
    signum = interrupts.signum_of(stop)
    click.secho(f"interrupted ({interrupts.signal_name(signum)})", fg="yellow", err=True)
    return 128 + signum


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mlxcluster")
def main() -> None:
    """Run one MLX job across several Macs: serve a model bigger than one
    Mac, fine-tune across them, and set up and check the cluster first.

    \b
    Start here (docs/quickstart.md):
      mlxcluster discover --write cluster.yaml --python /opt/venv/bin/python
      mlxcluster doctor --fix
      mlxcluster smoke --backend ring
      mlxcluster serve ~/models/MODEL
    """


def run() -> None:
    """The console script and ``python -m mlxcluster``: ``main``, except that
    after an interrupt the process exits at once instead of joining worker
    threads still blocked in an SSH connect or read (up to --connect-timeout
    or a command timeout). The run was already stopped and cleaned up; the
    exit closes those threads' sockets."""
    try:
        main()
    except SystemExit as done:
        if not _Group.interrupted:
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(done.code if isinstance(done.code, int) else 1)


if __name__ == "__main__":  # pragma: no cover
    run()
