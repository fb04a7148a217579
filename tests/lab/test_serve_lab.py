"""`mlxcluster serve` on the lab, every host on its own disk and the model
folder only on this machine: the model is sent to both hosts; the chat
answer at 127.0.0.1:PORT here is one process's greedy answer; rank 1 hung
(SIGSTOP) and then rank 0 killed are each named with their host, every rank
stopped, the server launched again and the same address answers again;
openai's and anthropic's clients, a tool call included; SIGTERM while two
answers stream drains them whole and leaves nothing on any host."""

from __future__ import annotations

import hashlib
import re
import signal
import uuid

import pytest

from mlxcluster.jobs.plan import free_port_block
from mlxcluster.jobs.rank_wrapper import STACKS_ROOT
from tests.lab.jobs import assert_nothing_left, training_setup
from tests.serve_support import (
    Serving,
    chat,
    chat_model,
    chat_text,
    generated_alone,
    official_clients_agree,
    stream_two_long_answers,
    tool_chat_model,
)
from tests.waits import (
    SERVE_AGAIN_S,
    SERVE_PROBE_EVERY_S,
    SERVE_PROBE_TIMEOUT_S,
    SERVE_UP_S,
)

pytestmark = pytest.mark.lab


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rank_pid(lab, host, run_id: str, rank: int) -> int:
    """The pid of ``rank`` of the run, read on its host as a user would (the
    rank wrapper's pid file there)."""
    words = lab.ssh(host, f"cat {STACKS_ROOT}/{run_id}/rank{rank}.pid").stdout.split()
    assert words and words[1] == host.name, words
    return int(words[0])


def test_serve_over_two_hosts_answers_survives_a_hang_and_a_kill(lab3, llama, tmp_path):
    lab = lab3
    two = lab.hosts[:2]
    model = tool_chat_model(llama, lab.disk / f"tiny-chat-{uuid.uuid4().hex[:8]}")  # here only
    for h in two:
        assert not lab.host_exists(h, model / "config.json")
    _, env = training_setup(lab, tmp_path)
    inventory = lab.write_inventory(tmp_path / "two.yaml", hosts=list(two))
    port = free_port_block(1)
    serving = Serving(["-i", str(inventory), "--backend", "ring", "--no-preflight", "--port", str(port),
                       "--max-in-flight", "2", "--drain-timeout", f"{SERVE_AGAIN_S}s",
                       "--probe-every", f"{SERVE_PROBE_EVERY_S}s",
                       "--probe-timeout", f"{SERVE_PROBE_TIMEOUT_S}s", str(model)],
                      env=env, cwd=tmp_path)
    run_id = None
    try:
        up = serving.wait_for(r"serving (\S+) at (http://\S+) \((\d) ranks, (\w+)\)$", SERVE_UP_S)
        assert up.groups() == (model.name, f"http://127.0.0.1:{port}/v1", "2", "tensor")
        run_id = re.search(r"run (mlxserve-[0-9a-f]+)", serving.output()).group(1)
        for h in two:  # sent to each host's own disk, every file whole
            there = lab.host_disk(h) / model.relative_to(lab.disk)
            assert sha256(there / "model.safetensors") == sha256(model / "model.safetensors")
        alone = generated_alone(model)
        assert alone and chat_text(port) == alone
        official_clients_agree(port, alone, str(model))  # openai's and anthropic's own, tools too

        # Rank 1 hung: the probe gets no answer; named, stopped, launched again.
        seen = len(serving.lines)
        lab.ssh(two[1], f"kill -STOP {rank_pid(lab, two[1], run_id, 1)}", check=True)
        status, answer = chat(port, timeout=SERVE_AGAIN_S)  # while down: 503 at once, never a hang
        assert status == 503 and "not being served" in answer["error"]["message"], answer
        restart = serving.wait_for(r"^restart 1/3 after: (.*)", SERVE_AGAIN_S, after=seen).group(1)
        assert "probe" in restart and f"rank 1 on {two[1].name} is stopped" in restart, restart
        serving.wait_for(r"serving .* again \(restart 1", SERVE_AGAIN_S, after=seen)
        assert chat_text(port) == alone

        # Rank 0 killed: its exit is the failure; launched again, same address.
        seen = len(serving.lines)
        lab.ssh(two[0], f"kill -KILL {rank_pid(lab, two[0], run_id, 0)}", check=True)
        restart = serving.wait_for(r"^restart 2/3 after: (.*)", SERVE_AGAIN_S, after=seen).group(1)
        # The killed rank's ssh session may end with ssh's own 255 (a remote command ended
        # by a signal; seen once in CI): its host answers the sweep, so it is no lost
        # connection (jobs/run.py); either way rank 0 and its host.
        assert re.search(rf"rank 0 exited with code \S+ \(on {two[0].name}\)", restart), restart
        serving.wait_for(r"serving .* again \(restart 2", SERVE_AGAIN_S, after=seen)
        assert chat_text(port) == alone

        # SIGTERM while two answers stream: no new request (503), both complete, exit 0.
        streamed = drain_while_two_stream(serving, port, model)
    finally:
        code = serving.stop()  # the drain's own exit code when it ended
    assert code == 0, serving.output()
    assert len(streamed) == 2 and streamed[0] == streamed[1] and streamed[0], streamed
    assert "still in flight" not in serving.output()
    assert f"every rank of run {run_id} was stopped on every host" in serving.output()
    assert_nothing_left(lab, {"run_id": run_id, "cleanup_problems": []})
    journal = (tmp_path / "runs" / run_id / "serve.log").read_text()
    assert re.search(r"restart 1/3: .*rank 1 on " + two[1].name, journal), journal
    assert "restart 2/3: rank 0 exited with code" in journal and two[0].name in journal, journal


def drain_while_two_stream(serving: Serving, port: int, model) -> dict[int, str]:
    """SIGTERM to serve while two long answers stream from the lab's ranks:
    the drain is said with both in flight, a new request gets 503, both
    answers complete in full; serve's exit is left for the caller to read.
    What each stream said, by its number."""
    import openai
    from tokenizers import Tokenizer

    eos = Tokenizer.from_file(str(model / "tokenizer.json")).token_to_id("<|endoftext|>")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                           timeout=SERVE_AGAIN_S)
    streams, streamed = stream_two_long_answers(client, eos, port, SERVE_AGAIN_S)
    seen = len(serving.lines)
    serving.proc.send_signal(signal.SIGTERM)
    serving.wait_for(r"SIGTERM: draining, no new requests; 2 in flight and 0 waiting", SERVE_AGAIN_S,
                     after=seen)
    status, answer = chat(port)
    assert status == 503 and "serve is stopping (SIGTERM)" in answer["error"]["message"], answer
    for t in streams:
        t.join(SERVE_AGAIN_S)
    serving.proc.wait(timeout=SERVE_AGAIN_S)
    return streamed


def test_a_model_that_does_not_split_over_three_hosts_is_refused_before_anything_is_sent(lab3, llama, tmp_path):
    lab = lab3
    model = chat_model(llama, lab.disk / f"tiny-chat-{uuid.uuid4().hex[:8]}")  # 4 heads, 2 KV heads
    _, env = training_setup(lab, tmp_path)
    inventory = lab.write_inventory(tmp_path / "three.yaml")
    serving = Serving(["-i", str(inventory), "--backend", "ring", "--port", str(free_port_block(1)),
                       str(model)], env=env, cwd=tmp_path)
    code = serving.proc.wait(timeout=SERVE_UP_S)
    out = serving.output()
    assert code == 2, out
    assert "3 ranks do not divide the 4 attention heads and 2 KV heads" in out, out
    assert "ways out: 1 or 2 rank(s)" in out, out
    assert "launching" not in out and "sending" not in out
    for h in lab.hosts:  # nothing sent
        assert not lab.host_exists(h, model / "config.json"), h.name
