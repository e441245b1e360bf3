"""A slow, independent reading of the Quartz day forms, for tests only.

Written from the definitions (Quartz's CronExpression javadoc), not from
``cron_at_scale.cron``: each date is judged on its own, by scanning the month.
"""

from __future__ import annotations

import calendar
import re
from datetime import date
from functools import cache

_NAMES = {n: i for i, n in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}


def cron_dow(d: date) -> int:
    return (d.weekday() + 1) % 7  # Sunday=0


@cache
def _nearest_weekday(y: int, m: int, n: int) -> int | None:
    """The Monday-Friday day of the month closest to day n (no ties can occur)."""
    dim = calendar.monthrange(y, m)[1]
    if n > dim:
        return None
    weekdays = [d for d in range(1, dim + 1) if date(y, m, d).weekday() < 5]
    return min(weekdays, key=lambda d: abs(d - n))


@cache
def _plain(text: str, low: int, high: int) -> frozenset[int]:
    out: set[int] = set()
    for item in text.split(","):
        m = re.fullmatch(r"(\*|\d+(?:-\d+)?)(?:/(\d+))?", item)
        assert m, item
        rng, step = m.group(1), int(m.group(2) or 1)
        a, b = (low, high) if rng == "*" else (int(rng.split("-")[0]), int(rng.split("-")[-1]))
        out.update(range(a, b + 1, step))
    return frozenset(out)


def dom_matches(text: str, y: int, m: int, d: int) -> bool:
    dim = calendar.monthrange(y, m)[1]
    t = text.upper()
    if mt := re.fullmatch(r"L(?:-(\d+))?(W?)", t):
        target = dim - int(mt.group(1) or 0)
        if target < 1:
            return False
        return d == (_nearest_weekday(y, m, target) if mt.group(2) else target)
    if mt := re.fullmatch(r"(\d+)W", t):
        return d == _nearest_weekday(y, m, int(mt.group(1)))
    return d in _plain(text, 1, 31)


def dow_matches(text: str, y: int, m: int, d: int) -> bool:
    t = text.upper()
    dim = calendar.monthrange(y, m)[1]
    wd = cron_dow(date(y, m, d))
    if mt := re.fullmatch(r"(\d|[A-Z]{3})(L|#(\d))", t):
        w = int(mt.group(1)) if mt.group(1).isdigit() else _NAMES[mt.group(1)]
        if wd != w % 7:
            return False
        if mt.group(2) == "L":
            return d + 7 > dim  # no later one in this month
        return (d - 1) // 7 + 1 == int(mt.group(3))
    for name, v in _NAMES.items():
        t = t.replace(name, str(v))
    return wd in {v % 7 for v in _plain(t, 0, 7)}


def day_matches(dom: str, dow: str, y: int, m: int, d: int) -> bool:
    """crontab(5)'s rule: AND if either field text begins with '*', else OR."""
    a, b = dom_matches(dom, y, m, d), dow_matches(dow, y, m, d)
    return (a and b) if dom.startswith("*") or dow.startswith("*") else (a or b)
