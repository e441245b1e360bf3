"""Retention: delete completed and cancelled jobs, and their attempts, after an age.

``purge(older_than_seconds)`` walks the finished jobs oldest first with a
keyset cursor over the partial index ``cron_job_finished_updated``
(``updated_at, id WHERE status IN ('completed', 'cancelled')``), one chunk of
``batch_size`` jobs at a time. Per chunk, in short transactions of their own:

1. its finished attempts are deleted, at most ``batch_size`` rows per
   transaction (a cron job may have many);
2. its jobs are deleted, re-checked under ``FOR UPDATE SKIP LOCKED``: still
   finished, still old, no attempt left. A row some other session holds
   (the dispatcher, an operator) is skipped, never waited for; a cancelled
   job whose last run has not finished keeps its open attempt and stays
   until a later purge.

The hot path never waits on a purge: the claim only reads pending rows
(another index) and the purge only locks finished ones.

:class:`Retention` is the dispatcher's loop (a :class:`~cron_at_scale.maintenance.loop.Loop`,
run on the dispatcher's maintenance thread, beside the claim loop, not in it): with the ``RETENTION`` setting (seconds, 30 days by default; ``None``
turns it off) it purges at most every ``RETENTION_INTERVAL`` seconds for at most
``RETENTION_BUDGET`` seconds; while a pass ends with more left to purge (jobs finish faster
than one pass a minute deletes them), the next comes after ``RETENTION_BUDGET`` seconds
instead, so that the purge keeps up with the fire rate, busy at most half the time.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from django.db import transaction

from cron_at_scale import conf
from cron_at_scale import sql as db
from cron_at_scale.maintenance.loop import Loop

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 1000  # rows per delete: a few ms of locks, small WAL bursts
RETENTION_INTERVAL = 60.0  # seconds between the dispatcher's purges: retention is by days, not seconds
RETENTION_BUDGET = 0.5  # seconds of purging per dispatcher call, so the claim loop is never held up long

_EPOCH = datetime.fromisoformat("0001-01-01T00:00:00+00:00")
_NIL = "00000000-0000-0000-0000-000000000000"


def purge(older_than_seconds: float, batch_size: int = DEFAULT_BATCH_SIZE, dry_run: bool = False,
          budget_seconds: float | None = None) -> tuple[int, int]:
    jobs, attempts, _more = purge_pass(older_than_seconds, batch_size, dry_run, budget_seconds)
    return jobs, attempts


def purge_pass(older_than_seconds: float, batch_size: int = DEFAULT_BATCH_SIZE, dry_run: bool = False,
               budget_seconds: float | None = None) -> tuple[int, int, bool]:
    """Delete completed and cancelled jobs last updated more than ``older_than_seconds`` ago (database
    clock), and their attempts. Returns ``(jobs, attempts)`` deleted (with ``dry_run``: that would be).

    ``batch_size``: rows per delete statement and per transaction. ``budget_seconds``: stop after
    the chunk that crosses it (None: run to the end). Raises ``ValueError`` for a negative age or a
    batch size below 1. Safe beside running dispatchers and with several purges at once.
    (:func:`purge_pass` returns a third value: True when it stopped on the budget with a full
    chunk behind it, more may be left.)
    """
    if not isinstance(older_than_seconds, (int, float)) or isinstance(older_than_seconds, bool) \
            or older_than_seconds < 0:
        raise ValueError(f"older_than_seconds must be a number >= 0, got {older_than_seconds!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
    (cutoff,) = db.run("retention_cutoff", {"age": float(older_than_seconds)}, fetch="one", retries=0)
    after_at, after_id = _EPOCH, _NIL
    jobs = attempts = 0
    more = False
    while True:
        chunk = db.run("retention_chunk", {"cutoff": cutoff, "after_at": after_at, "after_id": after_id, "n": batch_size},
                       retries=0)
        if not chunk:
            break
        ids = [r[0] for r in chunk]
        after_at, after_id = chunk[-1][1], chunk[-1][0]
        if dry_run:
            attempts += db.run("retention_count_attempts", {"ids": ids}, fetch="one", retries=0)[0]
            jobs += len(ids)
        else:
            while True:  # attempts first, each delete its own short transaction
                with transaction.atomic(using=conf.db_alias()):
                    n = db.run("retention_delete_attempts", {"ids": ids, "n": batch_size}, fetch="count", retries=0)
                attempts += n
                if n < batch_size:
                    break
            with transaction.atomic(using=conf.db_alias()):
                jobs += db.run("retention_delete_jobs", {"ids": ids, "cutoff": cutoff}, fetch="count", retries=0)
        if len(chunk) < batch_size:
            break
        if deadline is not None and time.monotonic() > deadline:
            more = True
            break
    if jobs or attempts:
        log.info("purged %d jobs and %d attempts older than %.0fs%s", jobs, attempts, older_than_seconds,
                 " (dry run)" if dry_run else "")
    return jobs, attempts, more


def setting() -> float | None:
    """The ``RETENTION`` setting: seconds after which finished jobs are purged by the dispatcher, or None."""
    value = conf.get("RETENTION")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"CRON_AT_SCALE['RETENTION'] must be seconds >= 0 or None, got {value!r}")
    return float(value)


class Retention(Loop):
    """The dispatcher's loop, on its maintenance thread: purges finished jobs older than ``retention``
    seconds (default: the ``RETENTION`` setting, read at each call; None: off) at most every
    ``interval`` seconds (``RETENTION_INTERVAL``), for at most ``budget`` seconds
    (``RETENTION_BUDGET``); after a pass that left more behind, again after ``budget`` seconds.
    ``maybe_run()`` returns ``(jobs, attempts)`` deleted."""

    name = "retention purge"
    idle = (0, 0)
    idle_only = True  # retention never holds up a busy loop

    def __init__(self, retention: float | None = None, interval: float = RETENTION_INTERVAL,
                 budget: float = RETENTION_BUDGET) -> None:
        super().__init__(interval)
        self.retention = retention
        self.budget = budget
        self.behind = False  # the last pass stopped on its budget with more to purge

    def older_than(self) -> float | None:
        """Seconds after which a finished job goes: ``retention``, else the setting; None: off."""
        return setting() if self.retention is None else self.retention

    def enabled(self) -> bool:
        return self.older_than() is not None

    def run_once(self) -> tuple[int, int]:
        older_than = self.older_than()
        if older_than is None:
            return 0, 0
        jobs, attempts, self.behind = purge_pass(older_than, budget_seconds=self.budget)
        return jobs, attempts

    def next_pass(self, started: float, seconds: float) -> float:
        """Behind: the next pass after as long as this one took (at least ``budget``), so that a
        purge that cannot keep up in one pass a minute is busy at most half the time."""
        if self.behind:
            return started + seconds + max(seconds, self.budget)
        return started + self.interval
