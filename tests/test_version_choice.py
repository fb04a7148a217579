"""The one rule every version fix chooses X with (mlx, mlx-lm, the trainer's
packages: ``mlxcluster/doctor/fixes/version_choice.py``): the version asked
for, else the most hosts', a tie to this machine's when it is one of the
tied, else to the newest of them; no host having one: this machine's. Each
fix is shown to use it in its own tests (test_fix_mlx_version.py,
test_fix_mlx_lm_version.py, test_fix_trainer_deps.py); two Macs on two
versions, end to end: tests/lab/test_two_macs_lab.py."""

from __future__ import annotations

import pytest

from mlxcluster.doctor.fixes.version_choice import Choice, choose_version, newest


def test_the_version_most_hosts_have_wins_whatever_this_machine_has():
    assert choose_version("mlx", {"a": "0.32.4", "b": "0.32.3", "c": "0.32.4"}, here="0.32.3") == \
        Choice("0.32.4", "on 2 of 3 hosts")


def test_two_macs_on_two_versions_go_to_this_machines_when_it_is_one_of_them():
    for here in ("0.32.3", "0.32.4"):  # the older one too: this machine's is what the user runs
        choice = choose_version("mlx", {"mac1": "0.32.4", "mac2": "0.32.3"}, here=here)
        assert choice == Choice(here, "this machine's version (a tie: 1 host each)")
    assert choice.said("mlx") == "mlx 0.32.4: this machine's version (a tie: 1 host each)"


def test_a_tie_without_this_machines_version_goes_to_the_newest_of_the_tied():
    versions = {"a": "0.9.0", "b": "0.10.1", "c": "0.10.1", "d": "0.9.0", "e": "0.11.0"}
    # 0.10.1 is newer than 0.9.0 as a version, not as text; 0.11.0 is not tied
    assert choose_version("mlx-lm", versions, here="0.11.0") == Choice("0.10.1", "the newest (a tie: 2 hosts each)")
    assert choose_version("mlx-lm", versions, here=None).version == "0.10.1"
    assert choose_version("mlx-lm", {"a": "0.31.3", "b": "0.30.0"}, here=None) == \
        Choice("0.31.3", "the newest (a tie: 1 host each)")


def test_hosts_without_it_are_not_a_version():
    # one Mac with it, one without: no tie, the one version there is
    assert choose_version("mlx-lm", {"a": None, "b": "0.32.2"}, here="0.31.3") == Choice("0.32.2", "on 1 of 2 hosts")
    assert choose_version("mlx-lm", {"a": None, "b": "0.32.2", "c": "0.31.3"}, here="0.31.3").version == "0.31.3"


def test_no_host_having_it_gets_this_machines_else_nothing():
    assert choose_version("mlx-lm", {"a": None, "b": None}, here="0.32.2") == \
        Choice("0.32.2", "this machine's version (no host has mlx-lm)")
    nothing = choose_version("mlx-lm", {"a": None}, here=None)
    assert nothing == Choice(None, "no host has mlx-lm, nor has this machine")
    assert nothing.said("mlx-lm") == "no host has mlx-lm, nor has this machine"


@pytest.mark.parametrize("versions", [{"a": "0.32.3", "b": "0.32.4"}, {"a": "0.32.4", "b": "0.32.4", "c": "0.32.3"},
                                      {"a": None}])
def test_the_version_asked_for_wins_over_every_rule(versions):
    assert choose_version("mlx", versions, here="0.32.4", wanted="0.31.2", wanted_by="--mlx-version") == \
        Choice("0.31.2", "--mlx-version")


def test_newest_compares_numbers_not_text():
    assert newest(["0.9.9", "0.10.0", "0.2.0"]) == "0.10.0"
    assert newest(["2.4.6", "2.4.10"]) == "2.4.10"
