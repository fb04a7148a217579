"""tune's selection logic on injected measurements: clear wins, ties within
the noise, one noisy round, failed candidates, and the candidates tried."""

from __future__ import annotations

import pytest

from mlxcluster.errors import InputError
from mlxcluster.jobs.hosts import RankHost
from mlxcluster.tune.candidates import Candidate, make_candidates, parse_backends, parse_counts
from mlxcluster.tune.select import Sample, choose, deciding_size

M32 = 32 << 20
R1, R2, R4 = (Candidate("ring", connections=c) for c in (1, 2, 4))
MPI4 = Candidate("mpi", tcp_links=4)


def rounds(**busbw: list[float]) -> list[Sample]:
    """Samples at all_sum 32 MiB: ``r1=[...]`` gives ring x1's busbw per round."""
    names = {"r1": R1, "r2": R2, "r4": R4, "mpi4": MPI4}
    return [Sample(names[k], i, "all_sum", M32, bw, 1.0 / bw, 1.2 / bw)
            for k, values in busbw.items() for i, bw in enumerate(values)]


def test_a_clear_winner_has_its_margin_and_high_confidence():
    choice = choose(rounds(r1=[1.0, 1.02, 0.98, 1.0], r2=[1.5, 1.52, 1.49, 1.5],
                           r4=[1.2, 1.21, 1.19, 1.2]), "all_sum", M32)
    assert choice.winner == choice.best == R2
    assert choice.tied == (R2,) and choice.confidence == "high"
    assert [s.candidate for s in choice.scores] == [R2, R4, R1]
    closest = choice.runner_up
    assert closest.other == R4 and closest.margin == pytest.approx(0.25, abs=0.01)
    assert closest.wins == closest.rounds == 4


def test_a_difference_within_the_noise_is_a_tie_and_the_simplest_setting_wins():
    # ring x4 is 2% ahead in median: below the 3% floor, a tie; x1 is simpler.
    choice = choose(rounds(r1=[1.00, 1.01, 0.99], r4=[1.02, 1.03, 1.01]), "all_sum", M32)
    assert choice.best == R4 and choice.winner == R1
    assert set(choice.tied) == {R1, R4} and choice.confidence == "tie"
    assert choice.runner_up is None
    assert "tie within noise" in choice.versus[0].text()


def test_a_large_but_inconsistent_lead_is_a_tie():
    # x2 leads by 7.5% in median but loses two of four rounds: not a win.
    choice = choose(rounds(r1=[1.0, 1.0, 1.0, 1.0], r2=[1.3, 1.25, 0.9, 0.8]), "all_sum", M32)
    assert choice.best == R2 and choice.winner == R1 and set(choice.tied) == {R1, R2}


def test_one_noisy_round_does_not_change_the_winner():
    # Round 2 ran under load: everything slowed 3x, x4 most of all. Paired
    # by round, x4 still wins 4 of 5 rounds by a wide margin.
    choice = choose(rounds(r1=[1.0, 1.0, 0.33, 1.0, 1.0], r4=[1.5, 1.5, 0.3, 1.5, 1.5]),
                    "all_sum", M32)
    assert choice.winner == R4 and choice.confidence == "high"
    assert choice.versus[0].wins == 4 and choice.versus[0].rounds == 5


def test_noise_between_rounds_widens_the_tie():
    # Paired ratios 1.2, 0.95, 1.25, 0.9: median +7.5%, spread ~15%: a tie.
    choice = choose(rounds(r1=[1.0, 1.0, 1.0, 1.0], mpi4=[1.2, 0.95, 1.25, 0.9]), "all_sum", M32)
    assert choice.best == MPI4 and choice.winner == R1 and choice.confidence == "tie"


def test_one_round_gives_a_winner_with_low_confidence():
    choice = choose(rounds(r1=[1.0], r2=[2.0]), "all_sum", M32)
    assert choice.winner == R2 and choice.confidence == "low"  # no noise estimate from one round


def test_a_candidate_that_failed_never_wins():
    choice = choose(rounds(r1=[1.0, 1.0], r4=[3.0, 3.0]), "all_sum", M32,
                    failed={R4: "rank 1 on labhost2: hung"})
    assert choice.winner == R1 and [s.candidate for s in choice.scores] == [R1]
    assert choice.failed == {R4: "rank 1 on labhost2: hung"}
    assert choose(rounds(r1=[1.0]), "all_gather", M32) is None  # nothing measured there


def test_busbw_is_set_against_the_raw_tcp_of_as_many_streams():
    choice = choose(rounds(r1=[0.8, 0.9, 1.0], r2=[1.8, 1.9, 2.0]), "all_sum", M32,
                    tcp={R1: 1.0, R2: 2.0})
    assert [round(s.of_tcp, 3) for s in choice.scores] == [0.95, 0.9]
    assert choice.scores[0].p50_s == pytest.approx(1 / 1.9)


def test_the_overall_pick_is_made_at_32_mib_when_measured():
    assert deciding_size([1 << 20, M32, 64 << 20]) == M32
    assert deciding_size([1 << 20, 4 << 20]) == 4 << 20


def test_candidates_cover_every_knob_and_interfaces_when_hosts_have_several():
    one_ip = (RankHost("a", "a", ("10.0.0.1",), "/p"), RankHost("b", "b", ("10.0.0.2",), "/p"))
    labels = [c.label for c in make_candidates(("ring", "mpi"), one_ip)]
    assert labels == ["ring x1/ip", "ring x2/ip", "ring x4/ip",
                      "mpi links=1", "mpi links=2", "mpi links=4", "mpi links=8",
                      "mpi links=1 allreduce=ring", "mpi links=4 allreduce=ring"]
    two_ips = tuple(RankHost(h.name, h.ssh, (h.ips[0], h.ips[0].replace("10.0", "10.1")), "/p")
                    for h in one_ip)
    cands = make_candidates(("ring",), two_ips)
    assert [c.label for c in cands][-2:] == ["ring x1/ip ip#1", "ring x1/ip ip#2"]
    assert cands[-1].hosts(two_ips)[1].ips == ("10.1.0.2",)
    assert Candidate("ring", connections=2).streams(n_ips=2) == 4  # per IP, every IP
    assert Candidate("mpi", tcp_links=8).streams() == 8


def test_only_tcp_backends_can_be_tuned():
    assert parse_backends("ring, mpi,ring") == ("ring", "mpi")
    with pytest.raises(InputError, match="jaccl"):
        parse_backends("ring,jaccl")
    assert parse_counts("1, 4,1", "--connections") == (1, 4)
    for bad in ("", "0", "x", "65"):
        with pytest.raises(InputError, match="--connections"):
            parse_counts(bad, "--connections")
