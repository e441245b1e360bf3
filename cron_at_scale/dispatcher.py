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
from datetime import timedelta

from django.db import InterfaceError, OperationalError, transaction

from . import conf, cron, db, dlq, failpoints
from .app import get_app
from .publish import Claimed, publish_batch

log = logging.getLogger(__name__)

# Cron occurrences missed by more than this are skipped rather than fired in a
# burst after downtime (seconds); the occurrence in hand always fires.
CATCHUP_WINDOW = 60.0


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
        self.name = name or default_name()
        self.batch_size = int(batch_size or conf.get("BATCH_SIZE"))
        self.poll_interval = float(conf.get("POLL_INTERVAL") if poll_interval is None else poll_interval)
        self.lease = float(lease or conf.get("DISPATCH_LEASE"))
        self.reaper_interval = float(conf.get("REAPER_INTERVAL"))
        self.max_lost = int(conf.get("MAX_LOST_ATTEMPTS"))
        self.app = app or get_app()
        self.stopping = threading.Event()
        self.claimed_total = 0
        self.published_total = 0
        self._next_reap = 0.0

    # -- one step -------------------------------------------------------------------------

    def claim(self) -> list[Claimed]:
        """Claim up to ``batch_size`` due jobs and move claimed cron jobs to their next fire_at.

        One transaction: the claim statement, then (only if cron jobs were
        claimed) one statement advancing them.
        """
        with transaction.atomic():
            rows = db.run("claim", {"limit": self.batch_size, "dispatcher": self.name, "lease": self.lease}, retries=0)
            batch = [Claimed.from_row(r) for r in rows]
            if not batch:
                return batch
            db_now = rows[0][10]
            ids, fire_ats = [], []
            for c in batch:
                if c.schedule_type == "cron":
                    start = max(c.fire_at, db_now - timedelta(seconds=CATCHUP_WINDOW))
                    ids.append(c.job_id)
                    fire_ats.append(cron.next_fire_time(c.cron_expr, c.timezone, start))
            if ids:
                db.run("advance_cron", {"ids": ids, "fire_ats": fire_ats}, fetch="count", retries=0)
        return batch

    def tick(self) -> int:
        """Claim one batch and publish it; return the number of jobs claimed."""
        batch = self.claim()
        if batch:
            failpoints.hit("dispatcher.after_claim")
            self.claimed_total += len(batch)
            try:
                self.published_total += publish_batch(self.app, batch)
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
            publish_batch(self.app, refire)
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
        log.info("dispatcher %s stopped: %d claimed, %d published", self.name, self.claimed_total, self.published_total)

    def stop(self, *_args) -> None:
        self.stopping.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
