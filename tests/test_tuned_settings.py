"""The settings `mlxcluster tune` records beside a hostfile (HOSTFILE.args) as
smoke, train and run pick them up: parsing, precedence of the command line,
and the launch plans (argv) they end up in. The launch argv is built by the
real planning code; the lab test (tests/lab/test_tune_lab.py) shows the real
launchers using it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main as cli
from mlxcluster.errors import InputError
from mlxcluster.hostfile.hostfile_generate import generate_mpi
from mlxcluster.hostfile.tuned import Applied, apply_tuned, parse_tuned_args, read_tuned, tuned_job
from mlxcluster.jobs.hosts import hosts_from_hostfile
from mlxcluster.jobs.job import job_from_hostfile, split_mpi_args
from mlxcluster.jobs.plan import launcher_argv, write_hostfile
from mlxcluster.tune.candidates import Candidate
from tests.tune_support import TUNED_INVENTORY, write_tune_output


def test_parse_both_kinds_of_args_file():
    ring = parse_tuned_args("--connections-per-ip 2\n", "h.json.args")
    assert (ring.connections_per_ip, ring.tcp_links) == (2, None)
    assert parse_tuned_args("--connections-per-ip=4", "x").connections_per_ip == 4
    mpi = parse_tuned_args("-x MLX_MPI_LIBNAME=/a/libmpi.so --mca btl tcp,self --mca btl_tcp_links 8 "
                           "--mca btl_tcp_if_include 10.0.0.0/24\n", "h.txt.args")
    assert (mpi.connections_per_ip, mpi.tcp_links) == (None, 8)
    assert parse_tuned_args("# nothing tuned\n", "x") == parse_tuned_args("", "x")


@pytest.mark.parametrize("text, said", [
    ("--connections-per-ip", "has no value"),
    ("--connections-per-ip two", "'two' is not a whole number"),
    ("--mca btl_tcp_links 0", "'0' is not a whole number from 1 to 64"),
    ("--connections-per-ip 'unclosed", "cannot split"),
])
def test_a_bad_args_file_is_an_input_error_naming_it(text, said):
    with pytest.raises(InputError, match=said) as err:
        parse_tuned_args(text, "tuned.json.args")
    assert "tuned.json.args" in err.value.message and "mlxcluster tune" in err.value.hint


def test_tune_output_is_read_back_from_beside_the_hostfile(tmp_path):
    ring = write_tune_output(tmp_path, Candidate("ring", connections=4), "hostfile-ring.json")
    assert read_tuned(ring).connections_per_ip == 4
    mpi = write_tune_output(tmp_path, Candidate("mpi", tcp_links=2), "hostfile-mpi.txt")
    assert read_tuned(mpi).tcp_links == 2 and read_tuned(mpi).source == f"{mpi}.args"
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    assert read_tuned(plain) is None and read_tuned(None) is None


def test_command_line_beats_the_tuned_value_and_says_so():
    tuned = parse_tuned_args("--connections-per-ip 4", "h.args")
    picked = apply_tuned(tuned, "ring", None)
    assert picked.connections_per_ip == 4 and "from h.args" in picked.notes[0]
    given = apply_tuned(tuned, "ring", 1)
    assert given.connections_per_ip == 1 and "not the 4 of h.args" in given.notes[0]
    assert apply_tuned(tuned, "ring", 4).notes == ()  # the same value: nothing to say
    assert apply_tuned(None, "ring", None) == Applied(1, (), ())  # nothing recorded: the defaults

    links = parse_tuned_args("--mca btl_tcp_links 2", "m.args")
    picked = apply_tuned(links, "mpi", None, ("--mca btl_tcp_if_include eth0",))
    assert picked.mpi_args == ("--mca btl_tcp_links 2", "--mca btl_tcp_if_include eth0")
    mine = apply_tuned(links, "mpi", None, ("--mca btl_tcp_links 8",))
    assert mine.mpi_args == ("--mca btl_tcp_links 8",) and "not the 2 of m.args" in mine.notes[0]
    # A knob of the other backend is not applied.
    assert apply_tuned(links, "ring", None).notes == () and apply_tuned(tuned, "mpi", None).mpi_args == ()


def test_train_and_run_plan_carries_the_ring_setting(tmp_path):
    hostfile = write_tune_output(tmp_path, Candidate("ring", connections=2), "tuned.json")
    job, notes = tuned_job(job_from_hostfile(hostfile, None, "/py"), hostfile, None)
    argv = launcher_argv(job, write_hostfile(job, tmp_path), ["-m", "x"])
    assert argv[argv.index("--connections-per-ip") + 1] == "2"
    assert notes and f"{hostfile}.args" in notes[0]
    job, _ = tuned_job(job_from_hostfile(hostfile, None, "/py"), hostfile, 1)
    assert "--connections-per-ip" not in launcher_argv(job, write_hostfile(job, tmp_path), ["-m", "x"])


def test_train_and_run_take_tunes_mpi_hostfile_and_its_links(tmp_path):
    hostfile = write_tune_output(tmp_path, Candidate("mpi", tcp_links=2), "tuned-mpi.txt")
    job, notes = tuned_job(job_from_hostfile(hostfile, None, "/py"), hostfile, None)
    assert job.backend == "mpi" and [h.ip for h in job.hosts] == ["10.0.0.1", "10.0.0.2"]
    words = list(split_mpi_args(job))
    assert words[words.index("btl_tcp_links") + 1] == "2" and "btl_tcp_links 2" in notes[0]


def test_smoke_reads_an_mpi_hostfile(tmp_path):
    path = tmp_path / "h.txt"
    path.write_text(generate_mpi(TUNED_INVENTORY).hostfile)
    hosts, backend = hosts_from_hostfile(str(path), "/py")
    assert backend == "mpi" and [(h.ssh, h.ips) for h in hosts] == [("10.0.0.1", ("10.0.0.1",)),
                                                                   ("10.0.0.2", ("10.0.0.2",))]


def test_cli_reports_a_bad_args_file_without_traceback(tmp_path):
    hostfile = tmp_path / "h.json"
    hostfile.write_text(json.dumps({"backend": "ring", "hosts": [{"ssh": "a", "ips": ["10.9.0.1"]},
                                                                 {"ssh": "b", "ips": ["10.9.0.2"]}]}))
    Path(f"{hostfile}.args").write_text("--connections-per-ip lots\n")
    for command in (["run", "--hostfile", str(hostfile), "--no-preflight", "--", "python", "x.py"],
                    ["train", "--hostfile", str(hostfile), "--no-preflight", "--config", "tiny"],
                    ["smoke", "--hostfile", str(hostfile)]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 2, (command, result.output)
        assert "'lots' is not a whole number" in result.output and "Traceback" not in result.output
