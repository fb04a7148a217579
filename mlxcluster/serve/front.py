"""The one address users talk to: this machine's 127.0.0.1:PORT.

``Front`` is a small HTTP server that hands each request to rank 0's
mlx-lm server (through ``tunnel.Tunnel``'s port) and streams the answer
back as it comes (server-sent events included). It stays up across
restarts, so the address never changes, whichever host rank 0 is on:

- while the cluster is down (starting, restarting) a request gets 503 with
  ``Retry-After`` at once, never a hang;
- requests reach rank 0 one at a time: mlx-lm's distributed server crashes
  on two at once (mlx-lm #1737). ``concurrent`` lifts that;
- every byte of an answer is progress: the probe (``probe.py``) takes turns
  with the requests on the same lock and, while a long answer is streaming,
  counts its bytes as the server being alive.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RETRY_AFTER_S = 5
CHUNK = 64 * 1024
# Headers that belong to one hop (RFC 9110 7.6.1) and are not passed on; the
# answer is sent with Connection: close, its end marked by the close.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "transfer-encoding", "upgrade", "content-length"}


class Backend:
    """Where rank 0's server is now (None while down), one request at a
    time unless ``concurrent``, and when its last byte came."""

    def __init__(self, concurrent: bool = False, clock=time.monotonic):
        self.clock = clock
        self.concurrent = concurrent
        self.turn = threading.Lock()  # held by the request (or probe) talking to rank 0
        self._lock = threading.Lock()
        self._port: int | None = None
        self._why_down = "starting"
        self.last_byte_at = clock()
        self.busy_since: float | None = None  # a request holds the turn since then

    def up(self, port: int) -> None:
        with self._lock:
            self._port = port

    def down(self, why: str) -> None:
        with self._lock:
            self._port, self._why_down = None, why

    def state(self) -> tuple[int | None, str]:
        with self._lock:
            return self._port, self._why_down

    def got_bytes(self) -> None:
        self.last_byte_at = self.clock()


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
        port, why = backend.state()
        if port is None:
            self.unavailable(why)
            return
        if backend.concurrent:
            self.relay(port, body)
            return
        with backend.turn:
            backend.busy_since = backend.clock()
            try:
                port, why = backend.state()  # it may have gone down while this one waited
                if port is None:
                    self.unavailable(why)
                else:
                    self.relay(port, body)
            finally:
                backend.busy_since = None

    def relay(self, port: int, body: bytes) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=self.server.read_timeout)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            answer = conn.getresponse()
        except OSError as err:
            self.unavailable(f"rank 0's server did not answer ({err})")
            conn.close()
            return
        backend = self.server.backend
        try:
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value)
            self.send_header("Connection", "close")
            self.end_headers()
            while True:
                piece = answer.read1(CHUNK)
                if not piece:
                    break
                backend.got_bytes()
                self.wfile.write(piece)
                self.wfile.flush()
        except OSError:
            pass  # the server went away mid-answer, or the client did: the answer ends here
        finally:
            conn.close()
            self.close_connection = True

    def unavailable(self, why: str) -> None:
        payload = json.dumps({"error": {"message": f"the model is not being served right now: {why}; "
                                                   f"retry in {RETRY_AFTER_S} s",
                                        "type": "unavailable", "code": 503}}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", str(RETRY_AFTER_S))
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)
        self.close_connection = True


class FrontServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client that went away mid-answer: nothing to tell on serve's terminal

    def __init__(self, address: tuple[str, int], backend: Backend, read_timeout: float):
        super().__init__(address, Handler)
        self.backend = backend
        self.read_timeout = read_timeout  # seconds without a byte from rank 0 before giving up


class Front:
    """The front server running in a thread of its own."""

    def __init__(self, bind: str, port: int, backend: Backend, read_timeout: float = 600.0):
        self.server = FrontServer((bind, port), backend, read_timeout)
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
