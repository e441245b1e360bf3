"""Cron expressions: parsing, validation and next-fire computation.

Syntax follows crontab(5) as implemented by cronie (``entry.c``); the
daylight-saving policy follows Vixie cron / cronie (``cron.c``), applied in
the job's own IANA time zone.

Syntax
------
Five fields ``minute hour day-of-month month day-of-week``, or six with a
leading ``seconds`` field (0-59).  Each field is a comma-separated list of
items; an item is ``*``, ``N`` or ``N-M``, and ``*`` or ``N-M`` may be
followed by ``/S`` (step, S >= 1).  Bounds: seconds and minute 0-59, hour
0-23, day-of-month 1-31, month 1-12 (or ``JAN``-``DEC``), day-of-week 0-7
(or ``SUN``-``SAT``; 0 and 7 are both Sunday).  Names are case-insensitive
and may be used as range ends (``MON-FRI``).  Macros: ``@yearly``,
``@annually``, ``@monthly``, ``@weekly``, ``@daily``, ``@midnight``,
``@hourly``.

Quartz day forms (``org.quartz.CronExpression``), each the whole of its field:
day-of-month ``L`` (last day), ``L-N`` (N days before it, N 0-30), ``NW`` (the
weekday nearest day N, never in another month: a Saturday 1st gives Monday
the 3rd, a Sunday last day the Friday before; no day N, no fire), ``LW`` and
``L-NW``; day-of-week ``DL`` (the last D-day) and ``D#K`` (the K-th D-day,
K 1-5; no fire in a month without one), D in cron numbering (0-7 or SUN-SAT,
where Quartz counts 1-7 from Sunday).

Rejected: ``N/S`` (cronie rejects it; other implementations disagree on
whether it means ``N-max/S`` or ``N`` -- write ``N-max/S`` explicitly),
descending ranges, ``@reboot``, ``?``, ``H``, ``L``/``W``/``#`` anywhere
else (in a list or range, another field, ``L`` alone in day-of-week), empty
fields or list items, a wrong number of fields, non-``str`` input and
expressions longer than 200 characters.

Day rule (cronie): if the day-of-month *or* the day-of-week field text begins
with ``*`` (so ``*/2`` counts, ``1-31`` does not) a day must match both
fields; otherwise it may match either. The Quartz forms follow the same rule
(they never begin with ``*``): ``0 0 L * 1`` is the last day or a Monday.

Time zones (Vixie cron / cronie policy)
---------------------------------------
A job is *wildcard* if its minute or hour field text begins with ``*``
(a six-field expression's seconds field does not count), else *fixed-time*.
Matching local wall times map to instants as follows:

* a wall time that exists once fires at that instant;
* a wall time skipped by a spring-forward gap: a fixed-time job fires once at
  the jump (the transition instant; several gap times collapse into that one
  run), a wildcard job does not fire;
* a wall time repeated by a fall-back overlap: a fixed-time job fires once, at
  the first occurrence; a wildcard job fires at both occurrences.

All instants returned are aware UTC datetimes (``tzinfo=datetime.timezone.utc``)
with second resolution.
"""

from __future__ import annotations

import functools
import heapq
import re
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from cron_at_scale.exceptions import ValidationError

__all__ = [
    "CronExpr",
    "MAX_EXPR_LENGTH",
    "MAX_TZ_LENGTH",
    "matches",
    "next_fire_time",
    "next_fire_times",
    "parse",
    "rule_text",
    "validate",
]

MAX_EXPR_LENGTH = 200
MAX_TZ_LENGTH = 64
#: Safety net for the generator: one Gregorian cycle of local time.
_MAX_YEARS = 400

_UTC = timezone.utc

MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTH_NAMES = {
    name: i + 1
    for i, name in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
    )
}
_DAY_NAMES = {name: i for i, name in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}

# (name, low, high, names)
_SECONDS = ("seconds", 0, 59, None)
_MINUTE = ("minute", 0, 59, None)
_HOUR = ("hour", 0, 23, None)
_DOM = ("day-of-month", 1, 31, None)
_MONTH = ("month", 1, 12, _MONTH_NAMES)
_DOW = ("day-of-week", 0, 7, _DAY_NAMES)
_FIELDS5 = (_MINUTE, _HOUR, _DOM, _MONTH, _DOW)
_FIELDS6 = (_SECONDS, *_FIELDS5)

_ITEM_RE = re.compile(r"(?:(\*)|([0-9A-Za-z]+)(?:-([0-9A-Za-z]+))?)(?:/([0-9]+))?")
_FIELD_SEP = re.compile(r"[ \t]+")

_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_MAX_DAYS_IN_MONTH = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


@dataclass(frozen=True)
class CronExpr:
    """A parsed cron expression (see :func:`parse`).

    Field sets hold the matching values: ``seconds`` ({0} for five-field
    expressions), ``minutes``, ``hours``, ``days`` (day-of-month 1-31),
    ``months`` (1-12) and ``weekdays`` (0-6, Sunday=0; 7 is folded into 0).
    ``dom_rule``/``dow_rule``: the Quartz day form of that field, e.g.
    ``("L", 3)`` for ``L-3``, ``("#", 2, 2)`` for ``2#2`` (:func:`rule_text`
    writes it back; the field's value set is then empty), else None.
    ``dom_star``/``dow_star``: the day-of-month/day-of-week field text begins
    with ``*`` (cronie's DOM_STAR/DOW_STAR).  ``wildcard``: the minute or hour
    field text begins with ``*``.  ``can_fire``: some calendar date satisfies
    the month and day fields (e.g. False for ``0 0 30 2 *``).
    """

    expr: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    dom_star: bool
    dow_star: bool
    wildcard: bool
    has_seconds: bool
    can_fire: bool = True
    dom_rule: tuple | None = None
    dow_rule: tuple | None = None
    # Sorted copies for bisect (derived; excluded from equality).
    _seconds: tuple[int, ...] = field(default=(), repr=False, compare=False)
    _minutes: tuple[int, ...] = field(default=(), repr=False, compare=False)
    _hours: tuple[int, ...] = field(default=(), repr=False, compare=False)
    _months: tuple[int, ...] = field(default=(), repr=False, compare=False)
    # (days in the month, weekday of its 1st with Monday=0) -> matching days; only with a dom/dow rule.
    _day_table: dict[tuple[int, int], tuple[int, ...]] | None = field(default=None, repr=False, compare=False)

    def day_matches(self, year: int, month: int, day: int) -> bool:
        """Whether the date matches the day-of-month/day-of-week fields (cronie rule)."""
        if self._day_table is not None:
            return day in self._day_table[_month_key(year, month)]
        dom_ok = day in self.days
        dow_ok = (date(year, month, day).weekday() + 1) % 7 in self.weekdays
        if self.dom_star or self.dow_star:
            return dom_ok and dow_ok
        return dom_ok or dow_ok

    def matches_wall(self, wall: datetime) -> bool:
        """Whether a naive local wall time matches every field (to the second)."""
        return (
            wall.second in self.seconds
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
            and self.day_matches(wall.year, wall.month, wall.day)
        )


# --------------------------------------------------------------------------- parsing


def _bad(fname: str, text: str, reason: str) -> ValidationError:
    return ValidationError("cron", f"bad {fname} field {text!r}: {reason}")


def _value(spec: tuple, text: str, tok: str) -> int:
    fname, low, high, names = spec
    if tok.isdigit():
        if len(tok) > 4:
            raise _bad(fname, text, f"{tok} is out of range {low}-{high}")
        v = int(tok)
    elif names is not None and tok.upper() in names:
        return names[tok.upper()]
    else:
        if any(c in tok.upper() for c in "LW#"):
            raise _bad(fname, text, f"{tok!r}: {_WHERE_SPECIAL}")
        if any(c in tok.upper() for c in "?H"):
            raise _bad(fname, text, f"{tok!r}: ? and H are not crontab(5) syntax and are not supported")
        hint = " (names: JAN-DEC)" if fname == "month" else " (names: SUN-SAT)" if names else ""
        raise _bad(fname, text, f"{tok!r} is not a number{hint}")
    if not low <= v <= high:
        raise _bad(fname, text, f"{v} is out of range {low}-{high}")
    return v


def _parse_field(spec: tuple, text: str) -> frozenset[int]:
    fname, low, high, _ = spec
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise _bad(fname, text, "empty list item")
        m = _ITEM_RE.fullmatch(item)
        if m is None:
            raise _bad(
                fname,
                text,
                f"unsupported item {item!r} (crontab(5) allows *, N, N-M, */S, N-M/S, "
                "names and comma lists; L, W and # only in the day fields, as the whole field; "
                "?, H and @-forms other than the macros are not supported)",
            )
        star, a, b, step_text = m.groups()
        if star:
            lo, hi = low, high
        else:
            lo = _value(spec, text, a)
            if b is None:
                if step_text is not None:
                    raise _bad(
                        fname,
                        text,
                        f"{item!r}: a step needs '*' or a range (write "
                        f"'{a}-{high}/{step_text}' for {a}-max stepped)",
                    )
                hi = lo
            else:
                hi = _value(spec, text, b)
                if lo > hi:
                    hint = " (Sunday is also 7: write e.g. 6-7)" if spec is _DOW and hi == 0 else ""
                    raise _bad(fname, text, f"range {a}-{b} is descending{hint}")
        step = 1
        if step_text is not None:
            if len(step_text) > 4 or int(step_text) < 1:
                raise _bad(fname, text, f"step {step_text} must be between 1 and 9999")
            step = int(step_text)
        values.update(range(lo, hi + 1, step))
    if spec is _DOW and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values)


# ------------------------------------------------------- Quartz day forms (L, W, #)

_WHERE_SPECIAL = (
    "L, W and # are allowed only in the day-of-month field (L, L-N, LW, L-NW, NW) "
    "and the day-of-week field (NL, N#K)"
)
_DAY_NAME_RE = re.compile("|".join(_DAY_NAMES), re.IGNORECASE)
_DOM_RULE_RE = re.compile(r"L(?:-([0-9]{1,4}))?(W)?|([0-9]{1,4})W", re.IGNORECASE)
_DOW_RULE_RE = re.compile(r"([0-9]{1,4}|[A-Za-z]{3})(?:(L)|#([0-9]{1,4}))", re.IGNORECASE)


def _day_rule(spec: tuple, text: str) -> tuple | None:
    """The rule of a day field written in a Quartz form, or None for a plain crontab(5) field.

    Day-of-month: ``("L", k)`` the k-th day before the last (``L``, ``L-k``, k 0-30);
    ``("LW", k)`` the weekday nearest it (``LW``, ``L-kW``); ``("W", n)`` the weekday
    nearest day n (``nW``, n 1-31). Day-of-week (0-7 or SUN-SAT, 7 = Sunday):
    ``("NL", w)`` the last w-day of the month (``wL``); ``("#", w, k)`` the k-th w-day
    (``w#k``, k 1-5). A form must be the only item of its field; misuse raises
    ``ValidationError`` naming the field.
    """
    fname = spec[0]
    upper = text.upper()
    probe = upper if spec is _DOM else _DAY_NAME_RE.sub("", upper)
    if not any(c in probe for c in "LW#"):
        return None
    if spec is _DOW and "W" in probe:
        raise _bad(fname, text, "W (nearest weekday) is allowed only in the day-of-month field (e.g. 15W, LW)")
    if spec is _DOM and "#" in probe:
        raise _bad(fname, text, "# (the N-th weekday) is allowed only in the day-of-week field (e.g. 2#2)")
    if "," in text:
        raise _bad(fname, text, "L, W and # must be the only item of their field (no lists)")
    if "/" in text:
        raise _bad(fname, text, "L, W and # take no step")
    if spec is _DOM:
        m = _DOM_RULE_RE.fullmatch(text)
        if m is None:
            raise _bad(fname, text, "day-of-month accepts L, L-N (N 0-30), LW, L-NW and NW (N 1-31, "
                                    "one day: no range) as the whole field")
        offset, weekday, day = m.groups()
        if day is not None:
            n = int(day)
            if not 1 <= n <= 31:
                raise _bad(fname, text, f"{n}W: {n} is out of range 1-31")
            return ("W", n)
        k = int(offset) if offset is not None else 0
        if k > 30:
            raise _bad(fname, text, f"L-{offset}: the offset {k} is out of range 0-30")
        return ("LW" if weekday else "L", k)
    if "#" in upper and "L" in probe:
        raise _bad(fname, text, "L and # cannot be combined")
    if upper == "L":
        raise _bad(fname, text, "L alone is ambiguous in day-of-week (Quartz reads it as Saturday): "
                                "write 6 for Saturday, or NL for the last N-day of the month (5L)")
    m = _DOW_RULE_RE.fullmatch(text)
    if m is None:
        raise _bad(fname, text, "day-of-week accepts NL (the last N-day of the month) and N#K (the K-th "
                                "N-day, K 1-5), N 0-7 or SUN-SAT, as the whole field (no range)")
    tok, last, nth = m.groups()
    w = _value(spec, text, tok) % 7
    if last:
        return ("NL", w)
    k = int(nth)
    if not 1 <= k <= 5:
        raise _bad(fname, text, f"#{nth}: K must be 1-5 (no month has more than five of a weekday)")
    return ("#", w, k)


def rule_text(rule: tuple) -> str:
    """A day rule of :class:`CronExpr` written back as its field text (``("L", 3)`` -> ``"L-3"``)."""
    kind = rule[0]
    if kind in ("L", "LW"):
        return "L" + (f"-{rule[1]}" if rule[1] else "") + ("W" if kind == "LW" else "")
    if kind == "W":
        return f"{rule[1]}W"
    if kind == "NL":
        return f"{rule[1]}L"
    return f"{rule[1]}#{rule[2]}"


def _nearest_weekday(t: int, dim: int, base: int) -> int:
    """Quartz's W: Saturday moves back to Friday, Sunday on to Monday, never out of the month
    (a Saturday 1st gives Monday the 3rd, a Sunday last day the Friday before)."""
    w = (base + t) % 7
    if w == 6:
        return 3 if t == 1 else t - 1
    if w == 0:
        return t - 2 if t == dim else t + 1
    return t


def _dom_days(rule: tuple | None, days: frozenset[int], dim: int, base: int) -> set[int]:
    if rule is None:
        return {d for d in days if d <= dim}
    kind, n = rule
    if kind == "W":
        return {_nearest_weekday(n, dim, base)} if n <= dim else set()
    t = dim - n
    if t < 1:
        return set()
    return {_nearest_weekday(t, dim, base)} if kind == "LW" else {t}


def _dow_days(rule: tuple | None, weekdays: frozenset[int], dim: int, base: int) -> set[int]:
    if rule is None:
        return {d for d in range(1, dim + 1) if (base + d) % 7 in weekdays}
    w = rule[1]
    if rule[0] == "NL":
        return {dim - (base + dim - w) % 7}
    d = 1 + (w - base - 1) % 7 + 7 * (rule[2] - 1)
    return {d} if d <= dim else set()


def _day_table(days: frozenset[int], weekdays: frozenset[int], dom_rule: tuple | None,
               dow_rule: tuple | None, both: bool) -> dict[tuple[int, int], tuple[int, ...]]:
    """Matching days for every month shape: (days in month, weekday of the 1st) -> sorted days.

    Every shape occurs in every 400-year Gregorian cycle, so this also decides ``can_fire``.
    ``both``: the AND rule (a day field begins with ``*``), else OR.
    """
    table = {}
    for dim in (28, 29, 30, 31):
        for first in range(7):
            # first: weekday of the 1st, Monday=0; (first + d) % 7 is the cron weekday of day d
            dom = _dom_days(dom_rule, days, dim, first)
            dow = _dow_days(dow_rule, weekdays, dim, first)
            table[(dim, first)] = tuple(sorted(dom & dow if both else dom | dow))
    return table


def _days_in_month(year: int, month: int) -> int:
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        return 29
    return _DAYS_IN_MONTH[month]


def _month_key(year: int, month: int) -> tuple[int, int]:
    return _days_in_month(year, month), date(year, month, 1).weekday()


def _check_expr_text(expr: object) -> str:
    if not isinstance(expr, str):
        raise ValidationError("cron", f"expression must be a string, not {type(expr).__name__}")
    if len(expr) > MAX_EXPR_LENGTH:
        raise ValidationError("cron", f"expression is longer than {MAX_EXPR_LENGTH} characters")
    return expr


@functools.lru_cache(maxsize=2048)
def _parse_cached(expr: str) -> CronExpr:
    text = expr.strip(" \t")
    if not text:
        raise ValidationError("cron", "empty expression")
    if text.startswith("@"):
        expanded = MACROS.get(text.lower())
        if expanded is None:
            raise ValidationError(
                "cron",
                f"unsupported macro {text!r} (supported: {', '.join(MACROS)})",
            )
        text = expanded
    parts = _FIELD_SEP.split(text)
    specs: tuple[tuple, ...]
    if len(parts) == 5:
        specs, has_seconds = _FIELDS5, False
    elif len(parts) == 6:
        specs, has_seconds = _FIELDS6, True
    else:
        raise ValidationError(
            "cron",
            f"expected 5 fields (minute hour day-of-month month day-of-week) or 6 "
            f"(seconds first), got {len(parts)} in {expr!r}",
        )
    sets = []
    rules: dict[str, tuple | None] = {"day-of-month": None, "day-of-week": None}
    for spec, part in zip(specs, parts):
        rule = _day_rule(spec, part) if spec is _DOM or spec is _DOW else None
        if rule is None:
            sets.append(_parse_field(spec, part))
        else:
            rules[spec[0]] = rule
            sets.append(frozenset())
    if not has_seconds:
        sets.insert(0, frozenset({0}))
        parts = ["0", *parts]
    seconds, minutes, hours, days, months, weekdays = sets
    dom_star = parts[3].startswith("*")
    dow_star = parts[5].startswith("*")
    dom_rule, dow_rule = rules["day-of-month"], rules["day-of-week"]
    table = None
    if dom_rule is not None or dow_rule is not None:
        table = _day_table(days, weekdays, dom_rule, dow_rule, dom_star or dow_star)
        can_fire = any(table[(dim, first)] for m in months for dim in ((28, 29) if m == 2 else
                       (_DAYS_IN_MONTH[m],)) for first in range(7))
    elif dom_star or dow_star:
        can_fire = any(d <= _MAX_DAYS_IN_MONTH[m] for m in months for d in days)
    else:
        # OR rule: every month contains every weekday and weekdays is non-empty.
        can_fire = True
    return CronExpr(
        expr=expr,
        seconds=seconds,
        minutes=minutes,
        hours=hours,
        days=days,
        months=months,
        weekdays=weekdays,
        dom_star=dom_star,
        dow_star=dow_star,
        wildcard=parts[1].startswith("*") or parts[2].startswith("*"),
        has_seconds=has_seconds,
        can_fire=can_fire,
        dom_rule=dom_rule,
        dow_rule=dow_rule,
        _seconds=tuple(sorted(seconds)),
        _minutes=tuple(sorted(minutes)),
        _hours=tuple(sorted(hours)),
        _months=tuple(sorted(months)),
        _day_table=table,
    )


def parse(expr: str) -> CronExpr:
    """Parse a crontab(5) expression (cronie dialect) into a :class:`CronExpr`.

    Accepts 5 fields, 6 fields (leading seconds) or a macro (``@daily`` ...).
    Parsing is cached.  Does not check that the expression can ever fire
    (see :func:`validate`).

    Raises :class:`~cron_at_scale.exceptions.ValidationError` with field
    ``"cron"`` and a message naming the field and the bad text, e.g.
    ``"cron: bad day-of-month field '32': 32 is out of range 1-31"``.
    """
    return _parse_cached(_check_expr_text(expr))


def _never_fires(cx: CronExpr) -> ValidationError:
    if cx.dom_rule is None and cx.dow_rule is None:
        why = "a day in its day-of-month field"
    elif cx.dow_rule is None and len(cx.weekdays) == 7:
        why = f"the day its day-of-month field {rule_text(cx.dom_rule)!r} selects"  # type: ignore[arg-type]
    elif cx.dom_rule is None and len(cx.days) == 31:
        why = f"the day its day-of-week field {rule_text(cx.dow_rule)!r} selects"  # type: ignore[arg-type]
    else:
        why = "a day matching both its day-of-month and day-of-week fields (one of them begins with *: AND)"
    return ValidationError("cron", f"expression {cx.expr!r} can never fire: no month in its month field has {why}")


# ------------------------------------------------------------------------ time zones


@functools.lru_cache(maxsize=512)
def _zone_cached(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except Exception as exc:  # ZoneInfoNotFoundError, ValueError, OSError ...
        raise ValidationError("tz", f"unknown time zone {tz!r}") from exc


def zone_name(tz: object) -> object:
    """An IANA name for ``tz``: a ``ZoneInfo`` gives its key, ``datetime.timezone.utc`` gives
    ``"UTC"``; anything else is returned as it is (and validated by the caller)."""
    if isinstance(tz, ZoneInfo) and tz.key:
        return tz.key
    if tz is timezone.utc:
        return "UTC"
    return tz


def check_zone(tz: str) -> ZoneInfo:
    """The ``ZoneInfo`` of IANA name ``tz`` (or a ``ZoneInfo``); ``ValidationError`` field ``"tz"`` otherwise."""
    return _zone(tz)


def _zone(tz: str) -> ZoneInfo:
    tz = zone_name(tz)  # type: ignore[assignment]
    if not isinstance(tz, str):
        raise ValidationError("tz", f"time zone must be a string, not {type(tz).__name__}")
    if not tz:
        raise ValidationError("tz", "time zone is empty")
    if len(tz) > MAX_TZ_LENGTH:
        raise ValidationError("tz", f"time zone is longer than {MAX_TZ_LENGTH} characters")
    return _zone_cached(tz)


def validate(expr: str, tz: str) -> None:
    """Check that ``expr`` is a valid cron expression that can fire, in a valid zone.

    ``tz`` must be an IANA zone key known to :mod:`zoneinfo`.  Raises
    :class:`~cron_at_scale.exceptions.ValidationError` with field ``"cron"``
    (syntax, or an expression that can never fire such as ``0 0 30 2 *``) or
    ``"tz"`` (unknown, empty or over-long zone).  Returns ``None``.
    """
    cx = parse(expr)  # length-bounded before any work
    if not cx.can_fire:
        raise _never_fires(cx)
    _zone(tz)


# ---------------------------------------------------------------------- generation


def _matching_days(cx: CronExpr, year: int, month: int, start: int):
    """Days >= start of (year, month) that satisfy the day fields."""
    dim = _DAYS_IN_MONTH[month]
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        dim = 29
    days, weekdays = cx.days, cx.weekdays
    # Cron weekday of day 0 of the month (Sunday=0).
    base = date(year, month, 1).weekday()  # Monday=0, so (base + d) % 7 is cron dow of day d
    if cx.dom_star or cx.dow_star:
        for d in range(start, dim + 1):
            if d in days and (base + d) % 7 in weekdays:
                yield d
    else:
        for d in range(start, dim + 1):
            if d in days or (base + d) % 7 in weekdays:
                yield d


def _local_times(cx: CronExpr, start: datetime):
    """Matching naive local wall times >= start (second resolution), increasing."""
    y0, mo0, d0, h0, mi0, s0 = (
        start.year,
        start.month,
        start.day,
        start.hour,
        start.minute,
        start.second,
    )
    months, hours, minutes, seconds = cx._months, cx._hours, cx._minutes, cx._seconds
    table = cx._day_table
    last_year = min(y0 + _MAX_YEARS, 9999)
    y = y0
    while y <= last_year:
        first_year = y == y0
        for mo in months[bisect_left(months, mo0) :] if first_year else months:
            first_month = first_year and mo == mo0
            if table is None:
                month_days = _matching_days(cx, y, mo, d0 if first_month else 1)
            else:
                month_days = table[_month_key(y, mo)]
                if first_month:
                    month_days = month_days[bisect_left(month_days, d0) :]
            for d in month_days:
                first_day = first_month and d == d0
                for h in hours[bisect_left(hours, h0) :] if first_day else hours:
                    first_hour = first_day and h == h0
                    for mi in minutes[bisect_left(minutes, mi0) :] if first_hour else minutes:
                        if first_hour and mi == mi0:
                            for s in seconds[bisect_left(seconds, s0) :]:
                                yield datetime(y, mo, d, h, mi, s)
                        else:
                            for s in seconds:
                                yield datetime(y, mo, d, h, mi, s)
        y += 1
    if last_year == 9999:
        raise ValidationError("after", "no fire time before the year 10000")
    raise ValidationError(
        "cron",
        f"expression {cx.expr!r} can never fire: no fire time within {_MAX_YEARS} years",
    )


def _gap_jump(t: datetime, z: ZoneInfo, off0: timedelta, off1: timedelta) -> datetime:
    """UTC instant (naive) of the spring-forward transition that skips wall time t.

    t lies in [T + off0, T + off1), so T lies in (t - off1, t - off0]; binary
    search the first second whose UTC offset is no longer ``off0``.
    """
    lo_utc = t - off1
    base = lo_utc.replace(tzinfo=_UTC)
    lo, hi = 0, int((off1 - off0).total_seconds())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (base + timedelta(seconds=mid)).astimezone(z).utcoffset() == off0:
            lo = mid
        else:
            hi = mid
    return lo_utc + timedelta(seconds=hi)


def _images(t: datetime, z: ZoneInfo, wildcard: bool) -> tuple[datetime, tuple[datetime, ...]]:
    """Map local wall time t to (lower, fire instants), all naive UTC.

    ``lower`` is the first instant at which the wall clock reaches t; it is
    non-decreasing in t and no fire instant of t or of a later wall time is
    below it.
    """
    off0 = _offset(t.replace(tzinfo=z))
    off1 = _offset(t.replace(tzinfo=z, fold=1))
    if off0 == off1:
        u = t - off0
        return u, (u,)
    if off0 > off1:  # fall-back overlap: fold=0 is the first occurrence
        u = t - off0
        return u, ((u, t - off1) if wildcard else (u,))
    # spring-forward gap (PEP 495: fold=0 uses the offset before the transition)
    if wildcard:
        return t - off1, ()
    jump = _gap_jump(t, z, off0, off1)
    return jump, (jump,)


def _offset(aware: datetime) -> timedelta:
    """UTC offset of an aware datetime in a ZoneInfo zone (never None there)."""
    off = aware.utcoffset()
    assert off is not None
    return off


def _after_utc(after: datetime, name: str = "after") -> datetime:
    if not isinstance(after, datetime):
        raise ValidationError(name, f"must be a datetime, not {type(after).__name__}")
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValidationError(name, "must be an aware datetime (naive datetimes are ambiguous)")
    return after.astimezone(_UTC).replace(tzinfo=None)


def _start_local(after_utc: datetime, z: ZoneInfo) -> datetime:
    """Earliest local wall time that can map to an instant after ``after_utc``.

    The wall clock reads at least ``after + min(offsets soon after)``; an
    overlap starting shortly after ``after`` lowers it.
    """
    a = after_utc.replace(tzinfo=_UTC)
    off = min(
        _offset(a.astimezone(z)),
        _offset((a + timedelta(hours=3)).astimezone(z)),
        _offset((a + timedelta(days=1)).astimezone(z)),
    )
    return (after_utc + off).replace(microsecond=0)


def next_fire_times(expr: str, tz: str, after: datetime, n: int) -> list[datetime]:
    """The next ``n`` fire instants of ``expr`` in zone ``tz``, strictly after ``after``.

    ``after`` must be an aware datetime.  Returns a list of ``n`` aware UTC
    datetimes (``tzinfo=datetime.timezone.utc``), strictly increasing, all
    ``> after``.  Fields are matched against local wall time in ``tz``;
    day-of-month/day-of-week combine as in cronie (AND if either field text
    begins with ``*``, else OR); DST gaps and overlaps follow the Vixie
    cron/cronie policy described in the module docstring.

    Raises ``ValidationError`` with field ``"cron"`` (bad expression, or one
    that can never fire -- detected up front, never by looping), ``"tz"``
    (unknown zone), ``"after"`` (naive or not a datetime) or ``"n"``
    (not a non-negative int).
    """
    cx = parse(expr)
    if not cx.can_fire:
        raise _never_fires(cx)
    z = _zone(tz)
    after_utc = _after_utc(after)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValidationError("n", "must be a non-negative int")
    if n == 0:
        return []
    wildcard = cx.wildcard
    results: list[datetime] = []
    pending: list[datetime] = []  # heap of second occurrences (wildcard overlaps)
    try:
        for t in _local_times(cx, _start_local(after_utc, z)):
            lower, images = _images(t, z, wildcard)
            # Everything pending at or below `lower` is final: no later wall
            # time maps below `lower`.
            while pending and pending[0] <= lower:
                u = heapq.heappop(pending)
                if u > after_utc and (not results or u > results[-1]):
                    results.append(u)
            if len(results) >= n:
                break
            if images:
                u = images[0]  # == lower: final
                if u > after_utc and (not results or u > results[-1]):
                    results.append(u)
                    if len(results) >= n:
                        break
                for u in images[1:]:
                    heapq.heappush(pending, u)
    except OverflowError as exc:
        raise ValidationError("after", "no representable fire time after this instant") from exc
    return [u.replace(tzinfo=_UTC) for u in results[:n]]


def next_fire_time(expr: str, tz: str, after: datetime) -> datetime:
    """The next fire instant strictly after ``after``: ``next_fire_times(expr, tz, after, 1)[0]``.

    Returns an aware UTC datetime; raises ``ValidationError`` as
    :func:`next_fire_times` does.
    """
    return next_fire_times(expr, tz, after, 1)[0]


def matches(expr: str, tz: str, instant: datetime) -> bool:
    """Whether the local wall time of ``instant`` in ``tz`` matches every field of ``expr``.

    ``instant`` must be aware; sub-second parts are ignored.  This is the plain
    field test: it says nothing about the DST policy (a gap jump of a
    fixed-time job fires at a wall time that need not match).
    """
    cx = parse(expr)
    z = _zone(tz)
    _after_utc(instant, "instant")
    return cx.matches_wall(instant.astimezone(z).replace(tzinfo=None))
