"""Is the served model answering? A one-token completion, every few seconds.

An idle mlx-lm server prints nothing, so silence proves nothing; a hung one
(a ring ``all_sum`` that never returns, mlx #4475; JACCL spinning on a lost
peer, mlx #4278) accepts the connection and then never answers. Only a
request that goes through every rank tells: a one-token completion does
(tensor parallel: every layer's all_sum; pipeline: every stage's send and
recv).

``ProbeWatch`` is the jobs layer's stall watch for a server: ``stalled()``
turns true when the server was not up within ``start_timeout`` of the
launch, or when a probe got no answer within ``probe_timeout``. A long
answer is never one: while a request is answered the probe goes beside it
(mlx-lm batches its one token with that answer), and for a request mlx-lm
serves alone, which holds every other back, no probe is sent (a stream's
bytes are then its progress). The jobs
layer then does what it does for any stall: every rank's state and Python
stacks saved, the rank that is not where the others are named with its
host, every rank stopped (jobs/run.py ``stop_stalled``), and the restart.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mlxcluster.jobs.stall import StallWatch
from mlxcluster.serve.front import Backend

PROBE_PATH = "/v1/completions"
# mlx-lm's server logs this at INFO for each chunk of a prompt it processes.
PREFILL_PROGRESS = re.compile(r" - INFO - Prompt processing progress: \d+/\d+")
# Greedy, one token: the cheapest request that runs the whole model on every rank.
PROBE_BODY = json.dumps({"prompt": "Hello", "max_tokens": 1, "temperature": 0.0}).encode()


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    seconds: float
    error: str = ""  # why not, when not ok
    foreign: bool = False  # what answered is no HTTP server: not mlx-lm's, whatever it is
    refused: bool = False  # no connection: the server is gone (not hung)


def probe_once(port: int, timeout: float) -> ProbeResult:
    """One one-token completion at 127.0.0.1:``port``, within ``timeout``."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", PROBE_PATH, body=PROBE_BODY,
                     headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        body = answer.read()
    except TimeoutError:
        return ProbeResult(False, time.monotonic() - started, f"no answer within {timeout:.0f} s")
    except OSError as err:
        return ProbeResult(False, time.monotonic() - started, f"cannot connect ({err.strerror or err})",
                           refused=True)
    except http.client.HTTPException as err:  # something answered, not an HTTP server
        return ProbeResult(False, time.monotonic() - started,
                           f"an answer that is not HTTP ({type(err).__name__}): another program "
                           f"holds port {port}?", foreign=True)
    finally:
        conn.close()
    seconds = time.monotonic() - started
    if answer.status != 200:
        return ProbeResult(False, seconds, f"HTTP {answer.status}: {body[:200].decode(errors='replace')}")
    return ProbeResult(True, seconds)


class ProbeWatch(StallWatch):
    """The stall watch of one launch of the server (see the module doc).

    ``probe`` is called with a timeout and returns a ProbeResult (the real
    one is ``probe_once`` on the tunnel's port); ``on_up`` is called once,
    with the first answer's seconds since the launch."""

    def __init__(self, probe: Callable[[float], ProbeResult], backend: Backend, port: int, *,
                 every: float, timeout: float, start_timeout: float,
                 on_up: Callable[[float], None], clock: Callable[[], float] = time.monotonic):
        super().__init__(timeout, clock=clock)
        self.probe, self.backend, self.port = probe, backend, port
        self.every, self.timeout, self.start_timeout = every, timeout, start_timeout
        self.on_up = on_up
        self.up_at: float | None = None
        self.failure: str | None = None  # why the server is taken as hung
        self.prefill_at: float | None = None  # mlx-lm's last "Prompt processing progress" line
        self.gone_since: float | None = None  # the probe first found no server listening
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="serve-probe", daemon=True)

    # -- the jobs layer's side (stall.StallWatch)

    def feed(self, line: str) -> str | None:
        # A server's lines are not progress, only answers are; but while a long
        # prompt is processed, mlx-lm's batch takes no other request in (the
        # probe waits), and its "Prompt processing progress" lines (every
        # chunk, through every rank) are then the server's sign of life.
        if PREFILL_PROGRESS.search(line):
            self.prefill_at = self.clock()
        return line

    def stalled(self, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        if self.failure is None and self.up_at is None and now - self.started > self.start_timeout:
            self.failure = (f"the server did not answer within {self.start_timeout:.0f} s of the "
                            "launch (--start-timeout)")
        return self.failure is not None

    def limit(self) -> float:
        return self.timeout if self.up_at is not None else self.start_timeout

    def why(self, detailed: bool = True) -> str:
        return self.failure or "no answer"

    def started_work(self) -> bool:
        return self.up_at is not None  # the server answered

    # -- the probing thread

    def start(self) -> ProbeWatch:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=self.timeout + 5)

    def _loop(self) -> None:
        while not self._stop.is_set() and self.failure is None:
            try:
                if self.up_at is None:
                    self._until_up()
                else:
                    self._check()
            except Exception as err:  # noqa: BLE001 (a dead probe thread would hide any hang)
                self._failed(f"the probe itself failed ({type(err).__name__}: {err})")
                return
            self._stop.wait(self.every if self.up_at is not None else 1.0)

    def _until_up(self) -> None:
        got = self.probe(self.timeout)
        self.backend.status.probed(got.ok, got.seconds, got.error)
        if got.foreign:  # rank 0's port is someone else's: launch again on another
            self._failed(f"rank 0's port gave {got.error}")
            return
        if got.ok:
            self.backend.metrics.mark_ready(True)
            self.up_at = self.clock()
            self.last_progress = self.up_at
            self.backend.up(self.port)
            self.on_up(self.up_at - self.started)

    def _check(self) -> None:
        alone = [f for f in self.backend.in_flight() if f.alone]
        if alone:
            self._check_alone(alone)
            return
        # Idle: the probe takes its turn as a request does. A request holding the
        # turn: the probe goes beside it, into mlx-lm's queue, and is batched with
        # it; however long that answer takes, the probe's one token comes.
        held = self.backend.admission.try_enter()
        try:
            got = self.probe(self.timeout)
        finally:
            if held:
                self.backend.admission.leave()
        now = self.clock()
        self.backend.status.probed(got.ok, got.seconds, got.error)
        self.backend.metrics.mark_ready(got.ok)
        self.gone_since = None if not got.refused else (self.gone_since or now)
        if got.ok:
            self.last_progress = now
        elif got.refused and now - self.gone_since <= self.timeout:
            pass  # rank 0's server is gone, not hung: its exit is the launcher's to report
        elif self.backend.in_flight() and self.prefill_at is not None \
                and now - self.prefill_at <= self.timeout:
            self.last_progress = now  # a long prompt is being processed: the probe waits behind it
        else:
            self._failed(f"the probe (a one-token completion) got {got.error} "
                         f"(--probe-timeout {self.timeout:.0f} s)")

    def _check_alone(self, flights: list) -> None:
        """mlx-lm answers these requests outside its batch and queues every
        other one, the probe too, until they are done: no probe is sent.
        A streamed one's bytes are its progress; a silent stream is a hang.
        A non-streamed one gives no sign until it is whole: only its own
        limit (--request-timeout) ends it."""
        now = self.clock()
        for flight in flights:
            if not flight.streaming:
                continue
            quiet = now - (flight.last_byte or flight.started)
            if quiet > self.timeout:
                self._failed(f"a streamed answer got no byte from rank 0's server for "
                             f"{quiet:.0f} s (--probe-timeout {self.timeout:.0f} s)")
                return
        self.last_progress = now

    def _failed(self, why: str) -> None:
        self.backend.down(f"restarting: {why}")
        self.failure = why
