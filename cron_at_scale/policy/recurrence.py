"""Recurring jobs (cron and interval): which occurrences fire now, and when the next one is due.

The dispatcher calls :func:`plan` for each recurring job it claims, with the
database's ``now``. Rules, per job:

* **Occurrences** come from the cron expression in the job's own zone
  (:mod:`cron_at_scale.cron`) or every ``interval`` seconds, always counted
  from the previous *scheduled* occurrence, never from "now": no drift.
* **Jitter** (``jitter`` seconds) moves each occurrence ``t`` to
  ``t + u * min(jitter, gap)`` where ``u`` in ``[0, 1)`` is a hash of (job id,
  ``t``) and ``gap`` is the time to the next occurrence: deterministic (a
  recomputation gives the same instant) and never past the next occurrence.
* **Catch-up**: the occurrences due now are those from the job's pending one
  up to ``now``; normally one. Those due (jitter included) more than
  ``catchup_window`` seconds ago are missed (counted in ``missed_occurrences``, never silently dropped). Within
  the window, ``catchup='latest'`` (default) fires the latest once and counts
  the rest as missed; ``'all'`` fires every one; ``'skip'`` fires one only if
  it is the only one due (no gap), else none. ``resume(job, missed=...)`` overrides the
  policy once: ``"skip"`` there fires none at all (:data:`NONE`).
* **Overlap**, when the job's previous run is unfinished: ``'skip'``
  (default) records the occurrence as a skipped attempt; ``'buffer_one'``
  keeps one occurrence to fire when that run ends (more are skipped);
  ``'allow'`` fires anyway. Without ``'allow'`` at most one run starts per
  claim (the latest), since several at once would overlap each other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cron_at_scale import cron

NONE = "none"  # a catch-up that fires no missed occurrence at all: resume(missed="skip")
MAX_COUNTED = 100_000  # occurrences counted one by one after an outage; beyond, the count is a floor
# Occurrences asked of the cron generator at once: two cover the usual claim (the one due and
# the next, which bounds its jitter and ends the plan); a catch-up asks for more each time.
_FIRST_CHUNK = 2
_MAX_CHUNK = 256


class Occurrences:
    """Next-occurrence lists shared by the jobs a dispatcher claims: each distinct (expression,
    zone, previous occurrence) is computed once, not once per job (a burst at the top of the hour
    is thousands of jobs on a few expressions, over many batches). The lists are pure functions of
    their key, so they never go stale; at most ``limit`` keys are kept (then it starts afresh).
    Not thread-safe: one per claiming thread."""

    def __init__(self, limit: int = 4096) -> None:
        self._lists: dict[tuple[str, str, datetime], list[datetime]] = {}
        self.limit = limit
        self.computed = 0  # calls of the cron generator (what the cache saved is the rest)

    def after(self, expr: str, tz: str, t: datetime, n: int) -> list[datetime]:
        """The next ``n`` occurrences of ``expr`` in ``tz`` strictly after ``t`` (aware UTC),
        as :func:`cron_at_scale.cron.next_fire_times`; the caller must not change the list."""
        key = (expr, tz, t)
        got = self._lists.get(key)
        if got is None or len(got) < n:
            self.computed += 1
            got = cron.next_fire_times(expr, tz, t, n)
            if len(self._lists) >= self.limit:
                self._lists.clear()
            self._lists[key] = got
        return got if len(got) == n else got[:n]


@dataclass(frozen=True)
class Recurrence:
    """What the schedule of one recurring job is (the relevant columns of its row)."""

    job_id: str
    schedule_type: str  # "cron" or "interval"
    cron_expr: str = ""
    timezone: str = "UTC"
    interval: float | None = None  # seconds
    jitter: float = 0.0
    catchup: str = "latest"
    catchup_window: float = 300.0
    overlap: str = "skip"

    def after(self, t: datetime, n: int, shared: Occurrences | None = None) -> list[datetime]:
        """The next ``n`` occurrences strictly after ``t`` (aware UTC); ``shared``: a batch's
        cache of cron occurrences (:class:`Occurrences`)."""
        if self.schedule_type == "interval":
            assert self.interval is not None
            step = timedelta(seconds=self.interval)
            return [t + step * (i + 1) for i in range(n)]
        if shared is not None:
            return shared.after(self.cron_expr, self.timezone, t, n)
        return cron.next_fire_times(self.cron_expr, self.timezone, t, n)

    def jittered(self, occurrence: datetime, following: datetime | None = None) -> datetime:
        """``occurrence`` moved by its deterministic jitter (never to or past the next occurrence)."""
        if not self.jitter:
            return occurrence
        following = following or self.after(occurrence, 1)[0]
        span = min(self.jitter, (following - occurrence).total_seconds())
        digest = hashlib.sha256(f"{self.job_id}:{occurrence.isoformat()}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        return occurrence + timedelta(microseconds=int(u * span * 1_000_000))

    def first(self, now: datetime, start: datetime | None = None) -> tuple[datetime, datetime]:
        """(occurrence, fire_at) of a new job: the first occurrence after ``now``; an interval
        job's first occurrence is ``start`` if given, else ``now`` plus one interval."""
        if self.schedule_type == "interval":
            assert self.interval is not None
            occurrence = start if start is not None else now + timedelta(seconds=self.interval)
        else:
            occurrence = self.after(now, 1)[0]
        return occurrence, self.jittered(occurrence)


@dataclass
class Plan:
    """What to do with one claimed recurring job."""

    fire: list[tuple[datetime, datetime]] = field(default_factory=list)  # (occurrence, due at) to run now
    skipped: list[tuple[datetime, datetime]] = field(default_factory=list)  # recorded as skipped attempts
    buffer: datetime | None = None  # occurrence to run when the unfinished run ends
    missed: int = 0
    next_occurrence: datetime | None = None
    next_fire_at: datetime | None = None


def plan(rec: Recurrence, occurrence: datetime, now: datetime, *, running: bool,
         buffered: datetime | None = None, shared: Occurrences | None = None, lookahead: float = 0.0) -> Plan:
    """Decide what a claimed recurring job does at database time ``now``.

    ``occurrence``: the nominal occurrence the job's ``fire_at`` stands for.
    ``running``: a previous run is unfinished. ``buffered``: an occurrence
    kept by ``overlap='buffer_one'``, which fires as soon as nothing runs.
    ``shared``: the batch's :class:`Occurrences` (the same plan without it).
    ``lookahead``: seconds; when nothing is due by ``now``, the next occurrence fires (held
    by the dispatcher until its time) if due within them; beside occurrences due now only with
    ``overlap='allow'`` (else whether it overlaps them is decided when it is due). Catch-up
    decides among the occurrences due by ``now`` only: one not due yet is never the "latest"
    that makes a due one missed. At most one not due yet fires per claim (the next claim
    takes the one after it).
    The returned ``buffer`` is the job's new buffered occurrence (or None).
    """
    window_start = now - timedelta(seconds=rec.catchup_window)
    out = Plan()
    beyond = 0
    in_window: list[tuple[datetime, datetime]] = []
    t = occurrence
    pending = [t]
    counted = 0
    chunk = _FIRST_CHUNK
    ahead_until = now + timedelta(seconds=lookahead)
    ahead: tuple[datetime, datetime] | None = None  # the next occurrence, fired early (nothing due now)
    while True:
        if not pending:
            break
        t = pending.pop(0)
        if not pending:
            pending = list(rec.after(t, chunk, shared))
            chunk = min(_MAX_CHUNK, chunk * 4)
        nxt = pending[0]
        due_at = rec.jittered(t, nxt)
        if due_at > now:
            # the coming occurrence fires early beside due ones only where runs may overlap;
            # else only when nothing fires now (whether it overlaps is decided when it is due)
            if ahead is None and due_at <= ahead_until and (
                    rec.overlap == "allow" or (not in_window and (buffered is None or running))):
                ahead = (t, due_at)
                continue
            out.next_occurrence, out.next_fire_at = t, due_at
            break
        if due_at < window_start:  # the window counts from when the run was due (jitter included)
            beyond += 1
            counted += 1
            if counted >= MAX_COUNTED:  # a very long outage: jump to the window, the count is a floor
                pending = list(rec.after(max(window_start, t), _MAX_CHUNK, shared))
                counted = 0
                continue
        else:
            in_window.append((t, due_at))
            if len(in_window) > MAX_COUNTED:
                beyond += 1
                in_window.pop(0)
    if rec.catchup == "all":
        fire = in_window
    elif rec.catchup == "skip":
        fire = in_window if beyond == 0 and len(in_window) == 1 else []
    elif rec.catchup == NONE:
        fire = []
    else:
        fire = in_window[-1:]
    out.missed = beyond + len(in_window) - len(fire)
    if ahead is not None:
        fire = [*fire, ahead]  # not a catch-up: the occurrence coming, never counted missed
    if buffered is not None:
        if running:
            out.buffer = buffered  # still waiting
        else:
            fire = [(buffered, buffered), *fire]
    if fire and rec.overlap != "allow":
        if len(fire) > 1:
            out.skipped, fire = fire[:-1], fire[-1:]
        if running:
            if rec.overlap == "buffer_one" and out.buffer is None:
                out.buffer = fire[0][0]
            else:
                out.skipped += fire
            fire = []
    out.fire = fire
    return out
