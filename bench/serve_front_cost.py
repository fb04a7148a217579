"""What serve's front costs an answer, measured where the machine's noise
cannot hide it: the front's own CPU time per streamed token.

    python bench/serve_front_cost.py                 # 8 rounds of 2000 tokens, one every 2 ms
    python bench/serve_front_cost.py --tokens 500 --rounds 3 --pace-ms 0

bench/serve.py compares tokens/s through serve with a bare mlx-lm server, but
on this 2-core machine a real model's tokens/s moves by tens of percent from
one answer to the next: a 2% difference cannot be seen there. Here the model
is taken out. A stand-in for rank 0's mlx-lm server (a process of its own)
streams --tokens chunks shaped as mlx-lm's (one token each, its JSON as
mlx-lm writes it), one every --pace-ms (so that, as from a real model, each
token reaches the front on its own: relayed at full speed, many tokens share
one read and the cost per token looks smaller than it is); a client (a process of its own) reads
the stream either straight from it or through serve's real front
(mlxcluster.serve.front.Front, in this process), in turns each round. This
process then does nothing but the front's work, so its CPU time during a
request through the front is what the front spent relaying it: admission,
the relay of each chunk, the token count for /metrics.

The front's cost of an answer is then that CPU time per token against the
time a token takes to generate: at 100 tokens/s (a small model on an M-series
Mac; most are slower) a token takes 10 ms. Figures: docs/performance.md,
"serve".
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlxcluster.serve.front import Backend, Front  # noqa: E402

# Rank 0's mlx-lm server, stood in: each token one server-sent event as mlx-lm
# 0.32's server writes a streamed chat chunk, then the usage chunk and [DONE].
UPSTREAM = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
TOKENS, PACE = int(sys.argv[1]), float(sys.argv[2])
CHUNK = {"id": "chatcmpl-5f2c", "system_fingerprint": "0.32.2-0.32.4-Darwin-arm64", "object":
         "chat.completion.chunk", "model": "default_model", "created": 1795950381,
         "choices": [{"index": 0, "finish_reason": None, "delta": {"role": "assistant",
                                                                   "content": " word"}}]}
EVENT = f"data: {json.dumps(CHUNK)}\n\n".encode()
USAGE = ("data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 5,
         "completion_tokens": TOKENS, "total_tokens": TOKENS + 5}}) + "\n\ndata: [DONE]\n\n").encode()
class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"{}")
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(TOKENS):
            self.wfile.write(EVENT)
            self.wfile.flush()
            if PACE:
                time.sleep(PACE)
        self.wfile.write(USAGE)
server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

# The client: one streamed chat request, every event read as it comes; prints the
# seconds it took and the events it read.
CLIENT = r"""
import http.client, json, sys, time
port = int(sys.argv[1])
body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "stream": True,
                   "max_tokens": 100000})
started = time.monotonic()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
answer = conn.getresponse()
events = sum(1 for line in answer if line.startswith(b"data: {"))
print(json.dumps({"seconds": time.monotonic() - started, "events": events, "status": answer.status}))
"""


def cpu_seconds() -> float:
    """This process's CPU time, every thread's (the front's threads)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def ask(port: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CLIENT, str(port)], capture_output=True, text=True,
                          timeout=600, check=True)
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--pace-ms", type=float, default=2.0,
                        help="between two tokens (0: as fast as the stand-in writes)")
    args = parser.parse_args()
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(args.tokens),
                                 str(args.pace_ms / 1000)],
                                stdout=subprocess.PIPE, text=True)
    try:
        port = int(upstream.stdout.readline())
        backend = Backend()
        backend.up(port)
        direct, through, cpu_per_token = [], [], []
        with Front("127.0.0.1", 0, backend) as front:
            ask(front.port)  # a first request: imports and threads started before any count
            for r in range(args.rounds):
                for way in (("direct", "front") if r % 2 == 0 else ("front", "direct")):
                    if way == "direct":
                        got = ask(port)
                        direct.append(got["seconds"])
                    else:
                        before = cpu_seconds()
                        got = ask(front.port)
                        cpu_per_token.append((cpu_seconds() - before) / args.tokens)
                        through.append(got["seconds"])
                    if got["status"] != 200 or got["events"] != args.tokens + 1:  # and the usage
                        raise SystemExit(f"{way}: {got}")
    finally:
        upstream.terminate()
        upstream.wait(timeout=30)
    cpu = statistics.median(cpu_per_token)
    added = statistics.median(t - d for t, d in zip(through, direct, strict=True)) / args.tokens
    print(f"bench/serve_front_cost.py: {args.rounds} rounds of {args.tokens} streamed tokens, one "
          f"every {args.pace_ms} ms, direct and through the front in turns")
    print(f"  straight to the stand-in:  {statistics.median(direct):.3f} s a request "
          f"({args.tokens / statistics.median(direct):,.0f} tokens/s at most)")
    print(f"  through serve's front:     {statistics.median(through):.3f} s a request "
          f"({args.tokens / statistics.median(through):,.0f} tokens/s at most)")
    print(f"  the front's CPU per token: {cpu * 1e6:.1f} us (median of rounds; "
          f"{min(cpu_per_token) * 1e6:.1f}-{max(cpu_per_token) * 1e6:.1f})")
    print(f"  wall time added per token: {added * 1e6:.1f} us (median of the rounds' differences)")
    for rate in (100, 30):
        print(f"  at {rate} tokens/s a token takes {1000 / rate:.0f} ms: the front's CPU is "
              f"{cpu * rate * 100:.2f}% of it, its added wall time {added * rate * 100:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
