"""Bursts of recurring jobs that all fall due at given instants (imported as ``burst``).

Cron expressions are built from each zone's local wall time of the instants (six fields, leading
seconds), so that jobs in many zones and on many expressions fall due at exactly the same
instants; each expression is checked against ``cron_at_scale.cron.next_fire_times`` before use.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from helpers import sql

from cron_at_scale import cron

# A spread of offsets: whole hours, half and quarter hours, both sides of the date line.
ZONES = ["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata", "Asia/Kathmandu", "Australia/Adelaide",
         "America/St_Johns", "Pacific/Chatham", "Pacific/Kiritimati", "Pacific/Honolulu", "Asia/Tokyo",
         "America/Los_Angeles", "America/Sao_Paulo", "Australia/Lord_Howe", "Europe/Berlin"]


def db_now() -> datetime:
    ((now,),) = sql("SELECT statement_timestamp()")
    return now


def whole_second_after(t: datetime, seconds: float) -> datetime:
    """The first whole second at least ``seconds`` after ``t``."""
    base = t + timedelta(seconds=seconds)
    return base.replace(microsecond=0) + (timedelta(seconds=1) if base.microsecond else timedelta())


def _field(values) -> str:
    return ",".join(str(v) for v in sorted(set(values)))


def dow(local: datetime) -> int:
    """crontab's day of week (Sunday 0)."""
    return (local.weekday() + 1) % 7


def expressions(instants: list[datetime], tz: str) -> dict[str, str]:
    """Six-field expressions (by shape name) in ``tz`` whose occurrences include every instant
    of ``instants`` (aware, whole seconds); the caller checks which ones fire at exactly them."""
    local = [t.astimezone(ZoneInfo(tz)) for t in instants]
    s, m, h = _field(x.second for x in local), _field(x.minute for x in local), _field(x.hour for x in local)
    d, mon, wd = _field(x.day for x in local), _field(x.month for x in local), _field(dow(x) for x in local)
    return {
        "daily": f"{s} {m} {h} * * *",
        "dow": f"{s} {m} {h} * * {wd}",
        "dom": f"{s} {m} {h} {d} * *",
        "month": f"{s} {m} {h} * {mon} *",
        "dom_or_dow": f"{s} {m} {h} {d} * {wd}",  # both restricted: cronie ORs them
    }


def fires_exactly(expr: str, tz: str, after: datetime, instants: list[datetime]) -> bool:
    """Whether the first occurrences of ``expr`` in ``tz`` after ``after`` are ``instants``."""
    return cron.next_fire_times(expr, tz, after, len(instants)) == instants


def burst_specs(instants: list[datetime], n: int, *, after: datetime, task: str, zones: list[str],
                shapes: tuple[str, ...] = ("daily", "dow", "dom"), **extra) -> list[dict]:
    """``n`` cron specs over ``zones`` x ``shapes`` whose first occurrences after ``after`` are
    exactly ``instants``; ``extra``: more of schedule()'s arguments for every spec."""
    pairs = []
    for tz in zones:
        for shape, expr in expressions(instants, tz).items():
            if shape in shapes and fires_exactly(expr, tz, after, instants):
                pairs.append((expr, tz))
    assert len(pairs) >= len(zones), pairs
    return [{"task": task, "cron": pairs[i % len(pairs)][0], "tz": pairs[i % len(pairs)][1], **extra}
            for i in range(n)]
