"""What serve's status page shows (``GET /`` or ``/status``): a snapshot of
the served model, its ranks, the line at the front, the recent rates, the
restarts and the last probe, gathered as they happen (``ServeStatus``) and
read with the counters of /metrics, so that the page and /metrics agree.

The page itself is ``status_page.render``: one self-contained HTML page
(no script, no request but itself) that reloads itself every few seconds.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field

PATHS = ("/", "/status")  # where the front answers with the page
# The rates and the time to first token are over this window.
WINDOW_S = 60.0
KEPT_EVENTS = 20  # restarts shown, newest first


@dataclass(frozen=True)
class ProbeSeen:
    at: float  # time.time()
    ok: bool
    seconds: float
    error: str = ""


@dataclass(frozen=True)
class StatusView:
    """Everything the page shows, numbers read once."""

    model: str
    split: str
    address: str
    run_id: str
    ranks: tuple[tuple[int, str], ...]  # (rank, host) of this launch
    hosts: tuple[str, ...]  # each host's line of the split verdict (memory, weights)
    up: bool
    ready: bool
    why_down: str
    stopping: str | None
    requests: int  # answered on the model's routes, /v1/... (mlxcluster_serve_requests_total)
    by_status: tuple[tuple[str, int], ...]
    completion_tokens: int
    in_flight: int
    waiting: int
    max_in_flight: int
    queue: int
    requests_per_s: float
    tokens_per_s: float
    ttft_median_s: float | None
    launches: int
    restarts: tuple[tuple[float, str], ...]  # (time.time(), cause), newest first
    probe: ProbeSeen | None
    now: float = field(default_factory=time.time)


class ServeStatus:
    """What the page needs beyond the counters, kept as it happens."""

    def __init__(self, clock=time.time):
        self.clock = clock
        self._lock = threading.Lock()
        self.about: dict[str, str] = {"model": "?", "split": "?", "address": "?", "run_id": "?"}
        self.started = clock()
        self.hosts: tuple[str, ...] = ()
        self.ranks: tuple[tuple[int, str], ...] = ()
        self._answers: deque[tuple[float, int]] = deque()  # (time, completion tokens)
        self._first_bytes: deque[tuple[float, float]] = deque()  # (time, seconds)
        self._restarts: deque[tuple[float, str]] = deque(maxlen=KEPT_EVENTS)
        self.probe: ProbeSeen | None = None

    def describe(self, **about: str) -> None:
        self.about.update(about)

    def split_judged(self, host_lines: list[str]) -> None:
        self.hosts = tuple(host_lines)

    def launched(self, hosts: list[str]) -> None:
        self.ranks = tuple(enumerate(hosts))

    def answered(self, tokens: int) -> None:
        with self._lock:
            self._answers.append((self.clock(), tokens))
            self._trim()

    def first_byte(self, seconds: float) -> None:
        with self._lock:
            self._first_bytes.append((self.clock(), seconds))
            self._trim()

    def restarted(self, cause: str) -> None:
        with self._lock:
            self._restarts.appendleft((self.clock(), cause))

    def probed(self, ok: bool, seconds: float, error: str = "") -> None:
        self.probe = ProbeSeen(self.clock(), ok, seconds, error)

    def _trim(self) -> None:
        since = self.clock() - WINDOW_S
        for window in (self._answers, self._first_bytes):
            while window and window[0][0] < since:
                window.popleft()

    def recent(self) -> tuple[float, float, float | None, tuple[tuple[float, str], ...]]:
        """(requests/s, tokens/s, median time to first byte, restarts) over WINDOW_S."""
        with self._lock:
            self._trim()
            answers, firsts = list(self._answers), [s for _, s in self._first_bytes]
            restarts = tuple(self._restarts)
        ttft = statistics.median(firsts) if firsts else None
        return (len(answers) / WINDOW_S, sum(t for _, t in answers) / WINDOW_S, ttft, restarts)
