"""serve's figures (issue 47, item 7): what the front costs, what batching
gives, whether batched answers are the answers, and how long a hang takes.

    python bench/serve.py                          # --local 2, ring, 3 rounds
    python bench/serve.py --backend mpi --rounds 2 --tokens 32

Three servers of the same model on the same two local ranks, started one at
a time (an idle distributed mlx-lm server keeps mlx.launch's busy loop and
rank 1 busy: two at once would share the cores) and alternated in rounds, so
that each sees the machine as the others do:

- bare: `mlx.launch -n 2 --backend B -- python -m mlx_lm server` (what a
  user runs without mlxcluster), rank 0's port asked directly;
- serve-1: `mlxcluster serve --local 2 --max-in-flight 1` (one request at a time);
- serve-8: the same with `--max-in-flight 8` (mlx-lm batches up to 8).

Each round, on each server: eight greedy streamed requests of --tokens
tokens (end-of-sequence banned, so every answer is that long), one prompt
each, one after another: tokens/s of each answer and its time to first token
(the overhead figures); then 4 and 8 clients at once (aggregate tokens/s),
each answer compared with the same prompt's answer alone on that server.
On serve-1, also: each prompt asked once through the front and once of rank
0's own mlx-lm server (its port read from rank 0's command line), in turns,
first one then the other: pairs a moment apart on the same ranks, so the
ratio front / direct is the front's own cost with the machine's drift taken
out (the bare server's rounds cannot do that: they are minutes apart). Last:
rank 1 stopped (SIGSTOP) and the seconds until a request is answered again
(the probe finds it, the ranks are launched again).

The model: a random Llama of --hidden/--layers (mlx-lm's classes) with a BPE
tokenizer trained here (tests/hf_support.py); no download. Figures:
docs/performance-runs.md, "serve".
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlxcluster.facts.mpi import find_libmpi, libmpi_env  # noqa: E402
from mlxcluster.jobs.plan import free_port_block  # noqa: E402
from mlxcluster.jobs.rank_wrapper import STACKS_ROOT  # noqa: E402

PROMPTS = ["Once upon a time", "The little dog", "She opened the door", "In the garden",
           "A long time ago", "The sun was", "He liked to", "One day the"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
UP_S, ANSWER_S = 300, 600


def make_model(folder: Path, hidden: int, layers: int) -> tuple[Path, int]:
    """The model folder and its end-of-sequence token id."""
    from tests.hf_support import EOS, LLAMA3_CONFIG, make_llama_folder, train_tokenizer

    config = {**LLAMA3_CONFIG, "hidden_size": hidden, "num_hidden_layers": layers,
              "intermediate_size": hidden * 3 // 2, "num_attention_heads": 8,
              "num_key_value_heads": 4, "max_position_embeddings": 4096}
    make_llama_folder(folder, config, tokenizer=train_tokenizer())
    tok_config = folder / "tokenizer_config.json"
    tok_config.write_text(json.dumps({**json.loads(tok_config.read_text()),
                                      "chat_template": CHAT_TEMPLATE}))
    eos = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"][EOS]
    return folder, eos


class Server:
    """One server of the three, in a session of its own."""

    def __init__(self, name: str, argv: list[str], port: int, cwd: Path, ready: str = "/v1/models"):
        self.name, self.port, self.ready = name, port, ready  # ready: answers 200 once it serves
        self.log = open(cwd / f"{name}.log", "a")
        # this python's bin first: mlx.launch finds mpirun (Open MPI's wheel) by PATH
        env = {**os.environ, "PYTHONPATH": str(REPO),
               "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
               # Open MPI refuses root unless told (this machine's tests run as root)
               "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + UP_S
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not come up: see {self.log.name}")
            time.sleep(0.5)

    def answers(self) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            conn.request("GET", self.ready)
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)  # serve drains, then stops every rank
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def ask(port: int, prompt: str, tokens: int, eos: int) -> dict:
    """One greedy streamed chat request: its text, time to first token, seconds, tokens."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                       "temperature": 0.0, "stream": True, "logit_bias": {str(eos): -100},
                       "stream_options": {"include_usage": True}})
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_S)
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    if answer.status != 200:
        raise RuntimeError(f"HTTP {answer.status}: {answer.read()[:300]!r}")
    text, first, used = [], None, None
    for raw in answer:
        line = raw.decode().strip()
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                first = first or time.monotonic()
                text.append(piece)
        used = event.get("usage") or used
    took = time.monotonic() - started
    conn.close()
    return {"text": "".join(text), "ttft": (first or time.monotonic()) - started,
            "seconds": took, "tokens": (used or {}).get("completion_tokens", 0)}


def at_once(port: int, prompts: list[str], tokens: int, eos: int) -> tuple[float, list[dict]]:
    """``prompts`` sent together: (aggregate tokens/s, the answers in prompt order)."""
    got: list[dict | None] = [None] * len(prompts)

    def one(i: int) -> None:
        got[i] = ask(port, prompts[i], tokens, eos)

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(ANSWER_S)
    took = time.monotonic() - started
    if any(g is None for g in got):
        raise RuntimeError("a request at once got no answer")
    return sum(g["tokens"] for g in got) / took, got


def rank0_port(server: Server) -> int:
    """The port rank 0's mlx-lm server listens on, behind serve's front: read
    from the command line of serve's ranks (the same --port on every rank;
    only rank 0 listens)."""
    import psutil

    for child in psutil.Process(server.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            argv = child.cmdline()
            if "mlx_lm" in " ".join(argv) and "--port" in argv:
                port = int(argv[argv.index("--port") + 1])
                if port != server.port:
                    return port
    raise RuntimeError(f"no rank of {server.name} names its --port")


def front_and_direct(server: Server, tokens: int, eos: int) -> list[tuple[dict, dict]]:
    """Each prompt through the front and straight to rank 0, in turns (which
    goes first alternates): (through the front, direct) per prompt."""
    direct_port = rank0_port(server)
    pairs = []
    for i, prompt in enumerate(PROMPTS):
        ports = (server.port, direct_port) if i % 2 == 0 else (direct_port, server.port)
        got = {port: ask(port, prompt, tokens, eos) for port in ports}
        pairs.append((got[server.port], got[direct_port]))
    return pairs


def hang_to_answer(server: Server, tokens: int, eos: int) -> float:
    """SIGSTOP rank 1 of a serve run; seconds until a request is answered again."""
    server.log.flush()
    run_id = [line.split("run ")[1].split(":")[0] for line in  # this round's: the log is appended to
              Path(server.log.name).read_text().splitlines() if "launching 2 rank(s)" in line][-1]
    pid = int((Path(STACKS_ROOT) / run_id / "rank1.pid").read_text().split()[0])
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    while True:
        try:
            ask(server.port, PROMPTS[0], 4, eos)
            return time.monotonic() - stopped
        except (OSError, RuntimeError):
            if time.monotonic() - stopped > UP_S:
                raise
            time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("ring", "mpi"), default="ring")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    # Started in the background by a script, this process ignores SIGINT, and so would
    # every launcher it starts (mlx.launch then never stops its ranks on a signal).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    work = Path(tempfile.mkdtemp(prefix="bench-serve."))
    model, eos = make_model(work / "model", args.hidden, args.layers)
    launcher = shutil.which("mlx.launch", path=str(Path(sys.executable).parent))

    def start(name: str) -> Server:
        port = free_port_block(1)
        if name == "bare" and args.backend == "mpi":
            # mlx.launch names MLX's libmpi only on macOS (otool): on Linux, without these,
            # each rank would run alone. The command is run as it is (no --python).
            libmpi = find_libmpi(python=sys.executable)
            argv = [launcher, "-n", "2", "--backend", "mpi",
                    *(f"--env={k}={v}" for k, v in libmpi_env(libmpi).items()), "--",
                    sys.executable, "-m", "mlx_lm", "server", "--model", str(model), "--port", str(port)]
        elif name == "bare":
            argv = [launcher, "-n", "2", "--backend", args.backend, "--starting-port",
                    str(free_port_block(2)), "--python", sys.executable, "--", "-m", "mlx_lm",
                    "server", "--model", str(model), "--port", str(port)]
        else:
            argv = [sys.executable, "-m", "mlxcluster", "serve", "--local", "2", "--backend",
                    args.backend, "--no-preflight", "--port", str(port), "--queue", "16",
                    "--max-in-flight", name.split("-")[1], str(model)]  # probe: serve's defaults
        # serve's front answers /v1/models while its ranks start; /ready once the probe answered
        return Server(name, argv, port, work, ready="/v1/models" if name == "bare" else "/ready")

    names = ["bare", "serve-1", "serve-8"]
    single: dict[str, list[dict]] = {n: [] for n in names}
    rates: dict[tuple[str, int], list[float]] = {}
    mismatches: dict[str, list[int]] = {n: [0, 0] for n in names}  # differing, compared
    hangs: list[float] = []
    pairs: list[tuple[dict, dict]] = []  # serve-1's (through the front, straight to rank 0)
    print(f"bench/serve.py: {args.backend}, {args.rounds} rounds, {args.tokens} tokens, model "
          f"hidden {args.hidden} x {args.layers} layers; {work}", flush=True)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            server = start(name)
            try:
                alone = [ask(server.port, p, args.tokens, eos) for p in PROMPTS]
                single[name].extend(alone)
                for clients in (4, 8):
                    rate, got = at_once(server.port, PROMPTS[:clients], args.tokens, eos)
                    rates.setdefault((name, clients), []).append(rate)
                    for g, a in zip(got, alone[:clients], strict=True):
                        mismatches[name][0] += g["text"] != a["text"]
                        mismatches[name][1] += 1
                if name == "serve-1":
                    pairs.extend(front_and_direct(server, args.tokens, eos))
                    hangs.append(hang_to_answer(server, args.tokens, eos))
            finally:
                server.stop()
            print(f"round {r + 1} {name}: {statistics.median(a['tokens'] / a['seconds'] for a in alone):.1f} "
                  f"tok/s alone", flush=True)

    print("\n| server | tok/s, one client (median of answers) | time to first token (median) "
          "| aggregate tok/s, 4 clients | 8 clients | batched answers equal to alone |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        answers = single[name]
        tps = statistics.median(a["tokens"] / a["seconds"] for a in answers)
        ttft = statistics.median(a["ttft"] for a in answers)
        differing, compared = mismatches[name]
        print(f"| {name} | {tps:.1f} | {ttft * 1000:.0f} ms | "
              f"{statistics.median(rates[(name, 4)]):.1f} | {statistics.median(rates[(name, 8)]):.1f} "
              f"| {compared - differing}/{compared} |")
    bare = statistics.median(a["tokens"] / a["seconds"] for a in single["bare"])
    served = statistics.median(a["tokens"] / a["seconds"] for a in single["serve-1"])
    print(f"\nserve-1 / bare, one client: {served / bare:.3f}")

    def rate(answer: dict) -> float:
        return answer["tokens"] / answer["seconds"]
    ratios = [rate(front) / rate(direct) for front, direct in pairs]
    print(f"through serve-1's front / straight to its rank 0, {len(pairs)} pairs: tok/s median of "
          f"pair ratios {statistics.median(ratios):.3f} (quartiles "
          f"{' '.join(f'{q:.3f}' for q in statistics.quantiles(ratios, n=4))}); medians "
          f"{statistics.median(rate(f) for f, _ in pairs):.1f} and "
          f"{statistics.median(rate(d) for _, d in pairs):.1f} tok/s; time to first token "
          f"{statistics.median(f['ttft'] for f, _ in pairs) * 1000:.0f} and "
          f"{statistics.median(d['ttft'] for _, d in pairs) * 1000:.0f} ms")
    print(f"hang (SIGSTOP of rank 1) to answering again: "
          f"{', '.join(f'{h:.1f}' for h in hangs)} s (serve's defaults: --probe-every 10s "
          "--probe-timeout 30s)")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
