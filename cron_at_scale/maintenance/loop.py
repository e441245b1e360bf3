"""The shape of a maintenance loop: a pass every ``interval`` seconds, one error policy.

Each loop is an instance (its timer is its own: two dispatchers in one process never share
one); the dispatcher owns its loops (``Dispatcher.maintenance``) and calls ``maybe_run()``
between claims; :class:`~cron_at_scale.dispatcher.floors.FloorProbe` calls ``run_pass()``
from a thread of its own.

``run_once()`` is one pass, now, and returns what it did (a count); it raises what goes wrong.
``maybe_run(now)`` runs a pass when it is ``due(now)``: enabled and its next pass's time come.
That time is set when a pass ends, failed or not: ``next_pass(started, seconds)``, by default
``interval`` seconds after the pass started (the reaper waits longer after a slow pass).

The error policy (``run_pass()``): the database's connection errors (``OperationalError``,
``InterfaceError``) go up to the caller, which owns the connection (the dispatcher's loop
pauses and resets it, as after a failed claim; the probe's thread does the same); any other
exception is logged with the loop's name and the pass counts as done: ``idle`` is returned and
the next pass comes after the interval. Nothing else escapes into the claim loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from django.db import InterfaceError, OperationalError

log = logging.getLogger(__name__)

CONNECTION_ERRORS = (OperationalError, InterfaceError)  # the caller's: it pauses and resets the connection


class Loop:
    """A maintenance loop: ``interval`` seconds between passes (``next_pass`` may ask for more);
    ``run_once()`` for one pass; ``maybe_run(now)`` between claims. Subclasses set ``name`` (in
    the logs), ``idle`` (what ``maybe_run`` returns when no pass ran or a pass failed) and
    ``idle_only`` (the dispatcher runs the loop only when its last claim left nothing due)."""

    name: ClassVar[str] = "maintenance loop"
    idle: ClassVar[Any] = 0
    idle_only: ClassVar[bool] = False

    interval: float

    def __init__(self, interval: float | None = None) -> None:
        if interval is not None:  # None: a subclass gives its own (a property)
            self.interval = float(interval)
        self._next = 0.0  # monotonic time of the next pass: the first call runs one

    def run_once(self) -> Any:
        """One pass now; returns what it did. Raises what goes wrong (see ``run_pass``)."""
        raise NotImplementedError

    def enabled(self) -> bool:
        """False: the loop is off (a setting), no pass runs and its timer is left alone."""
        return True

    def next_pass(self, started: float, seconds: float) -> float:
        """The monotonic time of the next pass, after one that started at ``started`` and took
        ``seconds``: ``interval`` seconds after its start."""
        return started + self.interval

    def due(self, now: float | None = None) -> bool:
        """Whether a pass is due at ``now`` (monotonic; default: now)."""
        now = time.monotonic() if now is None else now
        return now >= self._next and self.enabled()

    def maybe_run(self, now: float | None = None) -> Any:
        """A pass if one is due at ``now`` (monotonic; default: now), under the error policy;
        returns what it did, ``idle`` when no pass ran."""
        now = time.monotonic() if now is None else now
        if not self.due(now):
            return self.idle
        return self.run_pass(now)

    def run_pass(self, now: float | None = None) -> Any:
        """A pass now under the error policy (``now``: monotonic, the time it counts from): the
        connection errors raised, any other logged with the loop's name (``idle`` returned); the
        next pass's time set either way."""
        now = time.monotonic() if now is None else now
        started = time.monotonic()
        try:
            try:
                return self.run_once()
            finally:  # whatever the pass did, even a KeyboardInterrupt
                self._next = self.next_pass(now, time.monotonic() - started)
        except CONNECTION_ERRORS:
            raise
        except Exception:  # noqa: BLE001 (a maintenance loop must never stop the dispatcher)
            logging.getLogger(type(self).__module__).exception(
                "%s failed; trying again in %.0fs", self.name, max(0.0, self._next - now))
            return self.idle

    def __repr__(self) -> str:
        return f"<{type(self).__name__} every {self.interval:g}s>"


class LoopThread:
    """Runs ``loops`` (their ``maybe_run()``) every ``tick`` seconds on a thread of their own, on
    a database connection of its own (Django's are per thread), so that a long pass (a purge
    catching up, a history trim) never holds up the loop that claims and publishes. A connection
    error is logged and the connection reset (the next tick tries again); other errors follow
    the loops' own policy (``run_pass``). ``start()``/``stop()``; ``running`` while the thread is."""

    def __init__(self, loops: Sequence[Loop], name: str, tick: float = 0.2) -> None:
        self.loops = list(loops)
        self.name = name
        self.tick = tick
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self.thread is not None

    def start(self) -> None:
        if self.thread is None:
            self.stopping.clear()
            self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self.thread.start()

    def stop(self) -> None:
        if self.thread is not None:
            self.stopping.set()
            self.thread.join()
            self.thread = None

    def _loop(self) -> None:
        from django.db import connections

        from cron_at_scale import sql as db

        try:
            while not self.stopping.wait(self.tick):
                for loop in self.loops:
                    if self.stopping.is_set():
                        break
                    try:
                        loop.maybe_run()
                    except CONNECTION_ERRORS as e:
                        log.warning("%s: database unavailable (%s)", loop.name, str(e).strip()[:200])
                        db.reset_connection()
        finally:
            connections.close_all()  # this thread's own
