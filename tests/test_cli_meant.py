"""The command line says what you meant (issue 46): mlxcluster's options are
its own wherever they stand before `--` (before or after MODEL_DIR), only
what follows `--` goes to the program, and a mistyped flag or command is
refused by mlxcluster with "did you mean", exit 2, nothing launched."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main as cli


def refused(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "launching" not in result.output
    lines = result.output.strip().splitlines()
    assert any(line.startswith("error: ") for line in lines), result.output
    assert lines[-1].startswith("fix: "), result.output
    return result.output


@pytest.mark.parametrize("args, said", [
    (["serve", "MODEL", "--prot", "8080", "--local", "2"],
     "error: No such option '--prot'. Did you mean '--port'?"),
    (["serve", "--pipline", "MODEL"], "error: No such option '--pipline'. Did you mean '--pipeline'?"),
    (["train", "--max-restart", "2"], "error: No such option '--max-restart'. Did you mean "
                                      "'--max-restarts'?"),
    (["run", "--max-restart", "2", "--", "python", "x.py"],
     "error: No such option '--max-restart'. Did you mean '--max-restarts'?"),
    (["train", "--local", "2", "--resume", "--", "--steps", "2"],
     "error: --resume is the trainer's option, not mlxcluster's"),
    (["train", "--local", "2", "--stpes", "2"],
     "error: No such option '--stpes'. Did you mean the trainer's '--steps' (after '--')?"),
    (["doctr"], "error: No such command 'doctr'. Did you mean 'doctor'?"),
    (["doctor", "--invnetory", "x.yaml"], "error: No such option '--invnetory'. Did you mean "
                                         "'--inventory'?"),
    # --timeout bounds a whole run (train, run); smoke's and tune's deadline is per phase
    (["smoke", "--local", "--timeout", "60"], "error: No such option '--timeout'. Did you mean "
                                              "'--phase-timeout'?"),
    (["tune", "--timeout", "2m"], "error: No such option '--timeout'. Did you mean '--phase-timeout'?"),
])
def test_a_mistyped_flag_or_command_is_refused_with_what_was_meant(args, said):
    out = refused(*args)
    assert said in out


@pytest.mark.parametrize("args, program", [
    (["serve", "MODEL", "extra"], "mlx_lm.server"),
    (["run", "--local", "2", "python", "x.py"], "the program"),
])
def test_program_arguments_before_dash_dash_are_refused_naming_where_they_go(args, program):
    out = refused(*args)
    assert "Got unexpected extra argument" in out
    assert f"fix: arguments for {program} go after '--'" in out


def test_serve_options_after_the_model_are_serve_s(monkeypatch, llama, tmp_path):
    """`serve MODEL -i cluster.yaml --port N`, typed as `vllm serve MODEL
    --port N` is: serve's own options, not mlx_lm.server's (what follows `--`
    is)."""
    import mlxcluster.serve.session as serve_session

    seen = {}

    class Stop(Exception):
        pass

    def front(bind, port, backend, **kw):
        seen.update(bind=bind, port=port, **kw)
        raise Stop

    monkeypatch.setattr(serve_session, "Front", front)
    result = CliRunner().invoke(cli, ["serve", str(llama), "--local", "2", "--port", "9123",
                                      "--request-timeout", "2m", "--", "--max-tokens", "64"])
    assert isinstance(result.exception, Stop), result.output
    assert seen == {"bind": "127.0.0.1", "port": 9123, "request_timeout": 120.0,
                    "server_args": ("--max-tokens", "64"), "api_key": None}


def test_a_model_folder_that_does_not_exist_says_so(tmp_path):
    out = refused("serve", "--local", "2", str(tmp_path / "no-such-model"))
    assert f"error: {tmp_path / 'no-such-model'} does not exist" in out


@pytest.mark.parametrize("flags, said", [
    (["--steps", "abc"], "--steps abc: not a whole number"),
    (["--lr", "x"], "--lr x: not a number"),
    (["--dtype", "foo"], "dtype foo: must be one of float32, bfloat16"),
])
def test_an_invalid_trainer_value_names_its_flag_and_what_it_takes(flags, said):
    out = refused("train", "--local", "2", "--", *flags)
    assert said in out


def test_a_misspelled_field_is_answered_with_the_one_meant(tmp_path):
    from reference_train.config import build_config

    bad = tmp_path / "run.yaml"
    bad.write_text("stpes: 3\nlr: 0.001\n")
    with pytest.raises(ValueError, match=r"unknown fields \['stpes'\] \(did you mean: stpes -> "
                                         r"steps\?\)"):
        build_config(["--config", str(bad)])
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("cluster: x\npython: /usr/bin/python3\nhosts:\n  - name: a\n    sshh: b\n")
    out = refused("doctor", "-i", str(inventory))
    assert f"{inventory.name}:5: hosts[0]: unknown field 'sshh'; did you mean 'ssh'?" in out


def test_serve_open_to_other_machines_without_a_key_is_refused(llama):
    out = refused("serve", str(llama), "--local", "2", "--bind", "0.0.0.0")
    assert "error: --bind 0.0.0.0 lets other machines reach the model, and no API key is set" in out
    assert "--no-auth" in out


def test_help_lists_the_commands_in_start_here_order_each_with_an_example_that_parses():
    """``mlxcluster --help`` lists the commands in the order a newcomer uses
    them; each command's --help ends with an example whose options are that
    command's own (the trainer's, after ``--``, are the trainer's)."""
    import shlex

    import click

    from mlxcluster.cli import COMMAND_MODULES, EXAMPLES

    top = CliRunner().invoke(cli, ["--help"])
    listed = [line.split()[0] for line in top.output.split("Commands:\n", 1)[1].splitlines() if line.strip()]
    assert listed == list(COMMAND_MODULES) and listed[:2] == ["discover", "doctor"]
    assert set(EXAMPLES) == set(COMMAND_MODULES)
    ctx = click.Context(cli)
    for name in COMMAND_MODULES:
        shown = CliRunner().invoke(cli, [name, "--help"]).output
        assert "Example:" in shown and EXAMPLES[name].split("  (")[0] in shown, name
        words = shlex.split(EXAMPLES[name].split("  (")[0])
        assert words[:2] == ["mlxcluster", name]
        command = cli.get_command(ctx, name)
        words = words[2:]
        if isinstance(command, click.Group):  # hostfile generate ...
            command, words = command.get_command(ctx, words[0]), words[1:]
        ours = words[:words.index("--")] if "--" in words else words
        known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        flags = [w for w in ours if w.startswith("-")]
        assert set(flags) <= known, (name, set(flags) - known)


@pytest.mark.parametrize(("args", "runs_ranks", "read"), [
    (["--local", "3", "--backend", "ring"], True, ["--local", "3", "--backend", "ring"]),
    (["--local", "--backend", "ring"], True, ["--local", "2", "--backend", "ring"]),
    (["--local", "models/x", "--port", "9"], True, ["--local", "2", "models/x", "--port", "9"]),
    (["--local=4", "--", "--local", "7"], True, ["--local", "4", "--", "--local", "7"]),
    (["mlxtrain-ab", "--local", "2"], False, ["mlxtrain-ab", "--local"]),
    (["--local", "mlxtrain-ab"], False, ["--local", "mlxtrain-ab"]),
    (["--local=2", "-v"], False, ["--local", "-v"]),
])
def test_local_means_this_machine_on_every_command_with_or_without_n(args, runs_ranks, read):
    from mlxcluster.cli.params import local_spelled_one_way

    assert local_spelled_one_way(args, runs_ranks=runs_ranks) == read


def test_attach_and_stop_take_the_local_n_a_job_was_started_with():
    """`attach RUN --local 2`, as stop's own hint spells it, looks on this
    machine (was: click's "Got unexpected extra argument (2)")."""
    for command in (["attach", "mlxtrain-0123456789", "--local", "2"],
                    ["stop", "--local", "2", "mlxtrain-0123456789"],
                    ["jobs", "--local", "2"]):
        result = CliRunner().invoke(cli, command)
        assert "unexpected extra argument" not in result.output, result.output
        assert "local-0" in result.output, result.output  # looked on this machine
