"""serve's front and probe (mlxcluster/serve/front.py, probe.py): a real HTTP
server on loopback stands in for rank 0's mlx-lm server (the real one is in
tests/test_serve.py and the lab's)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mlxcluster.serve.front import RETRY_AFTER_S, Backend, Front
from mlxcluster.serve.probe import ProbeResult, ProbeWatch, probe_once
from tests.waits import poll_until


class Upstream(BaseHTTPRequestHandler):
    """Answers like mlx-lm's server: JSON, or server-sent events when asked to
    stream; counts how many requests it holds at once."""

    protocol_version = "HTTP/1.0"
    at_once = 0
    most_at_once = 0
    lock = threading.Lock()
    delay = 0.0
    hang = threading.Event()

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        cls = type(self)
        with cls.lock:
            cls.at_once += 1
            cls.most_at_once = max(cls.most_at_once, cls.at_once)
        held = [True]

        def last(data: bytes) -> None:
            """Write the answer's last bytes, the request counted done first: once
            they are out, the front may pass on the next request before this thread
            runs again (seen in CI at load: two held at once, counted after the fact)."""
            with cls.lock:
                cls.at_once -= 1
            held[0] = False
            self.wfile.write(data)

        try:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if cls.hang.is_set():
                time.sleep(30)
            time.sleep(cls.delay)
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for word in ("Once", " upon", " a", " time"):
                    self.wfile.write(f"data: {json.dumps({'text': word})}\n\n".encode())
                    self.wfile.flush()
                last(b"data: [DONE]\n\n")
                return
            payload = json.dumps({"echo": body, "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            last(payload)
        finally:
            if held[0]:
                with cls.lock:
                    cls.at_once -= 1


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that gave up (the probe's timeout) is what the hang tests make


@pytest.fixture
def upstream():
    Upstream.at_once = Upstream.most_at_once = 0
    Upstream.delay = 0.0
    Upstream.hang.clear()
    server = QuietServer(("127.0.0.1", 0), Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    Upstream.hang.clear()
    server.shutdown()
    server.server_close()


def post(port: int, path: str, body: dict, timeout: float = 10.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        conn.close()


def test_a_request_while_down_gets_503_with_retry_after_at_once():
    backend = Backend()
    backend.down("restarting: rank 1 exited")
    with Front("127.0.0.1", 0, backend) as front:
        started = time.monotonic()
        status, headers, body = post(front.port, "/v1/chat/completions", {"messages": []})
        took = time.monotonic() - started
    assert status == 503
    assert headers["Retry-After"] == str(RETRY_AFTER_S)
    assert "rank 1 exited" in json.loads(body)["error"]["message"]
    assert took < 5  # at once, never a hang


def test_requests_and_streams_are_passed_on_whole(upstream):
    backend = Backend()
    backend.up(upstream)
    with Front("127.0.0.1", 0, backend) as front:
        status, _, body = post(front.port, "/v1/completions", {"prompt": "Hi", "max_tokens": 3})
        assert status == 200
        assert json.loads(body) == {"echo": {"prompt": "Hi", "max_tokens": 3}, "path": "/v1/completions"}
        status, headers, body = post(front.port, "/v1/chat/completions", {"stream": True})
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    words = [json.loads(line[6:])["text"] for line in body.decode().splitlines()
             if line.startswith("data: {")]
    assert "".join(words) == "Once upon a time" and body.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("concurrent,most", [(False, 1), (True, 4)])
def test_requests_reach_rank_0_one_at_a_time_unless_concurrent(upstream, concurrent, most):
    Upstream.delay = 0.3
    backend = Backend(concurrent=concurrent)
    backend.up(upstream)
    with Front("127.0.0.1", 0, backend) as front:
        results = []
        threads = [threading.Thread(target=lambda: results.append(post(front.port, "/v1/completions", {})[0]))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [200] * 4
    assert Upstream.most_at_once == most


def test_the_probe_answers_and_fails_within_its_timeout(upstream):
    got = probe_once(upstream, timeout=5)
    assert got.ok, got.error
    Upstream.hang.set()
    started = time.monotonic()
    got = probe_once(upstream, timeout=1)
    assert not got.ok and "no answer within 1 s" in got.error
    assert time.monotonic() - started < 4


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def watch_with(results, backend, clock, **kw):
    ups = []
    answers = iter(results)
    watch = ProbeWatch(lambda t: next(answers), backend, 4242, every=10, timeout=5,
                       start_timeout=kw.get("start_timeout", 60), on_up=ups.append, clock=clock)
    return watch, ups


def test_the_watch_is_up_at_the_first_answer_then_stalled_at_the_first_unanswered_probe():
    clock, backend = Clock(), Backend()
    watch, ups = watch_with([ProbeResult(False, 0.0, "cannot connect"), ProbeResult(True, 0.1),
                             ProbeResult(True, 0.1), ProbeResult(False, 5.0, "no answer within 5 s")],
                            backend, clock)
    watch._until_up()
    assert ups == [] and backend.state()[0] is None and not watch.stalled()
    clock.now += 7
    watch._until_up()
    assert ups == [7.0] and backend.state()[0] == 4242
    watch._check()
    assert not watch.stalled()
    watch._check()
    assert watch.stalled()
    assert "no answer within 5 s" in watch.why() and "--probe-timeout 5 s" in watch.why()
    port, why = backend.state()
    assert port is None and "restarting" in why


def test_a_server_not_up_within_the_start_timeout_is_stalled():
    clock, backend = Clock(), Backend()
    watch, _ = watch_with([], backend, clock, start_timeout=60)
    clock.now += 59
    assert not watch.stalled()
    clock.now += 2
    assert watch.stalled() and "did not answer within 60 s" in watch.why()


def test_a_long_answer_streaming_is_alive_and_a_silent_one_is_a_hang():
    clock = Clock()
    backend = Backend(clock=clock)
    watch, _ = watch_with([ProbeResult(True, 0.1)], backend, clock)
    watch._until_up()
    backend.turn.acquire()  # a user's request holds the turn
    try:
        backend.busy_since = clock.now
        clock.now += 4
        backend.got_bytes()
        clock.now += 4
        watch._check()  # bytes 4 s ago: alive
        assert not watch.stalled()
        clock.now += 2
        watch._check()  # 6 s without a byte, limit 5
        assert watch.stalled() and "no byte" in watch.why()
    finally:
        backend.turn.release()


def test_the_front_says_a_taken_port():
    backend = Backend()
    with Front("127.0.0.1", 0, backend) as front, pytest.raises(OSError):
        Front("127.0.0.1", front.port, backend)


def test_the_probe_thread_brings_the_backend_up(upstream):
    backend = Backend()
    ups = []
    watch = ProbeWatch(lambda t: probe_once(upstream, t), backend, upstream, every=0.2, timeout=5,
                       start_timeout=60, on_up=ups.append).start()
    try:
        poll_until(lambda: ups, 10, "the probe thread saw the server up")
        assert backend.state()[0] == upstream
    finally:
        watch.stop()
