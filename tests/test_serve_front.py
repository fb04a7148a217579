"""serve's front and probe (mlxcluster/serve/front.py, probe.py): a real HTTP
server on loopback stands in for rank 0's mlx-lm server (the real one is in
tests/test_serve.py and the lab's)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mlxcluster.serve.admission import Admission, QueueFull
from mlxcluster.serve.front import RETRY_AFTER_S, Backend, Front, served_alone
from mlxcluster.serve.probe import ProbeResult, ProbeWatch, probe_once
from tests.fakes import Clock
from tests.serve_support import scrape
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


@pytest.mark.parametrize("max_in_flight", [1, 4])
def test_requests_reach_rank_0_at_most_max_in_flight_at_once(upstream, max_in_flight):
    Upstream.delay = 0.3
    backend = Backend(Admission(max_in_flight, queue=8))
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
    assert Upstream.most_at_once == max_in_flight
    assert backend.admission.counts() == (0, 0)


def test_past_the_queue_a_request_gets_429_at_once_and_the_line_is_served_in_order(upstream):
    """One in flight, two waiting (--queue 2): the fourth is refused at once
    with Retry-After; the waiting ones are answered in the order they came."""
    Upstream.delay = 1.0
    backend = Backend(Admission(1, queue=2))
    backend.up(upstream)
    answered: list[tuple[int, int]] = []
    with Front("127.0.0.1", 0, backend) as front:
        def ask(i: int) -> None:
            status, _, body = post(front.port, "/v1/completions", {"n": i}, timeout=30)
            answered.append((i, status))
        threads = []
        for i in range(3):
            threads.append(threading.Thread(target=ask, args=(i,)))
            threads[-1].start()
            poll_until(lambda i=i: sum(backend.admission.counts()) == i + 1, 10, f"request {i} in")
        started = time.monotonic()
        status, headers, body = post(front.port, "/v1/completions", {"n": 3})
        took = time.monotonic() - started
        for t in threads:
            t.join()
        seen = scrape(front.port)
    assert status == 429 and headers["Retry-After"] == str(RETRY_AFTER_S), body
    said = json.loads(body)["error"]
    assert said["type"] == "rate_limit" and "1 request(s) in flight and 2 waiting" in said["message"]
    assert took < 0.9  # at once: not after the answer in flight (1 s)
    assert answered == [(0, 200), (1, 200), (2, 200)]
    assert seen[("mlxcluster_serve_requests_total",
                 (("route", "/v1/completions"), ("status", "429")))] == 1


def test_a_client_that_goes_away_while_waiting_gives_up_its_place(upstream):
    Upstream.delay = 1.5
    backend = Backend(Admission(1, queue=4))
    backend.up(upstream)
    with Front("127.0.0.1", 0, backend) as front:
        first = threading.Thread(target=post, args=(front.port, "/v1/completions", {"n": 0}))
        first.start()
        poll_until(lambda: backend.admission.counts() == (1, 0), 10, "the first in flight")
        gone = socket.create_connection(("127.0.0.1", front.port))
        payload = json.dumps({"n": 1}).encode()
        gone.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        poll_until(lambda: backend.admission.counts() == (1, 1), 10, "the second waiting")
        gone.close()
        poll_until(lambda: backend.admission.counts() == (1, 0), 5, "its place given up")
        first.join()
    assert Upstream.most_at_once == 1
    assert backend.admission.counts() == (0, 0)


def test_a_drain_refuses_new_requests_and_lets_the_admitted_finish(upstream):
    Upstream.delay = 1.0
    backend = Backend(Admission(1, queue=4))
    backend.up(upstream)
    got: list[int] = []
    with Front("127.0.0.1", 0, backend) as front:
        threads = [threading.Thread(target=lambda i=i: got.append(
            post(front.port, "/v1/completions", {"n": i}, timeout=30)[0])) for i in range(2)]
        for i, t in enumerate(threads):
            t.start()
            poll_until(lambda i=i: sum(backend.admission.counts()) == i + 1, 10, f"request {i} in")
        backend.drain("serve is stopping (SIGTERM)")
        status, headers, body = post(front.port, "/v1/completions", {"n": 2})
        assert not backend.idle()
        for t in threads:
            t.join()
    assert status == 503 and "serve is stopping (SIGTERM)" in json.loads(body)["error"]["message"]
    assert got == [200, 200] and backend.idle()


def test_the_probe_answers_and_fails_within_its_timeout(upstream):
    got = probe_once(upstream, timeout=5)
    assert got.ok, got.error
    Upstream.hang.set()
    started = time.monotonic()
    got = probe_once(upstream, timeout=1)
    assert not got.ok and "no answer within 1 s" in got.error
    assert time.monotonic() - started < 4



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


def test_beside_a_long_answer_the_probe_decides_alive_or_hung():
    """A request holds the turn (its answer takes long, streamed or not): the
    probe goes beside it, and its answer, not the request's time, decides."""
    clock = Clock()
    backend = Backend(clock=clock)
    watch, _ = watch_with([ProbeResult(True, 0.1), ProbeResult(True, 0.2),
                           ProbeResult(False, 5.0, "no answer within 5 s")], backend, clock)
    watch._until_up()
    assert backend.admission.enter()  # a user's request holds the one slot
    try:
        flight = backend.begin(alone=False, streaming=False)
        clock.now += 60  # a minute without a byte of that answer
        watch._check()
        assert not watch.stalled()
        assert backend.in_flight() == [flight] and flight.cut is None
        watch._check()
        assert watch.stalled() and "the probe (a one-token completion) got no answer" in watch.why()
        assert flight.cut is not None and "restarting" in flight.cut  # told at once, not left hanging
    finally:
        backend.admission.leave()


def test_a_long_prompt_being_processed_is_alive_while_the_probe_waits_behind_it():
    """mlx-lm's batch takes no new request in while it processes a long
    prompt; its progress lines (real, from rank 0's log) are the sign of life."""
    clock = Clock()
    backend = Backend(clock=clock)
    no = ProbeResult(False, 5.0, "no answer within 5 s")
    watch, _ = watch_with([ProbeResult(True, 0.1), no, no, no], backend, clock)
    watch._until_up()
    backend.begin(alone=False, streaming=False)
    line = "[0] 2026-11-29 01:50:53,933 - INFO - Prompt processing progress: 2048/30000"
    assert watch.feed(line) == line  # still shown where lines go (the rank's log)
    clock.now += 4
    watch._check()
    assert not watch.stalled()
    clock.now += 4  # 8 s since the last progress line, limit 5
    watch._check()
    assert watch.stalled() and "the probe (a one-token completion) got no answer" in watch.why()


def test_a_request_mlx_lm_serves_alone_is_judged_by_its_bytes_or_not_at_all():
    """mlx-lm queues every other request behind one it serves alone: no probe
    is sent then (it would only wait); a stream's bytes are its progress."""
    clock = Clock()
    backend = Backend(clock=clock)
    sent = []
    watch = ProbeWatch(lambda t: sent.append(t) or ProbeResult(True, 0.1), backend, 4242, every=10,
                       timeout=5, start_timeout=60, on_up=lambda s: None, clock=clock)
    watch._until_up()
    sent.clear()
    silent = backend.begin(alone=True, streaming=False)
    clock.now += 600
    watch._check()
    assert sent == [] and not watch.stalled()
    backend.finish(silent)
    stream = backend.begin(alone=True, streaming=True)
    clock.now += 4
    backend.got_bytes(stream)
    clock.now += 4
    watch._check()
    assert sent == [] and not watch.stalled()
    clock.now += 2
    watch._check()  # 6 s without a byte, limit 5
    assert watch.stalled() and "a streamed answer got no byte" in watch.why()


@pytest.mark.parametrize("body, server_args, alone", [
    ({"messages": [{"role": "user", "content": "hi"}]}, (), False),
    ({"prompt": "hi", "seed": 7}, (), True),
    ({"prompt": "hi", "seed": None}, (), False),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, (), True),
    ({"prompt": "hi"}, ("--kv-bits", "4"), True),
    ({"prompt": "hi"}, ("--kv-bits=8",), True),
])
def test_which_requests_mlx_lm_serves_alone(body, server_args, alone):
    assert served_alone(json.dumps(body).encode(), server_args) is alone
    assert served_alone(b"{not json", server_args) is bool(server_args)


def test_a_slow_answer_is_waited_for_and_the_request_timeout_is_a_504(upstream):
    Upstream.delay = 1.5
    backend = Backend()
    backend.up(upstream)
    with Front("127.0.0.1", 0, backend) as front:
        status, _, body = post(front.port, "/v1/completions", {"prompt": "Hi"})
    assert status == 200 and json.loads(body)["echo"] == {"prompt": "Hi"}
    with Front("127.0.0.1", 0, backend, request_timeout=0.5) as front:
        started = time.monotonic()
        status, _, body = post(front.port, "/v1/completions", {"prompt": "Hi"})
        took = time.monotonic() - started
    assert status == 504, body
    assert "took longer than --request-timeout" in json.loads(body)["error"]["message"]
    assert took < 1.4  # at the limit, not at the answer
    assert backend.in_flight() == []


def test_a_hang_found_cuts_the_request_in_flight_with_a_503_saying_why(upstream):
    Upstream.hang.set()
    backend = Backend()
    backend.up(upstream)
    with Front("127.0.0.1", 0, backend) as front:
        threading.Timer(1.0, backend.down, ("restarting: the probe got no answer",)).start()
        started = time.monotonic()
        status, headers, body = post(front.port, "/v1/completions", {"prompt": "Hi"})
        took = time.monotonic() - started
    assert status == 503 and headers["Retry-After"] == str(RETRY_AFTER_S)
    assert "restarting: the probe got no answer" in json.loads(body)["error"]["message"]
    assert took < 5  # the upstream answer would take 30 s


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


def test_with_a_key_every_route_but_health_needs_it(upstream):
    import openai

    backend = Backend()
    backend.up(upstream)
    with Front("127.0.0.1", 0, backend, api_key="s3cret-key") as front:
        status, _, body = post(front.port, "/v1/completions", {"prompt": "Hi"})
        assert status == 401 and b"s3cret" not in body
        assert "a key is needed" in json.loads(body)["error"]["message"]
        conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
        conn.request("GET", "/health")  # open: load balancers and watchdogs hold no key
        assert conn.getresponse().status != 401
        conn.close()
        for headers in ({"Authorization": "Bearer s3cret-key"}, {"x-api-key": "s3cret-key"}):
            conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
            conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hi"}),
                         headers={"Content-Type": "application/json", **headers})
            assert conn.getresponse().status == 200, headers
            conn.close()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{front.port}/v1", api_key="wrong",
                               max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.completions.create(model="m", prompt="Hi")


def test_the_key_comes_from_one_place_and_an_open_bind_needs_one(tmp_path):
    from mlxcluster.errors import InputError
    from mlxcluster.serve.access import KEY_ENV, ApiKey, api_key_from, check_exposure

    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert api_key_from(None, str(key_file), {KEY_ENV: "from-env"}) == "from-file"
    assert api_key_from("given", None, {KEY_ENV: "from-env"}) == "given"
    assert api_key_from(None, None, {KEY_ENV: "from-env"}) == "from-env"
    assert api_key_from(None, None, {}) is None
    for given, file, env in (("a", str(key_file), {}), (None, None, {KEY_ENV: " "}),
                             (None, str(tmp_path / "none"), {})):
        with pytest.raises(InputError):
            api_key_from(given, file, env)
    check_exposure("127.0.0.1", None, False)
    check_exposure("0.0.0.0", "k", False)
    check_exposure("0.0.0.0", None, True)
    with pytest.raises(InputError, match="--bind 0.0.0.0 lets other machines reach the model"):
        check_exposure("0.0.0.0", None, False)
    assert "k3y" not in repr(ApiKey("k3y"))


def test_metrics_count_what_the_front_answered_and_ready_follows_the_probe(upstream):
    backend = Backend()
    with Front("127.0.0.1", 0, backend) as front:
        assert post(front.port, "/v1/completions", {"prompt": "Hi"})[0] == 503  # not up yet
        conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
        conn.request("GET", "/ready")
        assert conn.getresponse().status == 503
        conn.close()
        backend.up(upstream)
        backend.metrics.mark_ready(True)  # the probe's first answer
        for _ in range(3):
            assert post(front.port, "/v1/completions", {"prompt": "Hi"})[0] == 200
        assert post(front.port, "/v1/chat/completions", {"stream": True})[0] == 200
        conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
        conn.request("GET", "/ready")
        assert conn.getresponse().status == 200
        conn.close()
        seen = scrape(front.port)
    requests = "mlxcluster_serve_requests_total"
    assert seen[(requests, (("route", "/v1/completions"), ("status", "503")))] == 1
    assert seen[(requests, (("route", "/v1/completions"), ("status", "200")))] == 3
    assert seen[(requests, (("route", "/v1/chat/completions"), ("status", "200")))] == 1
    assert seen[(requests, (("route", "/ready"), ("status", "503")))] == 1
    latency = "mlxcluster_serve_request_seconds_count"
    assert seen[(latency, (("route", "/v1/completions"),))] == 3
    assert seen[("mlxcluster_serve_up", ())] == 1 and seen[("mlxcluster_serve_ready", ())] == 1
    assert seen[("mlxcluster_serve_in_flight_requests", ())] == 0


def test_tokens_are_read_from_an_answer_s_usage_json_or_streamed():
    from mlxcluster.serve.metrics import ServeMetrics

    metrics = ServeMetrics()
    metrics.usage_in(json.dumps({"choices": [], "usage": {"prompt_tokens": 7,
                                                          "completion_tokens": 11}}).encode())
    stream = (b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
              b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}\n\n'
              b"data: [DONE]\n\n")
    metrics.usage_in(stream)
    metrics.usage_in(b'data: {"choices": []}\n\ndata: [DONE]\n\n')  # no usage asked: none counted
    text = metrics.text().decode()
    assert "mlxcluster_serve_prompt_tokens_total 10.0" in text
    assert "mlxcluster_serve_completion_tokens_total 13.0" in text


def test_a_port_that_answers_no_http_is_someone_else_s_and_a_failure_not_a_dead_probe():
    """Seen in CI: rank 0's port, free when chosen, was taken by another job's
    ring, which answered the probe with its own bytes. The probe says so and
    the launch fails (a restart takes another port); nothing kills the probe's
    thread, which would hide every hang after it."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]

        def speak_no_http():
            conn, _ = other.accept()
            conn.recv(4096)
            conn.sendall(b"\x00\x17\xe3\x9a not http at all\r\n\r\n")
            conn.close()

        threading.Thread(target=speak_no_http, daemon=True).start()
        got = probe_once(port, timeout=5)
    assert not got.ok and got.foreign and f"another program holds port {port}" in got.error
    clock, backend = Clock(), Backend()
    watch, _ = watch_with([got], backend, clock)
    watch._until_up()
    assert watch.stalled() and "rank 0's port gave an answer that is not HTTP" in watch.why()

    def broken(timeout):
        raise ValueError("a bug")

    crashing = ProbeWatch(broken, Backend(), 1, every=0.1, timeout=1, start_timeout=60,
                          on_up=lambda s: None).start()
    poll_until(lambda: crashing.failure, 10, "the probe's failure said")
    assert crashing.stalled() and "the probe itself failed (ValueError: a bug)" in crashing.why()
    crashing.stop()


def test_a_server_gone_is_left_to_the_launcher_for_one_probe_limit():
    """Rank 0 killed: the probe finds no server listening before the launcher
    reports the exit (seen in CI); the exit, named, is the better cause. So
    a refused connection is a failure only when it lasts a probe limit."""
    clock, backend = Clock(), Backend()
    gone = ProbeResult(False, 0.0, "cannot connect (Connection refused)", refused=True)
    watch, _ = watch_with([ProbeResult(True, 0.1), gone, gone, gone], backend, clock)
    watch._until_up()
    watch._check()
    clock.now += 4
    watch._check()
    assert not watch.stalled()
    clock.now += 2  # 6 s since first found gone, limit 5
    watch._check()
    assert watch.stalled() and "cannot connect" in watch.why()


def test_admission_takes_slots_then_a_line_then_refuses_and_the_probe_never_waits():
    line = Admission(2, queue=1)
    assert line.enter() and line.enter()
    assert not line.try_enter()  # the probe: every slot taken, it goes beside
    waiter_in: list[bool] = []
    waiter = threading.Thread(target=lambda: waiter_in.append(line.enter()))
    waiter.start()
    poll_until(lambda: line.counts() == (2, 1), 5, "one waiting")
    with pytest.raises(QueueFull) as full:
        line.enter()
    assert (full.value.waiting, full.value.max_in_flight) == (2 - 1, 2)
    line.leave()
    waiter.join(5)
    assert waiter_in == [True] and line.counts() == (2, 0)
    line.leave()
    line.leave()
    assert line.try_enter() and line.counts() == (1, 0)
    gave_up = line.enter(given_up=lambda: True)  # a free slot: taken before any give-up check
    assert gave_up and line.counts() == (2, 0)
    assert line.enter(given_up=lambda: True) is False and line.counts() == (2, 0)


def test_a_drain_past_its_limit_says_what_it_cuts_then_stops():
    """serve/serving.py's Drain: nothing in flight, it stops at once; a
    request still in flight at the limit is named as cut, then it stops."""
    from mlxcluster.serve.serving import Drain

    said, stops = [], []
    backend = Backend()
    drain = Drain(backend, 0.5, said.append)
    drain.stop_now = stops.append
    drain.start(15)  # SIGTERM
    poll_until(lambda: stops, 5, "an idle drain stopped at once")
    assert stops == [15] and backend.stopping == "serve is stopping (SIGTERM)"
    assert [n.text for n in said] == ["SIGTERM: draining, no new requests; 0 in flight and 0 waiting "
                                      "may finish within 0.5 s (--drain-timeout); SIGTERM again stops "
                                      "at once"]
    said.clear()
    stops.clear()
    backend = Backend()
    assert backend.admission.enter()
    backend.begin(alone=False, streaming=True)
    drain = Drain(backend, 0.5, said.append)
    drain.stop_now = stops.append
    started = time.monotonic()
    drain.start(2)  # SIGINT
    poll_until(lambda: stops, 5, "the drain stopped at its limit")
    assert time.monotonic() - started >= 0.5
    assert "1 in flight" in said[0].text
    assert said[1].text == "drain: 1 request(s) still in flight and 0 waiting after 0.5 s: cut"


def test_a_server_that_ends_during_a_drain_stops_serve_not_a_restart():
    """Drain.server_ended: before a drain it does nothing (the restart loop
    decides); during one it says so and stops as at a second signal."""
    from mlxcluster.serve.serving import Drain

    said, stops = [], []
    backend = Backend()
    assert backend.admission.enter()
    backend.begin(alone=False, streaming=True)  # in flight: the drain waits
    drain = Drain(backend, 30, said.append)
    drain.stop_now = stops.append
    drain.server_ended("rank 1 exited with code -9")
    assert stops == [] and said == []
    drain.start(15)
    drain.server_ended("rank 1 exited with code -9")
    assert stops == [15]
    assert said[-1].text == "drain: rank 1 exited with code -9 during the drain: not launched again, stopping"


def test_left_out_max_in_flight_follows_the_backend_given_it_stays():
    """--max-in-flight left out: one until the backend is known, then 8 on ring
    and MPI (batched answers measured equal), 1 on JACCL (mlx-lm #1737) and
    NCCL; a value given is kept whatever the backend."""
    for backend, slots in (("ring", 8), ("mpi", 8), ("jaccl", 1), ("nccl", 1)):
        admission = Admission(None, 16)
        assert admission.max_in_flight == 1
        admission.settle(backend)
        assert admission.max_in_flight == slots, backend
    given = Admission(2, 16)
    given.settle("ring")
    assert given.max_in_flight == 2
