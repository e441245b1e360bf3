"""Writing a worker process's attempts: their starts and their completions, one interface, an
inline and a batched version. This module writes attempts; the concerns that decide what to
write are the middleware (:mod:`cron_at_scale.worker.middleware`).

Both write through ``start_attempt``, the statement that also starts an
attempt: a succeeded attempt is closed, and its one-off job completed, in the
same round trip as the next start (see ``sql/worker.sql``). That is why the start
is sent by the writer (:meth:`BatchCompleter.start`, called by the
``IdempotentStart`` middleware) and not by the middleware itself: the start
carries the completions queued before it, one round trip per task instead of
two (a measured optimisation, ``docs/benchmarks.md``).

* :class:`InlineCompleter` writes each completion at once: an eager run
  (``task.apply()``) or a run inside the caller's transaction, whose caller
  reads the outcome next.
* :class:`BatchCompleter` queues them: the process's next start carries them,
  or, if no task follows within ``COMPLETION_DELAY`` seconds, its thread writes
  them, many per statement. Other concerns may put periodic statements on that
  thread (:meth:`BatchCompleter.every`; the ``Lease`` middleware's heartbeat,
  :func:`cron_at_scale.worker.middleware.lease.beat_on`), so that a pool
  process holds one background thread and one connection, not one per concern;
  what they run, and when, is theirs.

A completion not yet written when the process dies is not lost work: its
attempt's lease expires and the job runs again (at-least-once), as if the
worker had died while running it. A task that kills its process does so
after its start, which wrote the completions before it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol
from uuid import uuid4

from django.db import InterfaceError, OperationalError, connections

from cron_at_scale import conf
from cron_at_scale import sql as db

log = logging.getLogger(__name__)

# Seconds a completion waits for the process's next start_attempt to carry it
# before the thread writes it on its own.
COMPLETION_DELAY = 0.05


class Completer(Protocol):
    """Records that ``attempt`` of ``job_id`` succeeded."""

    def complete(self, job_id: str, attempt: int) -> None: ...


def write(job_id: str | None, attempt: int, worker: str, token: str | None, done: list[tuple[str, int]],
          fire_at: str | None = None):
    """One ``start_attempt``: start ``attempt`` of ``job_id`` (none if ``job_id`` is None) and
    complete the ``done`` (job_id, attempt) pairs. ``fire_at``: the message's (ISO 8601 text, the
    header's), which a recurring run's attempt must be scheduled at; None: not checked. The started
    attempt's row (by column name) or None."""
    return db.run("start_attempt", {
        "job_id": job_id, "attempt": attempt, "worker": worker, "token": token, "fire_at": fire_at,
        "lease": float(conf.get("RUN_LEASE")),
        "done_job_ids": [d[0] for d in done], "done_attempts": [d[1] for d in done],
    }, fetch="one")


def write_many(starts: list[tuple], worker: str) -> list:
    """One ``start_attempts``: start each ``(job_id, attempt, token)`` or ``(job_id, attempt, token,
    fire_at)`` (``fire_at`` as :func:`write`'s) of a batch in one statement and one synchronous
    commit. The rows of the attempts it started or recorded (each with its message's ``token``;
    ``outcome``: ``running``, ``cancelled``, ``skipped`` or ``early``); a message without a row is
    not to run (redelivered, superseded, or a recurring run's number now another occurrence's).
    Raises the database's errors."""
    return db.run("start_attempts", {
        "job_ids": [s[0] for s in starts], "attempts": [s[1] for s in starts], "tokens": [s[2] for s in starts],
        "fire_ats": [s[3] if len(s) > 3 else None for s in starts],
        "worker": worker, "lease": float(conf.get("RUN_LEASE")),
    })


def write_retry(params: dict, delay: float) -> int:
    """One ``retry_attempt``: close the attempt of ``params`` (``job_id``, ``attempt``, ``error``,
    ``traceback``) as retried, its one-off job pending again after ``delay`` seconds. Rows changed."""
    return db.run("retry_attempt", {**params, "delay": delay}, fetch="count")


def write_failure(params: dict) -> int:
    """One ``finish_attempt``: close the attempt of ``params`` (as :func:`write_retry`) as failed, and
    fail its one-off job still on it. Rows changed (1: the job failed, for the dead-letter queue)."""
    return db.run("finish_attempt", {**params, "outcome": "failed", "status": "failed"}, fetch="count")


# Seconds a start retries on one of several databases (SHARD_DATABASES) before it gives up: a
# restart's blip, not an outage, which would hold pool processes the other databases' jobs need.
SHARDED_START_HOLD = 2.0


class InlineCompleter:
    """Writes each completion now, on the calling thread."""

    def complete(self, job_id: str, attempt: int) -> None:
        write(None, 0, "", None, [(job_id, attempt)])


class BatchCompleter:
    """Queues completions for the process's next start, or its thread after ``COMPLETION_DELAY``."""

    def __init__(self) -> None:
        self.done: list[tuple[str, int, str]] = []  # (job_id, attempt, its database's alias)
        self.down_until: dict[str, float] = {}  # alias -> monotonic time: starts there are tried once
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.pid: int | None = None
        self.stopping = threading.Event()
        # (seconds, or a function returning them when the thread starts; fn) run on the thread
        self._periodic: list[tuple[float | Callable[[], float], Callable[[], None]]] = []
        self._warm: list[Callable[[], None]] = []
        self.warm = False  # run the warm-ups (a pool process's thread, ensure_thread(warm=True))

    def every(self, interval: float | Callable[[], float], fn: Callable[[], None],
              warm: Callable[[], None] | None = None) -> None:
        """Run ``fn`` every ``interval`` seconds on this completer's thread (its own connection).
        ``warm``, if given, runs as a thread started with ``ensure_thread(warm=True)`` starts, and
        after a failed run: it connects and prepares what ``fn`` needs, so that ``fn`` costs one
        round trip when it is due."""
        self._periodic.append((interval, fn))
        if warm is not None:
            self._warm.append(warm)

    def ensure_thread(self, warm: bool = False) -> None:
        """Start the thread in this process (a forked child starts its own); ``warm``: it runs the
        warm-ups of :meth:`every` (a connection of its own, at once)."""
        with self.cond:
            self.warm = self.warm or warm
            if self.thread is None or self.pid != os.getpid() or not self.thread.is_alive():
                if self.pid is not None and self.pid != os.getpid():
                    self.done = []  # a forked child's copy of its parent's queue: the parent's to write
                self.pid = os.getpid()
                self.stopping.clear()
                self.thread = threading.Thread(target=self._loop, name="cron_at_scale-completer", daemon=True)
                self.thread.start()

    def complete(self, job_id: str, attempt: int) -> None:
        """Hand over a succeeded attempt: the next start (or the thread) writes it."""
        self.ensure_thread()
        with self.cond:
            self.done.append((job_id, attempt, conf.db_alias()))
            self.cond.notify()

    def write_later(self, job_id: str, attempt: int) -> None:
        """Queue a succeeded attempt for the next start or :meth:`flush`, without the thread."""
        with self.cond:
            self.done.append((job_id, attempt, conf.db_alias()))

    def write_now(self, job_id: str, attempt: int) -> None:
        """Write a succeeded attempt now, on this thread, with any handed over before it."""
        self.write_later(job_id, attempt)
        self.flush()

    def start(self, job_id: str, attempt: int, worker: str, token: str | None = None, fire_at: str | None = None):
        """Start ``attempt`` of ``job_id`` and write the completions handed over so far, in one
        statement; the attempt's row (``outcome``, ``scheduled_at``, ...) or None if it is not to run.
        The outcome is ``running``, or ``cancelled``/``skipped`` (recorded, not to run).

        While PostgreSQL is unreachable (a restart, a failover) the start is tried again with a
        backoff for up to half the dispatch lease: the message is in hand, and an attempt still
        unstarted after its lease is fired again anyway. The same token goes with every try, so
        a try that committed without its reply is found, not skipped. Then the error is raised.

        With the shards on several databases (``SHARD_DATABASES``) a pool process held by one
        database's outage is one the others' jobs cannot use: the tries there stop after
        ``SHARDED_START_HOLD`` seconds, and then, until half a dispatch lease has passed since the
        last give-up, a start on that database gets one try (its attempt is fired again after its
        lease); a start that succeeds there ends that.

        ``token``: the run token of a start made earlier for this message (a batch started by the
        worker's main process): the attempt is confirmed still this message's, and its row read
        again, or None is returned (reaped and fired again meanwhile). ``fire_at``: the message's, as
        :func:`write`'s.
        """
        token = token or str(uuid4())
        began = time.monotonic()
        deadline = None  # worked out at the first failure: the path that succeeds reads no setting
        pause = 0.2
        while True:
            try:
                row = self._write(job_id, attempt, worker, token, fire_at)
                if self.down_until:
                    self.down_until.pop(conf.db_alias(), None)
                return row
            except (OperationalError, InterfaceError) as e:
                if deadline is None:
                    alias, hold = conf.db_alias(), float(conf.get("DISPATCH_LEASE")) / 2
                    several = len(conf.shard_aliases()) > 1
                    if several:
                        hold = 0.0 if self.down_until.get(alias, 0.0) > began else min(hold, SHARDED_START_HOLD)
                    deadline = began + hold
                if time.monotonic() + pause > deadline:
                    if several:
                        self.down_until[alias] = time.monotonic() + float(conf.get("DISPATCH_LEASE")) / 2
                    raise
                log.warning("starting job %s attempt %d: database unavailable (%s); trying again in %.1fs",
                            job_id, attempt, str(e).strip()[:200], pause)
                db.reset_connection()
                time.sleep(pause)
                pause = min(2.0, pause * 2)

    def flush(self) -> int:
        """Write the completions handed over so far (one statement per database); return how many.
        On a database error that database's completions stay queued, its connection is dropped
        (the next use reconnects), the other databases' are still written, and the first error is
        raised."""
        with self.cond:
            n = len(self.done)
            aliases = list(dict.fromkeys(d[2] for d in self.done))
        failed = None
        for alias in aliases:  # one statement per database (SHARD_DATABASES), else one
            with conf.using(alias):
                try:
                    self._write(None, 0, "", None)
                except Exception as e:  # one database down: the others' completions are still written
                    log.warning("writing completed attempts on database %r failed: %s", alias, str(e).strip()[:200])
                    db.reset_connection()
                    failed = failed or e
        if failed is not None:
            raise failed
        return n

    def _write(self, job_id: str | None, attempt: int, worker: str, token: str | None, fire_at: str | None = None):
        alias = conf.db_alias()
        with self.cond:
            batch = [d for d in self.done if d[2] == alias]
            self.done = [d for d in self.done if d[2] != alias] if len(batch) < len(self.done) else []
        try:
            return write(job_id, attempt, worker, token, [(d[0], d[1]) for d in batch], fire_at)
        except BaseException:
            with self.cond:
                self.done[:0] = batch
            raise

    def _warm_up(self) -> None:
        for warm in self._warm if self.warm else ():
            try:
                warm()
            except Exception:  # the database away: the periodic run connects when it is due
                log.warning("%s failed", getattr(warm, "__qualname__", warm), exc_info=True)
                db.reset_connection()
                return

    def _loop(self) -> None:
        periodic = [(float(i() if callable(i) else i), fn) for i, fn in self._periodic]
        self._warm_up()
        due = [time.monotonic() + interval for interval, _ in periodic]
        while not self.stopping.is_set():
            with self.cond:
                if not self.done:
                    self.cond.wait(max(0.0, min(due, default=time.monotonic() + 1.0) - time.monotonic()))
            if self.done and not self.stopping.is_set():  # the next task's start may carry them
                self.stopping.wait(COMPLETION_DELAY)
            try:  # keep going: a database blip must end neither the writes nor the periodic work
                self.flush()
            except Exception:  # flush dropped the failed database's connection
                log.exception("writing completed attempts failed; trying again")
                time.sleep(0.5)
            for i, (interval, fn) in enumerate(periodic):
                if time.monotonic() >= due[i]:
                    due[i] = time.monotonic() + interval
                    try:
                        fn()
                    except Exception:
                        log.exception("%s failed", getattr(fn, "__qualname__", fn))
                        db.reset_connection()
                        self._warm_up()  # connected again now, not in the lease of the next run
        connections.close_all()  # this thread's own

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued, end the thread and close its connection (worker shutdown, tests)."""
        self.stopping.set()
        with self.cond:
            self.cond.notify()
        if self.thread is not None and self.pid == os.getpid():
            self.thread.join(timeout)
        if self.done:
            self.flush()
