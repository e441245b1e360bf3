"""A worker's clock against the database's: when to start a message published ahead of its fire_at.

With ``ETA_LEAD`` the dispatcher publishes a run before its ``fire_at``, its
message carrying Celery's ``eta`` (the ``fire_at``, on the database clock). A
Celery worker holds such a message until the eta *by its own clock*. A worker
whose clock is behind the database's would hold it for as long as its clock is
off (an hour off: an hour late); one whose clock is ahead would start it early
(refused by ``start_attempt``, which tells it how long to wait).

So the worker's main process measures its clock's offset from the database's
(:func:`measure`, at start and with every health heartbeat, one ``SELECT``), and
:class:`JobRequest`, the Celery request class of :class:`~cron_at_scale.worker.JobTask`
(Celery's documented ``Task.Request``), moves the eta of a message the
dispatcher published onto the worker's clock. The message itself is the one
``send_task(..., eta=fire_at)`` sends; a worker without this class starts it at
the eta by its own clock, still never before its ``fire_at`` by the database's.

A request class is one of Celery's mechanisms, not a worker concern: it is installed by the
task class (``JobTask.Request``), as the rule of :mod:`cron_at_scale.worker.middleware` says;
the offset is measured by the ``WorkerHealth`` middleware's watchdog (:mod:`.health`).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from cron_at_scale import sql as db
from cron_at_scale.broker.message import HEADER
from cron_at_scale.worker import batch_start
from cron_at_scale.worker.events import AnnouncingRequest

log = logging.getLogger(__name__)

# Seconds this process's clock is ahead of the database's (negative: behind); 0 until measured.
offset = 0.0
# Larger offsets are logged: a clock this far off is worth an operator's look.
WARN_OFFSET = 1.0


SAMPLES = 3  # round trips per measure; the shortest one bounds the offset tightest


def measure() -> float:
    """Measure this process's clock against the database's and keep it in :data:`offset`; return it,
    in seconds (positive: this clock is ahead).

    The database read its clock between this process's readings before and after the round trip:
    the offset kept is the middle of the shortest of ``SAMPLES`` round trips, within half a round
    trip of the truth. A held message's timer then fires within that of its ``fire_at``; the hop to
    the pool process and the task's own start take longer than that, so the start statement
    (which refuses a start before the ``fire_at``, the guarantee) practically never has to."""
    global offset
    best: tuple[float, float] | None = None  # (round trip, offset)
    for _ in range(SAMPLES):
        t0 = time.time()
        db_now = db.db_now(retries=1).timestamp()
        t1 = time.time()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, (t0 + t1) / 2 - db_now)
    assert best is not None
    new = best[1]
    if abs(new) > WARN_OFFSET and abs(new - offset) > WARN_OFFSET:
        log.warning("this worker's clock is %.3fs %s the database's: messages published ahead of their "
                    "fire_at are held on the database's clock", abs(new), "ahead of" if new > 0 else "behind")
    offset = new
    return new


class JobRequest(AnnouncingRequest):
    """Celery's request, with the eta of a message the dispatcher published ahead of its fire_at
    moved onto this worker's clock (by :data:`offset`): the worker's timer then fires at the
    ``fire_at`` of the database clock. Other messages are Celery's own. Its base sends the task
    event of an attempt Celery sees as ignored (:mod:`cron_at_scale.worker.events`). A message
    started in a batch (:mod:`cron_at_scale.worker.batch_start`) leaves the batch's waiting ones
    when a pool process accepts it."""

    def on_accepted(self, pid, time_accepted):
        super().on_accepted(pid, time_accepted)
        batch_start.starter.waiting.accepted(self)  # a batch's start: its pool process renews it now

    @property
    def eta(self) -> datetime | None:
        eta = super().eta
        if eta is None or not offset or HEADER not in (self.request_dict or {}):
            return eta
        return eta + timedelta(seconds=offset)
