"""Where a crontab's meaning differs from Celery beat's across DST transitions (docs/dst.md).

cron_at_scale follows cronie (``cron_at_scale.cron``); Celery beat's ``crontab.is_due`` works on
wall-clock arithmetic. Measured with Celery 5's own ``crontab.is_due`` on Europe/Madrid (a minute
by minute run of beat's loop, 2027):

* a spring-forward gap: Celery runs the first missing time once, as late as the gap is long
  (02:30 at 03:30; later missing times collapse into that run). A fixed-time entry
  (``30 2 * * *``) fires here once at the jump (03:00); a wildcard entry (``*/15 2 * * *``) does
  not fire here for the missing times (Celery: once at 03:00).
* a fall-back overlap: a wildcard entry (``*/30 * * * *``) fires here at both passes of the repeated
  hour; Celery only at the first. A fixed-time entry fires once, at the first pass, in both.

:func:`differences` finds, from the zone's own transitions (``zoneinfo``), the dates within the
next ``years`` on which an expression falls under one of these cases: computed, not listed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cron_at_scale import cron as cronlib

HORIZON_YEARS = 2


@dataclass(frozen=True)
class Transition:
    """A change of UTC offset at ``at`` (aware UTC), from ``before`` to ``after``."""

    at: datetime
    before: timedelta
    after: timedelta

    @property
    def wall_start(self) -> datetime:
        """The first naive wall time the transition affects (the gap or the repeated span)."""
        naive = self.at.replace(tzinfo=None)
        return naive + min(self.before, self.after)

    @property
    def wall_end(self) -> datetime:
        naive = self.at.replace(tzinfo=None)
        return naive + max(self.before, self.after)

    @property
    def gap(self) -> bool:
        return self.after > self.before


def _offset(z: ZoneInfo, t: datetime) -> timedelta:
    return t.astimezone(z).utcoffset() or timedelta(0)


def transitions(tz: str, start: datetime, end: datetime) -> list[Transition]:
    """The offset changes of zone ``tz`` between the aware instants ``start`` and ``end``, to the second."""
    hour = timedelta(hours=1)  # whole hours: the cache serves every call of one sync
    return list(_transitions(tz, start.astimezone(UTC).replace(minute=0, second=0, microsecond=0),
                             end.astimezone(UTC).replace(minute=0, second=0, microsecond=0) + hour))


@functools.lru_cache(maxsize=64)
def _transitions(tz: str, start: datetime, end: datetime) -> tuple[Transition, ...]:
    z = ZoneInfo(tz)
    out = []
    t = start.astimezone(UTC).replace(microsecond=0)
    step = timedelta(hours=1)  # transitions are months apart, and none is shorter than this
    prev = _offset(z, t)
    while t < end:
        nxt = t + step
        off = _offset(z, nxt)
        if off != prev:
            lo, hi = t, nxt  # offset(lo) == prev, offset(hi) == off
            while hi - lo > timedelta(seconds=1):
                mid = lo + (hi - lo) / 2
                mid = mid.replace(microsecond=0)
                if _offset(z, mid) == prev:
                    lo = mid
                else:
                    hi = mid
            out.append(Transition(hi, prev, off))
            prev = off
        t = nxt
    return tuple(out)


def _walls(start: datetime, end: datetime, seconds: bool):
    t, step = start, timedelta(seconds=1 if seconds else 60)
    if not seconds:
        t = t.replace(second=0) + (step if t.second else timedelta(0))
    while t < end:
        yield t
        t += step


def differences(expr: str, tz: str, after: datetime, years: int = HORIZON_YEARS) -> list[str]:
    """One line per DST transition within ``years`` of ``after`` (aware) on which ``expr`` in ``tz``
    fires differently here than under Celery beat (see the module docstring); [] when none.

    Raises ``cron_at_scale.ValidationError`` for a bad expression or zone.
    """
    cx = cronlib.parse(expr)
    cronlib.check_zone(tz)
    out = []
    for tr in transitions(tz, after, after + timedelta(days=366 * years)):
        hits = [w for w in _walls(tr.wall_start, tr.wall_end, cx.has_seconds) if cx.matches_wall(w)]
        if not hits:
            continue
        shift = tr.after - tr.before
        jump = tr.wall_end  # the wall time at the jump (a gap) / after the repeated span (an overlap)
        day, first = hits[0].date().isoformat(), hits[0].strftime("%H:%M")
        span = f"{tr.wall_start:%H:%M}-{tr.wall_end:%H:%M}"
        # In a gap Celery runs the first missing time once, as late as the gap is long (later
        # missing times collapse into that run); we run a fixed-time entry once at the jump and
        # a wildcard entry not at all for the missing times.
        celery = hits[0] + shift
        if tr.gap and not cx.wildcard:
            if celery != jump:
                out.append(f"{day}: {first} does not exist in {tz} (clocks skip {span}); it fires here once at "
                           f"{jump:%H:%M} (the jump), Celery beat ran it at {celery:%H:%M}")
        elif tr.gap and not cx.matches_wall(celery):
            out.append(f"{day}: {first} does not exist in {tz} (clocks skip {span}); a wildcard entry does not "
                       f"fire here for the missing times, Celery beat ran it once at {celery:%H:%M}")
        elif not tr.gap and cx.wildcard:
            out.append(f"{day}: {span} occurs twice in {tz} (clocks go back); a wildcard entry fires here at "
                       f"both passes, Celery beat only at the first")
    return out


def summary(expr: str, tz: str, after: datetime, years: int = HORIZON_YEARS) -> str | None:
    """One line for an operator: the first difference and how many more dates follow, with the rule's
    page; None when the expression fires as under Celery beat for the next ``years``."""
    found = differences(expr, tz, after, years)
    if not found:
        return None
    more = f"; the same on {len(found) - 1} more date(s) within {years} years" if len(found) > 1 else ""
    return f"DST differs from Celery beat: {found[0]}{more} (the rule: docs/dst.md)"
