"""History: finished jobs leave the live table, and history goes a partition at a time.

The live tables (``cron_at_scale_job``, ``cron_at_scale_jobattempt``) should hold what can still
fire. A completed or cancelled job whose attempts have all finished moves, ``HISTORY_AFTER``
seconds after it finished (an hour by default), with its attempts, into
``cron_at_scale_jobhistory`` / ``cron_at_scale_attempthistory``: one statement per batch of
``batch_size`` jobs (``archive_move``: ``DELETE ... RETURNING`` into ``INSERT``), oldest first,
skipping rows another session holds. The history tables are range-partitioned by
``archived_at`` (database clock), one partition per ``HISTORY_PARTITION`` seconds (a day), made
ahead of time; they are appended to and never updated, so they leave no dead rows to vacuum.

Retention of history is by partition: one whose whole range is older than ``RETENTION`` is
detached (``DETACH PARTITION ... CONCURRENTLY``, PostgreSQL 14+; a plain, briefly locking
``DETACH`` on 13) and dropped: a catalog change per day instead of a delete per job. A row is
kept at least ``RETENTION`` and at most ``RETENTION`` + ``HISTORY_PARTITION`` after it moved.
Failed jobs never move (they wait for a requeue); a recurring job's attempts stay with it,
bounded by ``HISTORY_PER_JOB`` (:mod:`cron_at_scale.maintenance.history`), until the job ends.

What the move changes for a job once it is gone: ``Job.objects`` no longer finds it
(``JobHistory`` does); a late redelivery of one of its messages finds no attempt to start and
is skipped, as after a retention purge; a success reported by a run that was reaped as lost
after its job completed another way finds no attempt to record it on.

Partition upkeep (attach ahead, detach and drop) runs under a session advisory lock, on one
dispatcher at a time; each of its statements under a ``statement_timeout`` of
``DDL_TIMEOUT`` seconds, so that a detach waiting for a long transaction is let go (and
finished by a later pass) rather than holding up the maintenance thread.

:class:`Archive` is the dispatcher's loop, on its maintenance thread: every ``ARCHIVE_INTERVAL``
seconds it keeps the partitions (at most every ``upkeep_interval()``), then moves batches for at
most ``ARCHIVE_BUDGET`` seconds; after a pass that left more behind, the next comes after
``ARCHIVE_BUDGET`` seconds, busy at most half the time. Each pass walks the finished jobs from a
floor just below the newest it moved (:func:`move_from`), and from the start every
``FULL_WALK_INTERVAL`` seconds.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timedelta, timezone

from django.db import connections

from cron_at_scale import conf
from cron_at_scale import sql as db
from cron_at_scale.maintenance.loop import Loop

log = logging.getLogger(__name__)

PARENTS = ("cron_at_scale_jobhistory", "cron_at_scale_attempthistory")
DEFAULT_BATCH_SIZE = 1000  # jobs per move statement: a few ms of locks, small WAL bursts
ARCHIVE_INTERVAL = 1.0  # seconds between passes: the moves follow the fire rate
ARCHIVE_BUDGET = 0.5  # seconds of moving per pass
AHEAD = 2  # partitions made ahead of the current one: a day or two of dispatchers down is covered
RETRY_AFTER_FAILURE = 60.0  # seconds after a failed pass
DDL_TIMEOUT = 5.0  # seconds a partition statement may take (waiting for locks included)
# The loop's floor sits this far below the newest row it moved: a completion whose updated_at was
# set before it committed (a statement's own time) is still above it unless it took longer than this.
# Each pass re-reads this many seconds of finished jobs' entries, so it stays short.
FLOOR_MARGIN = 2.0
# Every this many seconds a pass walks from the start: the rows left below the floor (a completion
# committed later than FLOOR_MARGIN, a job whose last run was still going, a row another session
# held) move then.
FULL_WALK_INTERVAL = 300.0


def settings() -> tuple[float | None, float, float | None]:
    """``(HISTORY_AFTER, HISTORY_PARTITION, RETENTION)`` in seconds; None: off."""
    after, part, keep = conf.get("HISTORY_AFTER"), conf.get("HISTORY_PARTITION"), conf.get("RETENTION")
    return (None if after is None else float(after)), float(part), (None if keep is None else float(keep))


def move(after_seconds: float, batch_size: int = DEFAULT_BATCH_SIZE, budget_seconds: float | None = None
         ) -> tuple[int, bool]:
    """Move finished jobs last updated more than ``after_seconds`` ago (database clock), with their
    attempts, into the history tables. Returns ``(jobs moved, more)``: ``more`` is True when the
    pass stopped on ``budget_seconds`` (None: run to the end) after a full batch.

    The current partition must exist (:func:`keep_partitions`); without it the statement fails
    (``django.db.DatabaseError``, "no partition of relation ... found for row") and nothing moves.
    Raises ``ValueError`` for a negative age or a batch size below 1.
    """
    moved, more, _newest = move_from(None, after_seconds, batch_size, budget_seconds)
    return moved, more


def move_from(floor: datetime | None, after_seconds: float, batch_size: int = DEFAULT_BATCH_SIZE,
              budget_seconds: float | None = None) -> tuple[int, bool, datetime | None]:
    """:func:`move`, walking only the finished jobs last updated at or after ``floor`` (an aware
    datetime, database clock; None: all of them). Returns ``(jobs moved, more, newest)``:
    ``newest`` is the latest ``updated_at`` among the jobs moved (None when none moved).

    Why a floor: the move walks the finished jobs' index (``cron_job_finished_updated``) oldest
    first. While a long transaction pins the vacuum horizon, the entries of the rows already moved
    stay in that index, dead, and a walk from the start reads them all again at every pass: a pass
    grows with the length of the pin. From a floor just below the last pass's newest row, it reads
    only the few seconds of entries above it. Same errors as :func:`move`.
    """
    if isinstance(after_seconds, bool) or not isinstance(after_seconds, (int, float)) or after_seconds < 0:
        raise ValueError(f"after_seconds must be a number >= 0, got {after_seconds!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    if floor is not None and floor.tzinfo is None:
        raise ValueError(f"floor must be an aware datetime, got {floor!r}")
    deadline = None if budget_seconds is None else time.monotonic() + budget_seconds
    moved, newest = 0, None
    while True:
        row = db.run("archive_move", {"after": float(after_seconds), "n": batch_size,
                                      "floor": "-infinity" if floor is None else floor}, fetch="one", retries=0)
        moved += row.moved
        if row.newest is not None:
            newest = row.newest if newest is None else max(newest, row.newest)
        if row.moved < batch_size:
            return moved, False, newest
        if deadline is not None and time.monotonic() > deadline:
            return moved, True, newest


def partition_name(parent: str, lower: datetime) -> str:
    """``<parent>_p<YYYYMMDD>t<HHMMSS>`` of the partition starting at ``lower`` (UTC)."""
    return f"{parent}_p{lower.astimezone(timezone.utc):%Y%m%dt%H%M%S}"


def _floor(at: datetime, seconds: float) -> datetime:
    epoch = at.timestamp()
    return datetime.fromtimestamp(math.floor(epoch / seconds) * seconds, tz=timezone.utc)


def keep_partitions(partition_seconds: float, retention: float | None, now: datetime | None = None, *,
                    attach: bool = True, dry_run: bool = False) -> dict:
    """Attach the partitions that cover ``now`` (database clock) and the next ``AHEAD`` ones;
    detach and drop those whose range ended more than ``retention`` seconds ago (None: keep all).
    Under the history advisory lock: when another session holds it, does nothing.
    Returns ``{"attached": [...], "dropped": [...], "locked": bool}`` (partition names).

    A new partition starts where the last one ends (so a changed ``HISTORY_PARTITION`` never
    overlaps an older one), or at ``now`` rounded down to ``partition_seconds`` after a gap.
    ``attach=False``: only detach and drop; ``dry_run``: name what would be dropped, change nothing.
    """
    now = db.db_now() if now is None else now
    done: dict = {"attached": [], "dropped": [], "locked": False}
    if not db.run("history_lock", fetch="one", retries=0).locked:
        return done
    done["locked"] = True
    try:
        db.run("history_statement_timeout", {"timeout": f"{int(DDL_TIMEOUT * 1000)}ms"}, fetch="one", retries=0)
        rows = db.run("history_partitions", retries=0)
        for parent in PARENTS:
            mine = [r for r in rows if r.parent == parent]
            for r in mine:
                if dry_run:
                    if r.detaching or (retention is not None and r.upper <= now - timedelta(seconds=retention)):
                        done["dropped"].append(r.name)
                elif r.detaching:  # a detach cut short: finish it, then drop
                    db.run("history_finalize_detach", identifiers={"parent": parent, "partition": r.name},
                           fetch="count", retries=0)
                    db.run("history_drop_partition", identifiers={"partition": r.name}, fetch="count", retries=0)
                    done["dropped"].append(r.name)
                elif retention is not None and r.upper <= now - timedelta(seconds=retention):
                    _detach(parent, r.name)
                    db.run("history_drop_partition", identifiers={"partition": r.name}, fetch="count", retries=0)
                    done["dropped"].append(r.name)
            if dry_run or not attach:
                continue
            last = max((r.upper for r in mine), default=None)
            lower = _floor(now, partition_seconds) if last is None else max(last, _floor(now, partition_seconds))
            horizon = now + timedelta(seconds=AHEAD * partition_seconds)
            while lower <= horizon:
                upper = lower + timedelta(seconds=partition_seconds)
                name = partition_name(parent, lower)
                names = {"parent": parent, "partition": name, "check": f"{name}_range"}
                bounds = {"lower": lower, "upper": upper}
                db.run("history_create_partition", bounds, identifiers=names, fetch="count", retries=0)
                db.run("history_attach_partition", bounds, identifiers=names, fetch="count", retries=0)
                db.run("history_drop_check", identifiers=names, fetch="count", retries=0)
                done["attached"].append(name)
                lower = upper
    finally:
        try:
            db.run("history_statement_timeout", {"timeout": "0"}, fetch="one", retries=0)
            db.run("history_unlock", fetch="one", retries=0)
        except Exception:  # noqa: BLE001 (a broken connection drops the session lock with it)
            log.debug("could not release the history lock", exc_info=True)
    if (done["attached"] or done["dropped"]) and not dry_run:
        log.info("history partitions: attached %s; dropped %s", done["attached"] or "none", done["dropped"] or "none")
    return done


def _detach(parent: str, name: str) -> None:
    connection = connections[conf.db_alias()]
    connection.ensure_connection()
    names = {"parent": parent, "partition": name}
    if connection.pg_version >= 140000:  # DETACH ... CONCURRENTLY is PostgreSQL 14's
        db.run("history_detach_partition", identifiers=names, fetch="count", retries=0)
    else:
        db.run("history_detach_partition_locking", identifiers=names, fetch="count", retries=0)


class Archive(Loop):
    """The dispatcher's loop, on its maintenance thread: keeps the history partitions (at most every
    :meth:`upkeep_interval` seconds) and moves finished jobs older than ``HISTORY_AFTER`` for at most
    ``budget`` seconds per pass, every ``interval`` seconds; again after ``budget`` seconds when a
    pass left more behind. Off while ``HISTORY_AFTER`` is None. ``maybe_run()`` returns the jobs moved."""

    name = "history move"
    idle = 0
    idle_only = True  # moving never holds up a busy claim loop

    def __init__(self, interval: float = ARCHIVE_INTERVAL, budget: float = ARCHIVE_BUDGET) -> None:
        super().__init__(interval)
        self.budget = budget
        self.behind = False
        self.failed = False  # the last pass raised
        self._upkeep_at = 0.0  # monotonic time of the next partition upkeep
        self.floor: datetime | None = None  # where the next pass's walk starts (None: from the start)
        self._full_walk_at = 0.0  # monotonic time of the next walk from the start

    def enabled(self) -> bool:
        return conf.get("HISTORY_AFTER") is not None

    @staticmethod
    def upkeep_interval(partition_seconds: float) -> float:
        """Seconds between partition upkeeps: a quarter partition, at most a minute."""
        return min(60.0, partition_seconds / 4)

    def run_once(self) -> int:
        self.failed = True  # until this pass ends well
        after, part, retention = settings()
        if after is None:
            self.failed = False
            return 0
        if time.monotonic() >= self._upkeep_at:
            keep_partitions(part, retention)
            self._upkeep_at = time.monotonic() + self.upkeep_interval(part)
        now = time.monotonic()
        walk_from = self.floor
        if now >= self._full_walk_at:
            walk_from, self._full_walk_at = None, now + FULL_WALK_INTERVAL
        moved, self.behind, newest = move_from(walk_from, after, budget_seconds=self.budget)
        if newest is not None:
            floor = newest - timedelta(seconds=FLOOR_MARGIN)
            self.floor = floor if self.floor is None else max(self.floor, floor)
        self.failed = False
        return moved

    def next_pass(self, started: float, seconds: float) -> float:
        """After a failed pass (a role that may not create tables, a lock timeout), the next in
        ``RETRY_AFTER_FAILURE`` seconds: one logged error a minute, not one a second."""
        if self.failed:
            return started + max(self.interval, RETRY_AFTER_FAILURE)
        if self.behind:
            return started + seconds + max(seconds, self.budget)
        return started + self.interval
