"""serve's status page (mlxcluster/serve/status.py, status_page.py): what it
shows, escaped; served by the front with the key in its URL or header. The
page in Chromium against real ranks is in tests/test_serve.py."""

from __future__ import annotations

import http.client
import json

from mlxcluster.serve.front import Backend, Front, status_view
from mlxcluster.serve.status import ServeStatus, StatusView
from mlxcluster.serve.status_page import render
from tests.fakes import Clock


def test_the_recent_window_keeps_a_minute_and_restarts_newest_first():
    clock = Clock(1_800_000_000.0)
    status = ServeStatus(clock)
    status.answered(60)
    status.first_byte(0.5)
    clock.now += 30
    status.answered(120)
    status.first_byte(0.1)
    status.first_byte(0.2)
    status.restarted("rank 1 on studio2 is stopped")
    clock.now += 40  # the first answer is 70 s old: out of the window
    status.restarted("rank 0 exited with code 1")
    per_s, tokens_per_s, ttft, restarts = status.recent()
    assert per_s == 1 / 60 and tokens_per_s == 2.0 and abs(ttft - 0.15) < 1e-9
    assert [cause for _, cause in restarts] == ["rank 0 exited with code 1",
                                                "rank 1 on studio2 is stopped"]


def view(**changed) -> StatusView:
    base = dict(model="Qwen3-4B-4bit", split="tensor", address="http://127.0.0.1:8080/v1",
                run_id="mlxserve-0123456789", ranks=((0, "studio1"), (1, "studio2")),
                hosts=("studio1: rank 0: 1.1 GiB of weights: fits",), up=True, ready=True,
                why_down="", stopping=None, requests=12, by_status=(("200", 10), ("429", 2)),
                completion_tokens=3456, in_flight=1, waiting=2, max_in_flight=1, queue=16,
                requests_per_s=0.2, tokens_per_s=41.5, ttft_median_s=0.123, launches=2,
                restarts=((1_800_000_000.0, "the probe got no answer <within 30 s>"),),
                probe=None, now=1_800_000_010.0)
    return StatusView(**{**base, **changed})


def test_the_page_shows_every_number_and_escapes_what_it_did_not_write():
    page = render(view(model="<script>x</script>")).decode()
    for shown in ("in flight", ">1<", "at most 1 at once", ">2<", "at most 16; more get 429",
                  "0.20", "41.5", "123 ms", ">12<", "200: 10, 429: 2", ">3456<", "studio2",
                  "1.1 GiB of weights: fits", "mlxserve-0123456789", "ready"):
        assert shown in page, shown
    assert "<script>x" not in page and "&lt;script&gt;x" in page
    assert "the probe got no answer &lt;within 30 s&gt;" in page
    assert '<meta http-equiv="refresh" content="5">' in page and "<script" not in page
    assert "src=" not in page and "href=\"http" not in page  # nothing else is asked for
    stopping = render(view(stopping="serve is stopping (SIGTERM)", up=False, ready=False)).decode()
    assert "stopping: serve is stopping (SIGTERM)" in stopping


def test_the_front_serves_the_page_with_the_key_in_its_url_or_header():
    backend = Backend()
    backend.status.describe(model="tiny", split="tensor", address="http://127.0.0.1:1/v1",
                            run_id="mlxserve-x", model_path="/models/tiny")
    backend.status.probed(False, 30.0, "no answer within 30 s")
    with Front("127.0.0.1", 0, backend, api_key="sekrit") as front:
        def get(path: str, headers: dict | None = None) -> tuple[int, str]:
            conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
            conn.request("GET", path, headers=headers or {})
            answer = conn.getresponse()
            got = answer.status, answer.read().decode()
            conn.close()
            return got

        assert get("/status")[0] == 401
        assert get("/?key=wrong")[0] == 401
        assert get("/v1/models?key=sekrit")[0] == 401  # the URL carries it for the page only
        status, page = get("/?key=sekrit")
        assert status == 200 and "tiny" in page and "not answered (no answer within 30 s)" in page
        assert "starting" in page  # not up yet: why
        assert get("/status", {"Authorization": "Bearer sekrit"})[0] == 200
        # /v1/models from the front: mlx-lm's fails on a host with no Hugging Face cache
        status, listed = get("/v1/models", {"Authorization": "Bearer sekrit"})
        assert status == 200 and [m["id"] for m in json.loads(listed)["data"]] == ["/models/tiny"]
    shown = status_view(backend)
    # the model's routes only (/v1/...): the refused /v1/models, not the page's own requests
    assert (shown.requests, shown.by_status, shown.in_flight) == (2, (("200", 1), ("401", 1)), 0)


def test_a_model_from_a_hugging_face_cache_is_named_by_its_id_not_its_commit():
    """`serve ORG/NAME` serves a snapshot folder whose own name is a commit hash:
    the terminal, serve.log, the status page and `jobs` say ORG/NAME."""
    from mlxcluster.serve.session import served_name

    snapshot = "/Users/me/.cache/huggingface/hub/models--mlx-community--Qwen3-4B-4bit/snapshots/ab12cd"
    assert served_name(snapshot) == "mlx-community/Qwen3-4B-4bit"
    assert served_name(snapshot + "/") == "mlx-community/Qwen3-4B-4bit"
    assert served_name("/models/models--a--b-c.d_e/snapshots/0f") == "a/b-c.d_e"
    assert served_name("/Users/me/models/Qwen3-4B-4bit") == "Qwen3-4B-4bit"
    assert served_name("/Users/me/models/Qwen3-4B-4bit/") == "Qwen3-4B-4bit"
    # a folder inside a snapshot, or a snapshots folder elsewhere, keeps its own name
    assert served_name(snapshot + "/sub") == "sub"
    assert served_name("/data/snapshots/ab12") == "ab12"
