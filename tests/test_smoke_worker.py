"""The worker's checks: a wrong element anywhere is reported with its op,
size, dtype, rank and index. Runs the real check code on real mlx (a group
of one); send/recv needs a peer, so there a fake pair stands in for it."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from mlxcluster.smoke import worker


@pytest.fixture(scope="module")
def group():
    return mx.distributed.init()  # the singleton group: no launcher needed


def test_first_mismatch():
    assert worker.first_mismatch(np.ones(5), np.ones(5)) is None
    got = np.ones(5)
    got[3] = 2
    assert worker.first_mismatch(got, np.ones(5)) == 3
    assert worker.first_mismatch(np.ones(4), np.ones(5)) == 4  # a missing element


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32"])
def test_checks_pass_on_a_real_group(group, dtype):
    c = worker.Collectives(group)
    for count in (1, 1001):
        assert worker.check_all_sum(c, dtype, count)["ok"]
        assert worker.check_all_gather(c, dtype, count)["ok"]


@pytest.mark.parametrize("op", ["all_sum", "all_gather"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_one_wrong_element_is_reported(group, op, dtype):
    c = worker.Corrupting(group, index=517)
    check = worker.check_all_sum if op == "all_sum" else worker.check_all_gather
    result = check(c, dtype, 1001)
    itemsize = worker.DTYPES[dtype].size
    assert result == {**result, "ok": False, "op": op, "dtype": dtype, "size": 1001,
                      "bytes": 1001 * itemsize, "rank": 0, "bad_index": 517}
    assert result["got"] == result["expected"] + 1


class FakePair(worker.Collectives):
    """Rank ``rank`` of a 2-rank group whose peer sends the tagged payload,
    with element ``bad`` off by one (a unit fake: no second process)."""

    def __init__(self, rank: int, bad: int | None):
        self.rank, self.size, self.bad, self.sent = rank, 2, bad, []

    def send(self, x, dst):
        self.sent.append(dst)

    def recv(self, shape, dtype, src):
        payload = worker.tagged(src, self.size, shape[0])
        if self.bad is not None:
            payload[self.bad] += 1
        return mx.array(payload).astype(dtype)


def test_send_recv_reports_the_peer_and_index():
    fake = FakePair(rank=1, bad=6)
    results = worker.check_send_recv(fake, "float16", 7)
    assert [r["peer"] for r in results] == [0, 0]  # both directions with the one neighbour
    assert fake.sent == [0, 0]
    assert all(not r["ok"] and r["bad_index"] == 6 and r["op"] == "send_recv"
               and r["dtype"] == "float16" and r["rank"] == 1 for r in results)
    assert all(r["ok"] for r in worker.check_send_recv(FakePair(rank=0, bad=None), "int32", 7))


def test_exchange_order_cannot_deadlock():
    """Even ranks send first, odd ranks receive first."""
    calls = []

    class Recorder(FakePair):
        def send(self, x, dst):
            calls.append((self.rank, "send"))

        def recv(self, shape, dtype, src):
            calls.append((self.rank, "recv"))
            return super().recv(shape, dtype, src)

    for rank in (0, 1):
        worker.exchange(Recorder(rank, None), mx.ones((2,)), 1 - rank, 1 - rank)
    assert calls == [(0, "send"), (0, "recv"), (1, "recv"), (1, "send")]


def test_correctness_sizes_cover_one_odd_and_big():
    for n in (2, 3, 4):
        counts = worker.correctness_counts(n, 1024, 9 << 20, 4)
        assert counts[0] == 1
        assert any(c % n for c in counts[1:-1]), counts  # a size n does not divide
        assert counts[-1] * 4 > 8 << 20 and counts[-1] % n  # above 8 MiB, not divisible


def test_sweep_sizes_are_powers_of_two_within_range():
    assert worker.sweep_sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert worker.sweep_sizes(1000, 5000) == [1024, 2048, 4096]
    assert worker.sweep_sizes(4096, 4096) == [4096]


def test_protocol_line_is_one_prefixed_json_object(capsys):
    worker.emit("check", rank=2, op="all_sum", ok=True)
    out = capsys.readouterr().out
    assert out == 'MLXSMOKE {"event": "check", "rank": 2, "op": "all_sum", "ok": true}\n'


def test_silent_group_of_one_fails_loudly(capsys, monkeypatch, group):
    """MLX hands out its singleton group when a backend cannot start (seen
    with MPI when libmpi was not found); the worker must refuse it."""
    monkeypatch.setattr(worker.mx.distributed, "init", lambda **kwargs: group)
    code = worker.main(["--backend", "mpi", "--expect", "2", "--run-id", "mlxsmoke-test"])
    out = capsys.readouterr().out
    assert code == worker.EXIT_SETUP
    assert "group size is 1, expected 2 (backend mpi)" in out
    assert '"event": "ready"' not in out


def test_init_failure_is_reported(capsys):
    """strict init with no launcher around: an error event, not a crash."""
    code = worker.main(["--backend", "ring", "--expect", "2", "--run-id", "mlxsmoke-test"])
    out = capsys.readouterr().out
    assert code == worker.EXIT_SETUP
    assert '"event": "error"' in out and "init(ring) failed" in out


def test_ops_selects_the_collectives_checked(capsys, monkeypatch, group):
    """--ops all_sum (the train preflight's option set): only all_sum verdicts."""
    monkeypatch.setattr(worker.mx.distributed, "init", lambda **kwargs: group)
    code = worker.main(["--backend", "ring", "--expect", "1", "--run-id", "mlxsmoke-test",
                        "--ops", "all_sum", "--dtypes", "float32", "--sizes", "16:16"])
    events = [json.loads(ln.split(" ", 1)[1]) for ln in capsys.readouterr().out.splitlines()]
    checks = [e for e in events if e["event"] == "check"]
    assert code == 0
    assert checks and {e["op"] for e in checks} == {"all_sum"} and all(e["ok"] for e in checks)
    with pytest.raises(SystemExit):
        worker.parse_args(["--backend", "ring", "--expect", "2", "--run-id", "x", "--ops", "reduce"])
