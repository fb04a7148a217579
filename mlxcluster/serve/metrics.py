"""What serve's front saw, for Prometheus (`GET /metrics`) and `/ready`.

One registry per serve (prometheus_client's, not the process-wide default,
so that tests and two fronts in one process never share counters). The
front counts every request it answers, by route and status; the tokens of
each answer from its ``usage`` (a JSON answer's, or a stream's last event
when the client asked for it with ``stream_options.include_usage``); the
seconds to an answer's first byte and to its end; the requests waiting for
their turn and those in flight. The serve loop adds the launches, the
restarts by kind and each rank's host; the probe whether the model answered
last. An example, scraped::

    # HELP mlxcluster_serve_requests_total Requests answered by the front, by route and HTTP status.
    # TYPE mlxcluster_serve_requests_total counter
    mlxcluster_serve_requests_total{route="/v1/chat/completions",status="200"} 3.0
    mlxcluster_serve_completion_tokens_total 96.0
    mlxcluster_serve_up 1.0
    mlxcluster_serve_rank_info{host="studio2",rank="1"} 1.0
"""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Routes counted by name; any other path is "other" (a label per path would
# let any client grow the metrics without bound).
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/messages", "/health",
          "/ready", "/metrics", "/", "/status")
SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def route_of(path: str) -> str:
    path = path.split("?", 1)[0].rstrip("/") or "/"
    return path if path in ROUTES else "other"


class ServeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("mlxcluster_serve_requests", "Requests answered by the front, by "
                                "route and HTTP status.", ["route", "status"], registry=r)
        self.prompt_tokens = Counter("mlxcluster_serve_prompt_tokens",
                                     "Prompt tokens of the answers that reported usage.",
                                     registry=r)
        self.completion_tokens = Counter("mlxcluster_serve_completion_tokens",
                                         "Generated tokens of the answers that reported usage.",
                                         registry=r)
        self.first_byte = Histogram("mlxcluster_serve_time_to_first_byte_seconds",
                                    "From a request passed on to rank 0 to its answer's first "
                                    "byte (streamed: about the first token).", ["route"],
                                    buckets=SECONDS, registry=r)
        self.latency = Histogram("mlxcluster_serve_request_seconds",
                                 "From a request passed on to rank 0 to its answer's end.",
                                 ["route"], buckets=SECONDS, registry=r)
        self.waiting = Gauge("mlxcluster_serve_waiting_requests",
                             "Requests waiting in line for a slot (--max-in-flight, --queue).",
                             registry=r)
        self.in_flight = Gauge("mlxcluster_serve_in_flight_requests",
                               "Requests passed on to rank 0, not yet answered.", registry=r)
        self.up = Gauge("mlxcluster_serve_up", "1 while the model is served, 0 while starting "
                        "or restarting.", registry=r)
        self.ready = Gauge("mlxcluster_serve_ready", "1 when the last probe was answered.",
                           registry=r)
        self.is_ready = False
        self.launches = Counter("mlxcluster_serve_launches", "Launches of the ranks (the "
                                "first and each restart).", registry=r)
        self.restarts = Counter("mlxcluster_serve_restarts", "Restarts, by kind (hang: the "
                                "probe got no answer; exit: a rank ended).", ["kind"], registry=r)
        self.rank_info = Gauge("mlxcluster_serve_rank_info", "Each rank's host (1), this "
                               "launch's.", ["rank", "host"], registry=r)

    def mark_ready(self, ready: bool) -> None:
        """The last probe answered (or not); down is never ready."""
        self.is_ready = ready
        self.ready.set(int(ready))

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def answered(self, path: str, status: int) -> None:
        self.requests.labels(route_of(path), str(status)).inc()

    def usage_in(self, body: bytes) -> int:
        """Count the tokens of an answer's ``usage``: a JSON body's, or the
        last server-sent event carrying one; returns its completion tokens."""
        for usage in _usages(body):
            generated = max(0, int(usage.get("completion_tokens") or 0))
            self.prompt_tokens.inc(max(0, int(usage.get("prompt_tokens") or 0)))
            self.completion_tokens.inc(generated)
            return generated
        return 0

    def ranks(self, hosts: list[str]) -> None:
        self.rank_info.clear()
        for rank, host in enumerate(hosts):
            self.rank_info.labels(str(rank), host).set(1)


def _usages(body: bytes):
    """The ``usage`` objects in an answer, the last first."""
    text = body.decode(errors="replace")
    pieces = [text] if not text.lstrip().startswith(("data:", ":")) else [
        line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    for piece in reversed(pieces):
        try:
            value = json.loads(piece)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("usage"), dict):
            yield value["usage"]
