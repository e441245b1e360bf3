"""cron_at_scale.beat.dst: where a crontab fires differently here than under Celery beat across DST,
checked against Celery's own ``crontab.is_due`` run as beat's loop would, minute by minute."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab

from cron_at_scale.beat.dst import differences, summary, transitions
from cron_at_scale.cron import next_fire_times

ZONE = "Europe/Madrid"
TZ = ZoneInfo(ZONE)
SPRING = datetime(2027, 3, 27, 12, 0, tzinfo=TZ)  # clocks skip 02:00-03:00 on 28 March 2027
FALL = datetime(2027, 10, 30, 12, 0, tzinfo=TZ)  # 02:00-03:00 occurs twice on 31 October 2027


def celery_fires(minute: str, hour: str, start: datetime, hours: float) -> list[datetime]:
    """The instants Celery beat runs ``crontab(minute, hour)`` (app timezone ZONE), from ``start``:
    its ``is_due`` asked every 30 s, the last run moved on each time it says due."""
    app = Celery(set_as_current=False)
    app.conf.timezone = ZONE
    clock = {}
    ct = crontab(minute=minute, hour=hour, app=app, nowfun=lambda: clock["now"])
    t = last = start.astimezone(UTC)
    out = []
    while t < start + timedelta(hours=hours):
        clock["now"] = t.astimezone(TZ)
        if ct.is_due(last.astimezone(TZ))[0]:
            out.append(t)
            last = t
        t += timedelta(seconds=30)
    return out


def ours(expr: str, start: datetime, hours: float) -> list[datetime]:
    times = next_fire_times(expr, ZONE, start, 200)
    return [t for t in times if t < start + timedelta(hours=hours)]


def test_the_two_documented_claims_hold_for_celery_and_for_us():
    # spring forward, fixed time: Celery runs 02:30 at 03:30, we at the jump (03:00)
    assert [t.astimezone(TZ).strftime("%d %H:%M") for t in celery_fires("30", "2", SPRING, 36)] == ["28 03:30"]
    assert [t.astimezone(TZ).strftime("%d %H:%M") for t in ours("30 2 * * *", SPRING, 36)] == ["28 03:00"]
    # fall back, wildcard: Celery skips the second pass of the repeated hour, we run it
    celery = celery_fires("*/30", "*", FALL + timedelta(hours=13), 4)  # from 01:00+02:00, four real hours
    here = ours("*/30 * * * *", FALL + timedelta(hours=13), 4)
    assert [t.astimezone(TZ).strftime("%H:%M%z") for t in celery] == [
        "01:30+0200", "02:00+0200", "02:30+0200", "03:00+0100", "03:30+0100", "04:00+0100", "04:30+0100"]
    assert [t.astimezone(TZ).strftime("%H:%M%z") for t in here] == [
        "01:30+0200", "02:00+0200", "02:30+0200", "02:00+0100", "02:30+0100", "03:00+0100", "03:30+0100",
        "04:00+0100", "04:30+0100"]


@pytest.mark.parametrize(("minute", "hour"), [
    ("30", "2"), ("0", "2"), ("15", "2"), ("0", "9"), ("*/30", "*"), ("0", "*"), ("*/15", "2"), ("45", "*"),
    ("0,30", "2"), ("30", "1"), ("0", "3"), ("*/20", "2"), ("0", "*/2"), ("10", "3"),
])
def test_differences_are_reported_exactly_where_celery_and_we_disagree(minute, hour):
    expr = f"{minute} {hour} * * *"
    for start in (SPRING, FALL):
        disagree = celery_fires(minute, hour, start, 36) != ours(expr, start, 36)
        found = [d for d in differences(expr, ZONE, start, years=1) if d.startswith(f"{start.date() + timedelta(days=1)}")]
        assert bool(found) == disagree, (expr, start, found)


def test_transitions_and_the_summary_line():
    found = transitions(ZONE, datetime(2027, 1, 1, tzinfo=UTC), datetime(2028, 1, 1, tzinfo=UTC))
    assert [(t.at.isoformat(), t.gap) for t in found] == [("2027-03-28T01:00:00+00:00", True),
                                                         ("2027-10-31T01:00:00+00:00", False)]
    assert transitions("UTC", datetime(2027, 1, 1, tzinfo=UTC), datetime(2029, 1, 1, tzinfo=UTC)) == []
    line = summary("30 2 * * *", ZONE, datetime(2026, 12, 1, tzinfo=UTC))
    assert line is not None and "2027-03-28: 02:30 does not exist" in line and "03:00" in line and "03:30" in line
    assert "1 more date" in line and "docs/dst.md" in line
    assert summary("0 9 * * *", ZONE, datetime(2026, 12, 1, tzinfo=UTC)) is None
    assert summary("30 2 * * *", "UTC", datetime(2026, 12, 1, tzinfo=UTC)) is None
