"""Runs claimed ahead of their time (within the look-ahead), held until they go out.

A claim of a full batch keeps the dispatcher's loop busy for tens of milliseconds
(PostgreSQL's statement, then the rows in Python); a run held on that loop would
wait for it. So in ``Dispatcher.run`` the held runs go out from a thread of their
own, in slices of ``TIMER_SLICE`` (a few ms late at most, never early, and not a
publish per run at thousands of runs a second), whatever the loop is doing.
Without the thread (``Dispatcher.step`` driven by Celery beat, tools, tests), the
loop sends them itself, between claims.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

from cron_at_scale.dispatcher.claimed import Claimed

log = logging.getLogger(__name__)

TIMER_SLICE = 0.005  # seconds between two sends of held runs


class HeldRuns:
    """A heap of ``(monotonic time to send, run)``, safe to use from two threads.

    ``start(fire)`` runs ``fire()`` on a thread of its own whenever the earliest held run's
    time has come (at most once per ``TIMER_SLICE``); ``fire`` takes what is due with
    :meth:`pop_due`. ``stop()`` ends the thread and leaves what is still held.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Claimed]] = []
        self._seq = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def running(self) -> bool:
        """True while the thread sends the held runs."""
        return self._thread is not None

    def hold(self, runs: list[tuple[float, Claimed]]) -> None:
        """Hold each ``(monotonic time to send, run)`` of ``runs``."""
        if not runs:
            return
        with self._cond:
            for at, run in runs:
                self._seq += 1
                heapq.heappush(self._heap, (at, self._seq, run))
            self._cond.notify()

    def next_at(self) -> float | None:
        """Monotonic time the earliest held run is to go out, or None."""
        with self._cond:
            return self._heap[0][0] if self._heap else None

    def pop_due(self, until: float) -> list[Claimed]:
        """Take the held runs whose time is ``until`` (monotonic) or earlier, earliest first."""
        due = []
        with self._cond:
            while self._heap and self._heap[0][0] <= until:
                due.append(heapq.heappop(self._heap)[2])
        return due

    def start(self, fire: Callable[[], object]) -> None:
        """Send from a thread of its own from now on: ``fire()`` when a held run's time comes."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, args=(fire,), name="cron_at_scale-timers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread (what is still held stays held)."""
        if self._thread is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        self._thread = None

    def _loop(self, fire: Callable[[], object]) -> None:
        last = 0.0
        while True:
            with self._cond:
                if self._stopping:
                    return
                now = time.monotonic()
                if not self._heap:
                    self._cond.wait(1.0)
                    continue
                at = max(self._heap[0][0], last + TIMER_SLICE)
                if at > now:
                    self._cond.wait(at - now)
                    continue
            last = now
            try:
                fire()
            except Exception:  # a run not sent is reaped and fired again after its lease
                log.exception("sending held runs failed")
