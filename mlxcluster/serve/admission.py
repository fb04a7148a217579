"""Who talks to rank 0's server, and when: serve's admission.

mlx-lm's server queues whatever it is sent, without bound and without a
limit per request (mlx-lm 0.32.2), and its distributed server fails on two
requests at once on JACCL (mlx-lm #1737). So the front holds the line:

- up to ``max_in_flight`` requests are passed on at once (serve's
  --max-in-flight, 1 by default: one at a time);
- up to ``queue`` more wait, served in arrival order (--queue);
- one more is refused at once (429 with Retry-After), never left hanging;
- a waiting client that goes away, or a serve that is stopping, gives up
  its place at once (``enter``'s ``given_up``).

The probe never waits in this line: it takes a free slot when nobody waits
(``try_enter``), and otherwise goes beside the requests in flight (probe.py).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

# How often a waiting request looks whether its client is still there.
GIVE_UP_CHECK_S = 0.5


class QueueFull(Exception):
    """``queue`` requests already wait: this one is refused at once."""

    def __init__(self, waiting: int, max_in_flight: int):
        super().__init__(f"{max_in_flight} request(s) in flight and {waiting} waiting")
        self.waiting, self.max_in_flight = waiting, max_in_flight


# Requests passed on at once when --max-in-flight is not given, by backend: 8 where
# mlx-lm's batched answers were measured equal, token for token, to the same requests
# one at a time (ring and MPI: 72 and 48 of them, docs/performance-runs.md, "serve");
# one at a time on JACCL, where two at once kill both ranks (mlx-lm #1737), and on
# NCCL, not measured.
BATCHED_IN_FLIGHT = {"ring": 8, "mpi": 8}


def default_in_flight(backend: str) -> int:
    return BATCHED_IN_FLIGHT.get(backend, 1)


class Admission:
    """Slots to rank 0 (``max_in_flight``) and an ordered line of ``queue``.
    ``max_in_flight`` None: one until ``settle`` names the backend."""

    def __init__(self, max_in_flight: int | None = 1, queue: int = 16):
        if (max_in_flight is not None and max_in_flight < 1) or queue < 0:
            raise ValueError("max_in_flight >= 1 and queue >= 0")
        self.given = max_in_flight is not None
        self.max_in_flight, self.queue = max_in_flight or 1, queue
        self._cond = threading.Condition()
        self._busy = 0  # slots taken (requests, or the probe while idle)
        self._line: deque[object] = deque()  # the waiting requests' tickets, in order

    def settle(self, backend: str) -> None:
        """The slots for ``backend`` (``default_in_flight``) unless given."""
        if not self.given:
            with self._cond:
                self.max_in_flight = default_in_flight(backend)
                self._cond.notify_all()

    def enter(self, given_up: Callable[[], bool] = lambda: False) -> bool:
        """Take a slot, waiting in line for it: True once taken (``leave``
        gives it back); False when ``given_up()`` turned true while waiting.
        Raises ``QueueFull`` at once when the line is full."""
        with self._cond:
            if self._busy < self.max_in_flight and not self._line:
                self._busy += 1
                return True
            if len(self._line) >= self.queue:
                raise QueueFull(len(self._line), self.max_in_flight)
            ticket = object()
            self._line.append(ticket)
            try:
                while not (self._line[0] is ticket and self._busy < self.max_in_flight):
                    self._cond.wait(GIVE_UP_CHECK_S)
                    if given_up():
                        return False
                self._busy += 1
                return True
            finally:
                self._line.remove(ticket)
                self._cond.notify_all()  # the next in line may go now

    def try_enter(self) -> bool:
        """A slot now, if one is free and nobody waits for it (the probe's way)."""
        with self._cond:
            if self._busy < self.max_in_flight and not self._line:
                self._busy += 1
                return True
            return False

    def leave(self) -> None:
        with self._cond:
            self._busy -= 1
            self._cond.notify_all()

    def counts(self) -> tuple[int, int]:
        """(slots taken, requests waiting)."""
        with self._cond:
            return self._busy, len(self._line)
