"""The reaper: attempts whose lease expired go back to work, or to the dead-letter queue.

A worker that dies, or a broker that loses a message, leaves an attempt whose
``locked_until`` passes without a finish (the database is the source of
truth: the broker may lose anything). Each pass of the reaper, in one
transaction, marks up to ``batch_size`` such attempts lost, puts their one-off
jobs back to ``pending`` (or fails them after ``max_lost`` lost attempts), and
gives each lost cron run a new attempt for the same occurrence (a run past its
job's ``expires`` is recorded skipped instead, see :mod:`cron_at_scale.policy.expiry`;
a one-off job with ``expires`` keeps its ``fire_at``, so that its claim skips
it once past). After the
commit the re-fired runs are published and failed jobs announced on the DLQ.

A small service with its own interval and batch size that the dispatcher's
loop calls (a :class:`~cron_at_scale.maintenance.loop.Loop`: ``maybe_run``, or ``maybe_reap``),
as River's job rescuer is beside its client.
Every dispatcher reaps; two reaping at once never take the same attempt (the
``reap`` statement locks rows with ``SKIP LOCKED``).

Leases are on the database's clock, and that clock can step (NTP, a VM restored,
a failover to a host whose clock differs). Each pass reads it and compares it with
the last reading carried forward on this process's monotonic clock. A step forward
would expire every running lease at once, heartbeats current or not: running
attempts are then not reaped for ``RUN_LEASE`` (every live heartbeat renews its
lease on the new clock within that), and the ``reap`` statement itself refuses to
reap a running attempt when the clock it runs on is past this reading (a step
between the two). A step back would keep a dead worker's lease that much longer:
the running leases written before it are counted on the monotonic clock instead,
and reaped (``reap_stale``) when they run out there with no heartbeat since.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import transaction

from cron_at_scale import conf
from cron_at_scale import sql as db
from cron_at_scale.broker import dlq
from cron_at_scale.dispatcher.claimed import Claimed, drop_expired
from cron_at_scale.maintenance.loop import Loop
from cron_at_scale.ops import metrics

log = logging.getLogger(__name__)

# Seconds the database clock may differ from the last reading carried forward (plus that
# reading's own round trip) before it counts as a step: a loaded box's jitter stays under it, and
# a step this small only eats into the lease's margin (RUN_LEASE - HEARTBEAT_INTERVAL).
STEP_TOLERANCE = 1.0


class Reaper(Loop):
    """Handles expired leases for a dispatcher.

    ``publish(runs)``: sends the re-fired cron runs (the dispatcher's sender)
    and returns once they are out; ``app``: the Celery app whose DLQ hears of
    failed jobs; ``lease``: seconds of dispatch lease of a re-fired run (x2 per earlier loss of its
    occurrence before any worker started it, up to x16);
    ``batch_size``: expired attempts handled per pass; ``interval``: seconds
    between passes (default ``REAPER_INTERVAL``; longer after a slow pass, see ``next_pass``);
    ``max_lost``: lost attempts after which a one-off job fails (default ``MAX_LOST_ATTEMPTS``);
    ``on_reaped(n)``: called after a pass of ``run_once`` that reaped ``n`` > 0 attempts (the
    dispatcher resets its claim's floors: runs sent back keep an expiring ``fire_at``).
    """

    name = "reaper"

    def __init__(self, publish: Callable[[list[Claimed]], None], app, *, lease: float, batch_size: int,
                 interval: float | None = None, max_lost: int | None = None,
                 on_reaped: Callable[[int], None] | None = None) -> None:
        super().__init__(conf.get("REAPER_INTERVAL") if interval is None else interval)
        self.publish = publish
        self.app = app
        self.lease = lease
        self.batch_size = batch_size
        self.max_lost = int(conf.get("MAX_LOST_ATTEMPTS") if max_lost is None else max_lost)
        self.on_reaped = on_reaped
        self.run_lease = float(conf.get("RUN_LEASE"))
        self.heartbeat_interval = float(conf.get("HEARTBEAT_INTERVAL"))
        self._reading: tuple[float, float] | None = None  # (database time, monotonic) at the last pass
        self._hold_running_until = 0.0  # monotonic: after a step forward, running attempts wait
        # after a step back: running attempt id -> (its lease as seen, when it ends on the monotonic clock)
        self._stale: dict[int, tuple[datetime, float]] = {}
        self.steps: list[float] = []  # the steps seen (seconds, + forward), for logs and tests

    def maybe_reap(self, now: float | None = None) -> int:
        """Reap if ``interval`` seconds have passed since the last pass (``now``: monotonic time);
        return how many attempts were reaped (0 when not due): ``maybe_run``."""
        return self.maybe_run(now)

    def next_pass(self, started: float, seconds: float) -> float:
        # A pass over thousands of lost runs (a slow fleet behind a burst: each cron run is
        # fired again by a statement of its own) takes seconds in the dispatcher's loop; passes
        # back to back would leave it no time to claim. The next waits 4x as long as this took,
        # so reaping takes at most a fifth of the loop while it lasts.
        return started + max(self.interval, 4 * seconds)

    def run_once(self) -> int:
        """One pass (``reap``), then ``on_reaped`` if it reaped any."""
        n = self.reap()
        if n and self.on_reaped is not None:
            self.on_reaped(n)
        return n

    def reap(self) -> int:
        """One pass: handle up to ``batch_size`` expired attempts; return how many were reaped.

        Raises Django's database errors (the dispatcher's loop retries after a pause).
        """
        refire: list[Claimed] = []
        running_until = self.watch_clock()
        with transaction.atomic(using=conf.db_alias()):
            lost = db.run("reap", {"limit": self.batch_size, "running_until": running_until}, retries=0)
            stale = self._stale_due(time.monotonic())
            if stale:
                lost += db.run("reap_stale", {"ids": [i for i, _ in stale], "until": [u for _, u in stale]},
                               retries=0)
            if not lost:
                return 0
            metrics.observe_reaped(len(lost))
            failed = db.run("reap_once", {"job_ids": [r[0] for r in lost], "attempts": [r[1] for r in lost],
                                          "started": [r[3] for r in lost], "max_lost": self.max_lost}, retries=0)
            once = {r[0] for r in failed}
            # By job id: the order in which a worker's start_attempt locks the recurring jobs whose
            # successes it records, so the two never wait on each other in a cycle (a deadlock).
            for r in sorted(lost, key=lambda r: str(r.job_id)):
                if r.job_id in once:
                    continue
                rows = db.run("refire_cron", {"job_id": r.job_id, "scheduled_at": r.scheduled_at, "started": r.started,
                                              "losses": r.occurrence_losses + (1 if r.started else 0),
                                              # a start resets it: a run lost while running was not the queue's
                                              "dispatch_losses": 0 if r.started else r.dispatch_losses + 1,
                                              "max_lost": self.max_lost, "lease": self.lease}, retries=0)
                # a run fired again past its expiry is recorded skipped, never published
                refire += drop_expired([Claimed.from_row(r) for r in rows], rows[0].db_now) if rows else []
        log.warning("reaped %d expired leases (%d cron runs fired again): %s", len(lost), len(refire),
                    ", ".join(f"{r[0]}:{r[1]}" for r in lost[:10]))
        if refire:
            self.publish(refire)
        for job_id, status, attempt, task in failed:
            if status == "failed":
                dlq.announce(self.app, job_id, attempt, task, f"lost {self.max_lost} attempts (lease expired each time)")
                metrics.observe_dead_lettered()
        return len(lost)

    # -- the database clock's steps --------------------------------------------------------

    def watch_clock(self) -> datetime | None:
        """Read the database clock and compare it with the last reading carried forward on the
        monotonic clock; return the latest database time at which the ``reap`` statement may
        reap a running attempt (None: none now, a step forward is being waited out)."""
        t0 = time.monotonic()
        now = db.db_now()
        t1 = time.monotonic()
        mono, tolerance = (t0 + t1) / 2, STEP_TOLERANCE + (t1 - t0)
        last, self._reading = self._reading, (now.timestamp(), mono)
        if last is not None:
            step = now.timestamp() - (last[0] + (mono - last[1]))
            if step > tolerance:
                self.steps.append(step)
                self._hold_running_until = mono + self.run_lease
                log.warning("the database clock stepped %.1fs forward: no running attempt is reaped for %.0fs "
                            "(RUN_LEASE), while their heartbeats renew them on the new clock", step, self.run_lease)
            elif step < -tolerance:
                self.steps.append(step)
                self._count_on_monotonic(-step, mono)
        if mono < self._hold_running_until:
            return None
        return now + timedelta(seconds=tolerance)

    def _count_on_monotonic(self, back: float, mono: float) -> None:
        rows = db.run("running_leases", {"beyond": self.run_lease + STEP_TOLERANCE, "limit": 10 * self.batch_size})
        for r in rows:
            left = (r.locked_until - r.db_now).total_seconds() - back  # its time left before the step
            # never sooner than a heartbeat would have changed it (a lease written by a longer RUN_LEASE)
            self._stale[r.id] = (r.locked_until, mono + max(left, self.heartbeat_interval + STEP_TOLERANCE))
        log.warning("the database clock stepped %.1fs back: %d running leases written before it are counted on "
                    "this process's clock", back, len(rows))

    def _stale_due(self, mono: float) -> list[tuple[int, datetime]]:
        due = [(i, until) for i, (until, at) in self._stale.items() if at <= mono][:self.batch_size]
        for i, _ in due:
            del self._stale[i]
        return due
