"""Running `mlxcluster serve` as a user does, and talking to it over HTTP:
shared by tests/test_serve.py and tests/lab/test_serve_lab.py."""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.waits import SERVE_PROBE_TIMEOUT_S, SERVE_STOP_S

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Once upon a time"
MAX_TOKENS = 8


# The template instruct models carry (the tiny test model has none): a chat
# request then means one prompt to mlx-lm's server and to mlx-lm's generate.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def chat_model(llama: Path, folder: Path) -> Path:
    """A copy of the tiny model in ``folder`` whose tokenizer has a chat template."""
    shutil.copytree(llama, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}, indent=1))
    return folder


# A tool call as the json_tools format (Qwen 2.5, Hermes) writes it between
# <tool_call> and </tool_call>, and the token that ends a prompt offered tools.
TOOL = {"name": "get_weather", "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
TOOL_CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
TOOLS_OFFERED = "<tools>"


def tool_chat_model(llama: Path, folder: Path) -> Path:
    """``chat_model`` that calls a tool when offered one, as a real model does,
    through mlx-lm's own tool parsing (json_tools).

    Its tokenizer gains four tokens, TOOLS_OFFERED, <tool_call>, TOOL_CALL's
    JSON as one token, and </tool_call>; its template ends a prompt with
    TOOLS_OFFERED when the request has tools. Each of those tokens predicts the
    next, then end of text: its embedding is large on a coordinate of its own
    that no other token's embedding and no layer's output writes (those rows
    of o_proj and down_proj are zero), and lm_head reads that coordinate. Every
    other prompt goes through the random layers as before, on the model's
    other 60 coordinates, so answers without tools stay a real model's.
    """
    import mlx.core as mx
    from tokenizers import AddedToken, Tokenizer

    chat_model(llama, folder)
    chain = [TOOLS_OFFERED, "<tool_call>", json.dumps(TOOL_CALL), "</tool_call>"]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in chain])
    tokenizer.save(str(folder / "tokenizer.json"))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    template = CHAT_TEMPLATE.replace("assistant:{% endif %}",
                                     "assistant:{% if tools %}" + TOOLS_OFFERED + "{% endif %}{% endif %}")
    config_path.write_text(json.dumps({**config, "chat_template": template,
                                       "tool_parser_type": "json_tools"}, indent=1))
    ids = [tokenizer.token_to_id(t) for t in chain]
    follows = ids[1:] + [tokenizer.token_to_id(config["eos_token"])]
    weights = mx.load(str(folder / "model.safetensors"))
    embed, head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    assert max(ids) < embed.shape[0], "the tiny model's vocabulary has no room for the tool tokens"
    own = list(range(embed.shape[1] - len(chain), embed.shape[1]))  # a coordinate per token
    embed[:, own] = 0
    head[:, own] = 0
    for name, weight in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weight[own, :] = 0
    for coordinate, token, after in zip(own, ids, follows, strict=True):
        embed[token] = 0
        embed[token, coordinate] = 1000.0
        head[after, coordinate] = 10.0
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    return folder


class Serving:
    """`mlxcluster serve ARGS` in a session of its own, its lines read as they come."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
                 module: str = "mlxcluster"):
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = str(REPO)  # this checkout's mlxcluster, whatever the cwd
        self.proc = subprocess.Popen([sys.executable, "-m", module, "serve", *args], env=env,
                                     cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._new.put(line)
        self._new.put(None)

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float, after: int = 0) -> re.Match:
        """The first line from line ``after`` on that matches ``pattern``;
        fails with the whole output when serve ends or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        seen = after
        while True:
            for line in self.lines[seen:]:
                found = rx.search(line)
                if found:
                    return found
            seen = len(self.lines)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} within {timeout:.0f} s:\n"
                                     f"{self.output()[-6000:]}")
            try:
                if self._new.get(timeout=min(left, 1.0)) is None and len(self.lines) == seen:
                    raise AssertionError(f"serve ended (exit {self.proc.wait()}) before a line "
                                         f"matching {pattern!r}:\n{self.output()[-6000:]}")
            except queue.Empty:
                pass

    def stop(self, sig: int = signal.SIGINT) -> int:
        """Send ``sig`` to serve (as Ctrl-C does) and wait for its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=SERVE_STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"serve did not stop within {SERVE_STOP_S} s of "
                                 f"{signal.Signals(sig).name}:\n{self.output()[-4000:]}") from None


# The probe's limit that holds at CI's load (tests/waits.py): beside a long
# answer the probe's one token waits for mlx-lm's batch to take it in (1-5 s
# measured at a load of ~8, 0.2 s quiet). An answer of 1200 tokens took ~27 s
# quiet on 2 ranks here beside mlx.launch's busy loop, 4.7 s without it
# (jobs/quiet_launch.py): a test that needs an answer several probe limits long
# sizes it by the rate of a first answer of RATE_TOKENS, LONG_TOKENS at least.
LONG_PROBE_TIMEOUT_S = SERVE_PROBE_TIMEOUT_S
LONG_TOKENS = 1200
RATE_TOKENS = LONG_TOKENS


def long_chat(client, eos: int, tokens: int = LONG_TOKENS, **kw):
    """A chat request that generates ``tokens``, end-of-sequence banned."""
    return client.chat.completions.create(
        model="default_model", messages=[{"role": "user", "content": "Once upon a time"}],
        max_tokens=tokens, temperature=0.0, logit_bias={str(eos): -100}, **kw)


def stream_two_long_answers(client, eos: int, port: int, timeout: float,
                            tokens: int = LONG_TOKENS) -> tuple[list, dict[int, str]]:
    """Two long greedy answers (``tokens`` tokens each) streaming at once
    through serve at ``port`` (the official openai ``client``), returned once
    the front counts both in flight: (their threads, what each said, filled
    as each ends: it must end at its length)."""
    from tests.waits import poll_until

    streamed: dict[int, str] = {}

    def stream(i: int) -> None:
        chunks = list(long_chat(client, eos, tokens, stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"
        streamed[i] = "".join(c.choices[0].delta.content or "" for c in chunks)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    in_flight = ("mlxcluster_serve_in_flight_requests", ())
    poll_until(lambda: scrape(port)[in_flight] == 2, timeout, "both long answers streaming",
               interval=0.1)
    return threads, streamed


def chat(port: int, prompt: str = PROMPT, timeout: float = 60) -> tuple[int, dict]:
    """An OpenAI chat request at 127.0.0.1:``port``, greedy: (status, the JSON answer)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
            "temperature": 0.0}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def chat_text(port: int, prompt: str = PROMPT) -> str:
    status, answer = chat(port, prompt)
    assert status == 200, answer
    return answer["choices"][0]["message"]["content"]


# One process of mlx-lm's generate, greedy, on the prompt as mlx-lm's server
# makes it from a chat request (the tokenizer's chat template).
GENERATE = """
import sys
from mlx_lm import load, generate
from mlx_lm.sample_utils import make_sampler
model, tokenizer = load(sys.argv[1])
prompt = tokenizer.apply_chat_template([{"role": "user", "content": sys.argv[2]}],
                                       add_generation_prompt=True)
sys.stdout.write(generate(model, tokenizer, prompt, max_tokens=int(sys.argv[3]),
                          sampler=make_sampler(temp=0.0)))
"""


def generated_alone(model: Path, prompt: str = PROMPT) -> str:
    """What one process of mlx_lm.generate answers (greedy)."""
    done = subprocess.run([sys.executable, "-c", GENERATE, str(model), prompt, str(MAX_TOKENS)],
                          capture_output=True, text=True, timeout=300, check=True)
    return done.stdout


def scrape(port: int, key: str | None = None) -> dict[tuple[str, tuple], float]:
    """/metrics read with prometheus_client's own parser: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    answer = conn.getresponse()
    assert answer.status == 200
    text = answer.read().decode()
    conn.close()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def official_clients_agree(port: int, alone: str, model_path: str) -> None:
    """The official `openai` and `anthropic` clients (no retries) against serve
    at ``port``: the chat answer, streamed or not, and the Messages API's,
    streamed or not, are each ``alone`` (one process's greedy answer); the
    completions route answers; models.list names the served model."""
    import anthropic
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                           timeout=120)
    messages = [{"role": "user", "content": PROMPT}]
    said = client.chat.completions.create(model="default_model", messages=messages,
                                          max_tokens=MAX_TOKENS, temperature=0.0)
    assert said.choices[0].message.content == alone
    streamed = client.chat.completions.create(model="default_model", messages=messages,
                                              max_tokens=MAX_TOKENS, temperature=0.0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == alone
    completed = client.completions.create(model="default_model", prompt=PROMPT,
                                          max_tokens=MAX_TOKENS, temperature=0.0)
    assert completed.choices[0].text and completed.usage.completion_tokens <= MAX_TOKENS
    # the served folder (mlx-lm's own /v1/models fails on a host without a Hugging Face cache)
    assert [m.id for m in client.models.list().data] == [model_path]
    claude = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="none",
                                 max_retries=0, timeout=120)
    # (no temperature: this SDK sends none; mlx_lm.server's default, --temp 0, is greedy)
    message = claude.messages.create(model="served", max_tokens=MAX_TOKENS, messages=messages)
    assert message.content[0].text == alone
    with claude.messages.stream(model="served", max_tokens=MAX_TOKENS, messages=messages) as stream:
        assert "".join(stream.text_stream) == alone
    tools_agree(client, claude)


def tools_agree(client, claude) -> None:
    """A tool offered (a ``tool_chat_model``): mlx-lm's server calls it on the chat
    route, and the Messages API, streamed or not, gives the same call as a
    ``tool_use`` block; the tool's result sent back is taken."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    function = {"type": "function", "function": {"name": TOOL["name"], "description": TOOL["description"],
                                                  "parameters": TOOL["input_schema"]}}
    said = client.chat.completions.create(model="default_model", messages=messages, tools=[function],
                                          max_tokens=MAX_TOKENS, temperature=0.0)
    assert said.choices[0].finish_reason == "tool_calls", said
    call = said.choices[0].message.tool_calls[0].function
    assert (call.name, json.loads(call.arguments)) == (TOOL_CALL["name"], TOOL_CALL["arguments"])
    message = claude.messages.create(model="served", max_tokens=MAX_TOKENS, messages=messages,
                                     tools=[TOOL])
    assert message.stop_reason == "tool_use", message
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert (use.name, use.input) == (call.name, json.loads(call.arguments))
    with claude.messages.stream(model="served", max_tokens=MAX_TOKENS, messages=messages,
                                tools=[TOOL]) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use", streamed
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [(use.name, use.input)]
    answered = claude.messages.create(model="served", max_tokens=MAX_TOKENS, tools=[TOOL], messages=[
        *messages, {"role": "assistant", "content": [use.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}])
    assert answered.stop_reason == "tool_use"  # the tiny model calls again: the turn was taken
