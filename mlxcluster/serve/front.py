"""The one address users talk to: this machine's 127.0.0.1:PORT.

``Front`` is a small HTTP server that hands each request to rank 0's
mlx-lm server (through ``tunnel.Tunnel``'s port) and streams the answer
back as it comes (server-sent events included). It stays up across
restarts, so the address never changes, whichever host rank 0 is on:

- while the cluster is down (starting, restarting) a request gets 503 with
  ``Retry-After`` at once, never a hang; a request in flight when the probe
  finds a hang is cut at once and told why (503);
- requests reach rank 0 as ``admission.Admission`` lets them: one at a
  time by default (mlx-lm's distributed server crashes on two at once,
  mlx-lm #1737), a bounded line behind, 429 at once past it;
- stopping drains: new requests get 503, the ones admitted finish
  (``Backend.drain``; serve's --drain-timeout bounds the wait);
- however long an answer takes, the front waits for it: whether the server
  is alive is the probe's to judge (``probe.py``), not one answer's time. A
  request's own limit is ``request_timeout`` (serve's --request-timeout,
  off by default); past it the client gets 504 saying so;
- with a key (``access.ApiKey``), every request but ``/health`` carries it
  or gets 401.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mlxcluster.serve.access import ApiKey
from mlxcluster.serve.admission import Admission, QueueFull
from mlxcluster.serve.anthropic import MessagesError, error_body, translator_for
from mlxcluster.serve.metrics import CONTENT_TYPE, ServeMetrics, route_of
from mlxcluster.serve.status import PATHS as STATUS_PATHS
from mlxcluster.serve.status import ServeStatus, StatusView
from mlxcluster.serve.status_page import render

RETRY_AFTER_S = 5
CHUNK = 64 * 1024
USAGE_TAIL = 256 * 1024  # an answer's last bytes kept for its usage (a JSON answer: whole)
# Headers that belong to one hop (RFC 9110 7.6.1) and are not passed on; the
# answer is sent with Connection: close, its end marked by the close.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "transfer-encoding", "upgrade", "content-length"}


def served_alone(body: bytes, server_args: tuple[str, ...] = ()) -> bool:
    """Whether mlx-lm's server answers this request outside its batch, so that
    any other request (the probe too) waits until it is done: a request with
    a ``seed``, one with an image, or every request under ``--kv-bits``
    (mlx_lm/server.py ``_is_batchable`` and its image rule, mlx-lm 0.32.2)."""
    if any(a == "--kv-bits" or a.startswith("--kv-bits=") for a in server_args):
        return True
    request = _json_object(body)
    if request.get("seed") is not None:
        return True
    for message in request.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
                isinstance(part, dict) and "image" in str(part.get("type", "")) for part in content):
            return True
    return False


@dataclass(eq=False)
class Flight:
    """One request passed on to rank 0, while its answer comes."""

    started: float
    alone: bool  # ``served_alone``: a probe would wait behind it
    streaming: bool  # asked for server-sent events
    last_byte: float | None = None
    cut: str | None = None  # why the front ended it (a hang found, its request timeout)
    sock: socket.socket | None = field(default=None, repr=False)

    def end(self, why: str) -> None:
        """Cut the upstream connection: the relay's read ends at once."""
        self.cut = why
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed


class Backend:
    """Where rank 0's server is now (None while down), who may talk to it
    (``admission``), the requests in flight, and whether serve is stopping."""

    def __init__(self, admission: Admission | None = None, clock=time.monotonic,
                 metrics: ServeMetrics | None = None):
        self.clock = clock
        self.admission = admission or Admission()
        self.metrics = metrics or ServeMetrics()
        self.status = ServeStatus()  # what the status page adds to the counters
        self._lock = threading.Lock()
        self._port: int | None = None
        self._why_down = "starting"
        self._flights: set[Flight] = set()
        self.stopping: str | None = None  # why new requests are refused for good (a drain)

    def up(self, port: int) -> None:
        with self._lock:
            self._port = port
        self.metrics.up.set(1)

    def down(self, why: str) -> None:
        """No more requests to rank 0; the ones in flight are cut, told ``why``."""
        with self._lock:
            self._port, self._why_down = None, why
            flights = list(self._flights)
        self.metrics.up.set(0)
        self.metrics.mark_ready(False)
        for flight in flights:
            flight.end(why)

    def state(self) -> tuple[int | None, str]:
        with self._lock:
            return self._port, self._why_down

    def begin(self, *, alone: bool, streaming: bool) -> Flight:
        flight = Flight(self.clock(), alone, streaming)
        with self._lock:
            self._flights.add(flight)
        self.metrics.in_flight.inc()
        return flight

    def finish(self, flight: Flight) -> None:
        with self._lock:
            if flight not in self._flights:
                return
            self._flights.discard(flight)
        self.metrics.in_flight.dec()

    def got_bytes(self, flight: Flight) -> None:
        flight.last_byte = self.clock()

    def in_flight(self) -> list[Flight]:
        with self._lock:
            return list(self._flights)

    def drain(self, why: str) -> None:
        """Refuse new requests (503, ``why``); the ones admitted or waiting go on."""
        self.stopping = why
        self.metrics.mark_ready(False)

    def idle(self) -> bool:
        """No request in flight nor waiting (a drain's end)."""
        busy, waiting = self.admission.counts()
        return busy == 0 and waiting == 0 and not self.in_flight()


class Handler(BaseHTTPRequestHandler):
    server: FrontServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self.forward()

    def do_POST(self) -> None:  # noqa: N802
        self.forward()

    def do_OPTIONS(self) -> None:  # noqa: N802
        self.forward()

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        pass  # the requests are the user's; serve's output is about the cluster

    def forward(self) -> None:
        backend = self.server.backend
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.server.keys.admits(self.path, self.headers):
            self.refuse(401, "a key is needed: send 'Authorization: Bearer KEY' (or Anthropic's "
                             "'x-api-key: KEY'), the key serve was started with", "unauthorized")
            return
        if self.command == "GET" and self.answer_here():
            return
        path, translator = self.path, None
        if self.command == "POST" and route_of(self.path) == "/v1/messages":
            try:  # Anthropic's Messages API, on mlx-lm's chat completions
                body, translator = translator_for(body)
            except MessagesError as err:
                self.send_bytes(400, error_body(400, str(err)), "application/json")
                return
            path = "/v1/chat/completions"
        port, why = backend.state()
        if backend.stopping is not None or port is None:
            self.unavailable(backend.stopping or why)
            return
        backend.metrics.waiting.inc()
        try:
            admitted = backend.admission.enter(given_up=self.client_gone)
        except QueueFull as full:
            self.refuse(429, f"serve is busy: {full} (--max-in-flight "
                             f"{full.max_in_flight}, --queue {full.waiting}); retry in "
                             f"{RETRY_AFTER_S} s", "rate_limit", retry=True)
            return
        finally:
            backend.metrics.waiting.dec()
        if not admitted:  # the client went away while it waited
            self.close_connection = True
            return
        try:
            port, why = backend.state()  # it may have gone down while this one waited
            if port is None:
                self.unavailable(why)
            else:
                self.relay(port, body, path, translator)
        finally:
            backend.admission.leave()

    def client_gone(self) -> bool:
        """Whether the client closed its connection (its whole request was read:
        a readable socket with nothing to read is a close)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def answer_here(self) -> bool:
        """The front's own routes: /health (the front is up), /ready (the
        model answered its last probe), /metrics (Prometheus), / and /status
        (the status page), /v1/models (``models_list``)."""
        route, metrics = route_of(self.path), self.server.backend.metrics
        if route == "/health":
            self.send_bytes(200, json.dumps({"status": "ok"}).encode(), "application/json")
        elif route == "/ready":
            port, why = self.server.backend.state()
            status = 200 if metrics.is_ready and port is not None else 503
            said = {"ready": status == 200, **({} if status == 200 else {"why": why})}
            self.send_bytes(status, json.dumps(said).encode(), "application/json")
        elif route == "/metrics":
            self.send_bytes(200, metrics.text(), CONTENT_TYPE)
        elif route == "/v1/models" and "model_path" in self.server.backend.status.about \
                and self.server.backend.stopping is None:  # draining: a model route's 503
            self.send_bytes(200, models_list(self.server.backend.status), "application/json")
        elif self.path.split("?", 1)[0] in STATUS_PATHS:
            self.send_bytes(200, render(status_view(self.server.backend)),
                            "text/html; charset=utf-8")
        else:
            return False
        return True

    def send_bytes(self, status: int, payload: bytes, content_type: str) -> None:
        self.server.backend.metrics.answered(self.path, status)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)
        self.close_connection = True

    def relay(self, port: int, body: bytes, path: str | None = None, translator=None) -> None:
        """Pass the request on to rank 0 (at ``path``, by default its own) and
        its answer back as it comes, through ``translator`` when given (feed
        each piece, then end: anthropic.py)."""
        backend, limit = self.server.backend, self.server.request_timeout
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        if translator is not None:
            headers["Content-Type"] = "application/json"
        flight = backend.begin(alone=served_alone(body, self.server.server_args),
                               streaming=bool(_json_object(body).get("stream")))
        # No read limit: the answer may take long to start (mlx-lm sends nothing
        # of a non-streamed answer until it is whole). A hang is the probe's to
        # find; the request's own limit is the timer below.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=None)
        timer = None
        if limit is not None:
            timer = threading.Timer(limit, flight.end,
                                    (f"took longer than --request-timeout {limit:.0f} s",))
            timer.daemon = True
        try:
            try:
                conn.connect()
                flight.sock = conn.sock
                if flight.cut is not None:  # went down between state() and here
                    raise ConnectionAbortedError
                if timer is not None:
                    timer.start()
                sent_at = backend.clock()
                conn.request(self.command, path or self.path, body=body, headers=headers)
                answer = conn.getresponse()
            except OSError as err:
                if flight.cut is not None and flight.cut.startswith("took longer"):
                    self.timed_out(flight.cut)
                else:
                    self.unavailable(flight.cut or f"rank 0's server did not answer ({err})")
                return
            route, metrics = route_of(self.path), backend.metrics
            metrics.answered(self.path, answer.status)
            tail = b""  # the answer's end, for its usage
            first = True
            if answer.status != 200:
                translator = None  # an error is passed on as it is
            try:
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP and not (
                            translator is not None and key.lower() == "content-type"):
                        self.send_header(key, value)
                if translator is not None:
                    self.send_header("Content-Type", translator.content_type)
                self.send_header("Connection", "close")
                self.end_headers()
                while True:
                    piece = answer.read1(CHUNK)
                    if not piece:
                        break
                    backend.got_bytes(flight)
                    if first:
                        metrics.first_byte.labels(route).observe(backend.clock() - sent_at)
                        backend.status.first_byte(backend.clock() - sent_at)
                        first = False
                    tail = (tail + piece)[-USAGE_TAIL:]
                    out = piece if translator is None else translator.feed(piece)
                    if out:
                        self.wfile.write(out)
                        self.wfile.flush()
                if translator is not None:
                    self.wfile.write(translator.end())
                    self.wfile.flush()
            except OSError:
                pass  # cut, or the client went away: the answer ends here
            metrics.latency.labels(route).observe(backend.clock() - sent_at)
            backend.status.answered(metrics.usage_in(tail))
        finally:
            if timer is not None:
                timer.cancel()
            backend.finish(flight)
            conn.close()
            self.close_connection = True

    def unavailable(self, why: str) -> None:
        self.refuse(503, f"the model is not being served right now: {why}; retry in "
                         f"{RETRY_AFTER_S} s", "unavailable", retry=True)

    def timed_out(self, why: str) -> None:
        self.refuse(504, f"the answer {why} (serve's limit for one request)", "timeout")

    def refuse(self, status: int, message: str, kind: str, retry: bool = False) -> None:
        payload = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
        self.server.backend.metrics.answered(self.path, status)
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if retry:
                self.send_header("Retry-After", str(RETRY_AFTER_S))
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            pass  # the client went away first
        self.close_connection = True


def status_view(backend: Backend) -> StatusView:
    """The page's numbers, read now from ``backend``, its counters and its status."""
    metrics, status = backend.metrics, backend.status
    by_status: dict[str, int] = {}
    for family in metrics.requests.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels["route"].startswith("/v1/"):
                code = sample.labels["status"]  # the model's routes: not /metrics, not this page
                by_status[code] = by_status.get(code, 0) + int(sample.value)
    port, why = backend.state()
    busy, waiting = backend.admission.counts()
    per_s, tokens_per_s, ttft, restarts = status.recent()
    return StatusView(
        model=status.about["model"], split=status.about["split"],
        address=status.about["address"], run_id=status.about["run_id"],
        ranks=status.ranks, hosts=status.hosts, up=port is not None,
        ready=metrics.is_ready and port is not None, why_down=why, stopping=backend.stopping,
        requests=sum(by_status.values()), by_status=tuple(sorted(by_status.items())),
        completion_tokens=int(_value(metrics.completion_tokens)),
        in_flight=len(backend.in_flight()), waiting=waiting,
        max_in_flight=backend.admission.max_in_flight, queue=backend.admission.queue,
        requests_per_s=per_s, tokens_per_s=tokens_per_s, ttft_median_s=ttft,
        launches=int(_value(metrics.launches)), restarts=restarts, probe=status.probe)


def models_list(status: ServeStatus) -> bytes:
    """/v1/models, answered here: the model served, as mlx-lm names it (its
    folder's absolute path, the same on every host). mlx-lm's own answer
    scans the Hugging Face cache first and fails when a host has none (a
    model folder serve sent there: seen on the lab; mlx-lm 0.32.2
    ``handle_models_request``), sending a 200 with an empty body."""
    return json.dumps({"object": "list", "data": [
        {"id": status.about["model_path"], "object": "model", "created": int(status.started)}]}
    ).encode()


def served_counts(backend: Backend) -> tuple[int, int]:
    """(requests answered on the model's routes, tokens generated): `mlxcluster jobs`'s."""
    view = status_view(backend)
    return view.requests, view.completion_tokens


def _value(counter) -> float:
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                return sample.value
    return 0.0


def _json_object(body: bytes) -> dict:
    """The request's JSON object ({} for anything else: mlx-lm refuses it at once)."""
    try:
        request = json.loads(body or b"{}")
    except ValueError:
        return {}
    return request if isinstance(request, dict) else {}


class FrontServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client that went away mid-answer: nothing to tell on serve's terminal

    def __init__(self, address: tuple[str, int], backend: Backend,
                 request_timeout: float | None, server_args: tuple[str, ...], keys: ApiKey):
        super().__init__(address, Handler)
        self.backend, self.keys = backend, keys
        self.request_timeout = request_timeout  # one request's limit (None: none)
        self.server_args = server_args  # mlx_lm.server's own flags (``served_alone``)


class Front:
    """The front server running in a thread of its own."""

    def __init__(self, bind: str, port: int, backend: Backend, *,
                 request_timeout: float | None = None, server_args: tuple[str, ...] = (),
                 api_key: str | None = None):
        self.bind, self.backend = bind, backend
        self.server = FrontServer((bind, port), backend, request_timeout, server_args,
                                  ApiKey(api_key))
        self.thread = threading.Thread(target=self.server.serve_forever, name="serve-front",
                                       daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def __enter__(self) -> Front:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
