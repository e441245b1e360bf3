"""The lease of a running attempt: a heartbeat renews it while the task runs.

Every ``HEARTBEAT_INTERVAL`` seconds one statement renews the leases of the
attempts running in this process. It reports the jobs cancelled meanwhile
(``cancel_requested``) and the attempts whose lease had already run out and
that were reaped (``lease_lost``: the job fired again, a stall outlived
``RUN_LEASE``).

The statement runs on the process's writer thread (:func:`beat_on`,
:meth:`~cron_at_scale.worker.attempts.BatchCompleter.every`): a pool process
keeps one background thread and one connection for both its batched
completions and its heartbeat, rather than one of each per concern.
"""

from __future__ import annotations

import logging
import threading
import time

from cron_at_scale import conf
from cron_at_scale import sql as db
from cron_at_scale.worker.middleware.base import Middleware, Run
from cron_at_scale.worker.middleware.context import JobContext

log = logging.getLogger(__name__)


class Heartbeat:
    """The attempts running in this process, and the statement that renews their leases."""

    def __init__(self) -> None:
        self.running: dict[tuple[str, int], JobContext] = {}
        self.lock = threading.Lock()

    def add(self, ctx: JobContext) -> None:
        with self.lock:
            self.running[(str(ctx.job_id), ctx.attempt)] = ctx

    def remove(self, ctx: JobContext) -> None:
        with self.lock:
            self.running.pop((str(ctx.job_id), ctx.attempt), None)

    def warm(self) -> None:
        """Connect this thread and prepare the heartbeat (it renews nothing): a cold heartbeat costs
        the connection's and the statement's round trips too (about five), which on a slow link to
        PostgreSQL would come out of the first lease of the process's first task."""
        db.run("heartbeat", {"lease": float(conf.get("RUN_LEASE")), "job_ids": [], "attempts": []})

    def beat(self) -> None:
        """Renew the leases of the running attempts; flag the cancelled and the lost ones. One
        statement per database: one that fails has its connection dropped and the others' are
        still renewed; then the first error is raised."""
        with self.lock:
            running = dict(self.running)
        if not running:
            return
        lease, interval = float(conf.get("RUN_LEASE")), float(conf.get("HEARTBEAT_INTERVAL"))
        t0 = time.monotonic()
        by_alias = conf.by_job_alias(running, lambda k: k[0])  # one statement per database, else one
        rows, failed = [], None
        for alias, keys in by_alias.items():
            with conf.using(alias):
                try:
                    rows += db.run("heartbeat", {
                        "lease": lease,
                        "job_ids": [k[0] for k in keys],
                        "attempts": [k[1] for k in keys],
                    })
                except Exception as e:  # one database down must not cost the others' runs their leases
                    log.warning("heartbeat on database %r failed: %s", alias, str(e).strip()[:200])
                    db.reset_connection()
                    failed = failed or e
        took = time.monotonic() - t0
        if took > (lease - interval) / 2:  # the lease holds while took < RUN_LEASE - HEARTBEAT_INTERVAL
            log.warning("heartbeat of %d running attempts took %.1fs: the run lease (%.0fs) leaves %.1fs beyond "
                        "the heartbeat interval (%.0fs)", len(running), took, lease, lease - interval, interval)
        for row in rows:
            ctx = running.get((str(row.job_id), row.attempt))
            if ctx is None:
                continue
            if row.reason == "cancelled":
                ctx.cancel_requested = True
            elif not ctx.lease_lost:
                ctx.lease_lost = True
                log.warning("job %s attempt %d: lease lost (reaped while running, the job fired again); "
                            "its success will still be recorded", row.job_id, row.attempt)
        if failed is not None:
            raise failed


def beat_on(thread_host, heartbeat: Heartbeat) -> Heartbeat:
    """Run ``heartbeat`` every ``HEARTBEAT_INTERVAL`` seconds (read when the thread starts) on the
    thread of ``thread_host`` (the process's :class:`~cron_at_scale.worker.attempts.BatchCompleter`)."""
    thread_host.every(lambda: float(conf.get("HEARTBEAT_INTERVAL")), heartbeat.beat, warm=heartbeat.warm)
    return heartbeat


class Lease(Middleware):
    """Puts the run under the process's heartbeat while the task runs."""

    def __init__(self, heartbeat: Heartbeat, start_thread) -> None:
        self.heartbeat = heartbeat
        self.start_thread = start_thread  # the writer's thread runs the heartbeat (beat_on)

    def after_process_boot(self) -> None:
        self.start_thread(warm=True)  # its heartbeat connected and prepared before the first task needs it

    def before_run(self, run: Run) -> None:
        assert run.ctx is not None
        self.heartbeat.add(run.ctx)
        self.start_thread()

    def after_run(self, run: Run) -> None:
        if run.ctx is not None:
            self.heartbeat.remove(run.ctx)
