"""The dispatcher: claim due jobs from PostgreSQL, publish them, reap expired leases.

Any number of dispatchers may run at once: the claim statement locks rows
with ``FOR UPDATE SKIP LOCKED`` and changes their state in the same
statement, so no row is claimed twice. Every "is it due" and lease decision
uses the database's ``now()``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import replace

from django.db import InterfaceError, OperationalError, transaction

from . import conf, db, dlq, failpoints
from .app import get_app
from .publish import Claimed, Publisher
from .recurrence import Recurrence, plan

log = logging.getLogger(__name__)

def default_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Dispatcher:
    """Claims due jobs in batches and publishes them to the Celery broker.

    ``batch_size`` jobs per claim statement; ``poll_interval`` seconds of
    sleep when nothing is due (none after a full batch); ``lease`` seconds
    of dispatch lease per claimed attempt.
    """

    def __init__(self, name: str | None = None, batch_size: int | None = None,
                 poll_interval: float | None = None, lease: float | None = None, app=None):
        conf.check()
        self.name = name or default_name()
        self.batch_size = int(batch_size or conf.get("BATCH_SIZE"))
        self.poll_interval = float(conf.get("POLL_INTERVAL") if poll_interval is None else poll_interval)
        self.lease = float(lease or conf.get("DISPATCH_LEASE"))
        self.reaper_interval = float(conf.get("REAPER_INTERVAL"))
        self.max_lost = int(conf.get("MAX_LOST_ATTEMPTS"))
        self.app = app or get_app()
        self.publisher = Publisher(self.app)
        self.stopping = threading.Event()
        self.claimed_total = 0
        self.published_total = 0
        self._next_reap = 0.0

    # -- one step -------------------------------------------------------------------------

    def claim(self) -> list[Claimed]:
        """Claim up to ``batch_size`` due jobs; return the runs to publish.

        One transaction: the claim statement, then (only if recurring jobs
        were claimed) one statement moving them to their next occurrence and
        logging the runs they fire now (see :mod:`cron_at_scale.recurrence`).
        """
        with transaction.atomic():
            rows = db.run("claim", {"limit": self.batch_size, "dispatcher": self.name, "lease": self.lease}, retries=0)
            runs = [Claimed.from_row(r) for r in rows if r[3] == "once"]
            recurring = [r for r in rows if r[3] != "once"]
            if recurring:
                runs += self._advance(recurring)
        return runs

    def _advance(self, rows) -> list[Claimed]:
        moved = {k: [] for k in ("ids", "fire_ats", "occurrences", "n_attempts", "missed", "skipped", "buffers")}
        logged = {k: [] for k in ("a_job_ids", "a_attempts", "a_scheduled", "a_outcomes")}
        runs: list[Claimed] = []
        for row in rows:
            base = Claimed.from_row(row)
            interval, occurrence_at, catchup, window, overlap, jitter, buffered_at, db_now, running = row[10:19]
            rec = Recurrence(str(base.job_id), base.schedule_type, base.cron_expr, base.timezone, interval,
                             jitter, catchup, window, overlap)
            occurrence_at = occurrence_at or base.fire_at
            if buffered_at is None and base.fire_at < occurrence_at:
                buffered_at = base.fire_at  # fire_at moved before the schedule ("run now"): one extra run
            p = plan(rec, occurrence_at, db_now, running=running, buffered=buffered_at)
            attempt = base.attempts
            for (occ, due_at), outcome in [*((s, "skipped") for s in p.skipped), *((f, "dispatched") for f in p.fire)]:
                attempt += 1
                logged["a_job_ids"].append(base.job_id)
                logged["a_attempts"].append(attempt)
                logged["a_scheduled"].append(due_at)
                logged["a_outcomes"].append(outcome)
                if outcome == "dispatched":
                    runs.append(replace(base, attempt=attempt, fire_at=due_at, occurrence=occ))
            for key, value in zip(moved, (base.job_id, p.next_fire_at, p.next_occurrence, attempt - base.attempts,
                                          p.missed, len(p.skipped), p.buffer)):
                moved[key].append(value)
            if p.missed or p.skipped:
                log.warning("job %s: %d occurrences missed (catch-up %s, window %.0fs), %d skipped (overlap %s)",
                            base.job_id, p.missed, catchup, window, len(p.skipped), overlap)
        db.run("advance_recurring", {**moved, **logged, "lease": self.lease}, fetch="count", retries=0)
        return runs

    def tick(self) -> int:
        """Claim one batch and publish it; return the number of jobs claimed."""
        batch = self.claim()
        if batch:
            failpoints.hit("dispatcher.after_claim")
            self.claimed_total += len(batch)
            try:
                self.published_total += self.publisher.publish(batch)
            except Exception:
                # Claimed but not sent: their leases expire and the reaper fires them again.
                log.exception("publishing %d claimed jobs failed; the reaper will re-fire them", len(batch))
            log.info("dispatched batch", extra={"claimed": len(batch), "dispatcher": self.name,
                                                "first_job": str(batch[0].job_id)})
        return len(batch)

    def reap(self) -> int:
        """Handle attempts whose lease expired; return how many were reaped.

        One transaction marks them lost, puts their one-off jobs back to
        pending (or fails them after ``MAX_LOST_ATTEMPTS``) and gives lost
        cron runs a new attempt for the same occurrence; after the commit,
        those runs are published and failed jobs announced on the DLQ.
        """
        refire: list[Claimed] = []
        with transaction.atomic():
            lost = db.run("reap", {"limit": self.batch_size}, retries=0)
            if not lost:
                return 0
            failed = db.run("reap_once", {"job_ids": [r[0] for r in lost], "attempts": [r[1] for r in lost],
                                          "max_lost": self.max_lost}, retries=0)
            once = {r[0] for r in failed}
            for job_id, _attempt, scheduled_at in lost:
                if job_id in once:
                    continue
                rows = db.run("refire_cron", {"job_id": job_id, "scheduled_at": scheduled_at,
                                              "max_lost": self.max_lost, "lease": self.lease}, retries=0)
                refire += [Claimed.from_row(r) for r in rows]
        log.warning("reaped %d expired leases (%d cron runs fired again): %s", len(lost), len(refire),
                    ", ".join(f"{r[0]}:{r[1]}" for r in lost[:10]))
        if refire:
            self.publisher.publish(refire)
        for job_id, status, attempt, task in failed:
            if status == "failed":
                dlq.announce(self.app, job_id, attempt, task, f"lost {self.max_lost} attempts (lease expired each time)")
        return len(lost)

    # -- the loop -------------------------------------------------------------------------

    def run(self, max_seconds: float | None = None) -> None:
        """Loop until ``stop()`` (or SIGTERM/SIGINT via ``install_signal_handlers``).

        A claimed batch is always published before the loop exits. Database
        errors (a restart) are logged and retried after a short pause.
        """
        deadline = time.monotonic() + max_seconds if max_seconds else None
        log.info("dispatcher %s started (batch %d, poll %.3fs, lease %.1fs)",
                 self.name, self.batch_size, self.poll_interval, self.lease)
        pause = 0.0
        while not self.stopping.is_set():
            if deadline and time.monotonic() > deadline:
                break
            try:
                now = time.monotonic()
                if now >= self._next_reap:
                    self._next_reap = now + self.reaper_interval
                    self.reap()
                n = self.tick()
                pause = 0.0
            except (OperationalError, InterfaceError) as e:
                pause = min(5.0, (pause or 0.1) * 2)
                log.warning("database unavailable (%s); retrying in %.1fs", str(e).strip()[:200], pause)
                db.reset_connection()
                self.stopping.wait(pause)
                continue
            if n < self.batch_size:
                self.stopping.wait(self.poll_interval)
        self.publisher.close()
        log.info("dispatcher %s stopped: %d claimed, %d published", self.name, self.claimed_total, self.published_total)

    def stop(self, *_args) -> None:
        self.stopping.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
