"""Unit tests for cron_at_scale.cron (no database, no Django settings needed)."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from datetime import datetime, timedelta, timezone
from functools import cache
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cron_at_scale.cron import (
    MACROS,
    matches,
    next_fire_time,
    next_fire_times,
    parse,
    validate,
)
from cron_at_scale.exceptions import ValidationError

UTC = timezone.utc

# --------------------------------------------------------------------------- cases

_HERE = Path(__file__).resolve()
_CASE_FILES = [
    _HERE.parents[1] / "data" / "cron_cases.json",  # copy kept in the repo (clean clones, CI)
    _HERE.parents[2].parent / "shared" / "cases" / "cron_cases.json",  # shared reference
]


def _load_cases() -> list[dict]:
    for path in _CASE_FILES:
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    return []


CASES = _load_cases()
_NO_CASES = pytest.param(
    None,
    marks=pytest.mark.skip(reason=f"cron_cases.json not found in {[str(p) for p in _CASE_FILES]}"),
)


def _case_params(cases: list[dict]) -> list:
    return [pytest.param(c, id=c["id"]) for c in cases] or [_NO_CASES]


def _z(dt: datetime) -> str:
    assert dt.tzinfo is UTC
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_case_files_agree():
    """The repo copy must not drift from the shared reference file (when both exist)."""
    texts = [json.loads(p.read_text(encoding="utf-8")) for p in _CASE_FILES if p.is_file()]
    if len(texts) < 2:
        pytest.skip("../shared/cases/cron_cases.json is not beside this checkout: nothing to compare the repo copy with")
    assert texts[0] == texts[1]


@pytest.mark.parametrize("case", _case_params(CASES))
def test_reference_case(case):
    inp, expected = case["input"], case["expected"]["next"]
    after = datetime.fromisoformat(inp["after"])
    if expected:
        validate(inp["cron"], inp["tz"])
        got = next_fire_times(inp["cron"], inp["tz"], after, len(expected))
        assert [_z(d) for d in got] == expected, case.get("notes")
        assert next_fire_time(inp["cron"], inp["tz"], after) == got[0]
    else:
        with pytest.raises(ValidationError) as exc:
            validate(inp["cron"], inp["tz"])
        assert exc.value.field == "cron"
        assert "never fire" in str(exc.value)
        started = time.perf_counter()
        with pytest.raises(ValidationError) as exc:
            next_fire_times(inp["cron"], inp["tz"], after, 3)
        assert exc.value.field == "cron"
        assert time.perf_counter() - started < 0.5


# ------------------------------------------------------- why not croniter's iteration


def _croniter_next(expr: str, tz: str, after: datetime, n: int) -> list[str]:
    """How the case file's ``croniter_7_0_0_returns`` was produced: start croniter at
    ``after`` converted to the job's zone (aware) and call get_next(datetime) n times."""
    from croniter import croniter

    it = croniter(expr, after.astimezone(ZoneInfo(tz)))
    return [_z(it.get_next(datetime).astimezone(UTC)) for _ in range(n)]


def _require_croniter_700():
    croniter_mod = pytest.importorskip("croniter")
    version = getattr(croniter_mod, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v

        version = _v("croniter")
    if version != "7.0.0":
        pytest.skip(f"recorded outputs are for croniter 7.0.0, installed {version}")


@pytest.mark.parametrize(
    "case", _case_params([c for c in CASES if "croniter_7_0_0_returns" in c])
)
def test_croniter_7_0_0_really_returns(case):
    """Documents the recorded croniter 7.0.0 output (and hence why we do not use
    croniter's iteration: cronie's DOM_STAR rule and the DST policy differ)."""
    _require_croniter_700()
    inp = case["input"]
    recorded = case["croniter_7_0_0_returns"]
    after = datetime.fromisoformat(inp["after"])
    got = _croniter_next(inp["cron"], inp["tz"], after, len(recorded))
    assert got == recorded
    ours = [
        _z(d)
        for d in next_fire_times(
            inp["cron"], inp["tz"], datetime.fromisoformat(inp["after"]), len(recorded)
        )
    ]
    assert ours == case["expected"]["next"][: len(recorded)]
    if case["id"] in {"C57", "C59"}:
        # Recorded although croniter agrees with the expected value here.
        assert got == ours
    else:
        assert got != ours


# -------------------------------------------------------------------- syntax table

BAD_EXPRESSIONS = [
    ("* * * *", "expected 5 fields"),
    ("60 * * * *", "minute field '60': 60 is out of range 0-59"),
    ("* 24 * * *", "hour field '24': 24 is out of range 0-23"),
    ("* * 0 * *", "day-of-month field '0': 0 is out of range 1-31"),
    ("* * 32 * *", "day-of-month field '32': 32 is out of range 1-31"),
    ("* * * 13 *", "month field '13': 13 is out of range 1-12"),
    ("* * * * 8", "day-of-week field '8': 8 is out of range 0-7"),
    ("5-2 * * * *", "minute field '5-2': range 5-2 is descending"),
    ("*/0 * * * *", "minute field '*/0'"),
    ("L * * * *", "minute field 'L'"),
    ("0 0 1,L * *", "day-of-month field '1,L'"),
    ("0 0 1-15W * *", "day-of-month field '1-15W'"),
    ("0 0 ? * *", "day-of-month field '?'"),
    ("0 0 * * 1#6", "day-of-week field '1#6'"),
    ("0 0 * * 5L,1", "day-of-week field '5L,1'"),
    ("H * * * *", "minute field 'H'"),
    ("H(0-29) * * * *", "minute field 'H(0-29)'"),
    ("@reboot", "@reboot"),
    ("@every 5m", "@every 5m"),
    ("@", "'@'"),
    ("", "empty"),
    ("   ", "empty"),
    ("a b c d e", "minute field 'a'"),
    ("MON * * * *", "minute field 'MON'"),
    ("* * * FOO *", "month field 'FOO'"),
    ("* * * * MONDAY", "day-of-week field 'MONDAY'"),
    ("* * * * MON-SUN", "day-of-week field 'MON-SUN': range MON-SUN is descending"),
    ("1,,2 * * * *", "minute field '1,,2': empty list item"),
    ("1, * * * *", "minute field '1,'"),
    ("5/15 * * * *", "minute field '5/15'"),
    ("-1 * * * *", "minute field '-1'"),
    ("1-2-3 * * * *", "minute field '1-2-3'"),
    ("*/ * * * *", "minute field '*/'"),
    ("*/-1 * * * *", "minute field '*/-1'"),
    ("** * * * *", "minute field '**'"),
    ("60 * * * * *", "seconds field '60'"),
    ("0 60 * * * *", "minute field '60'"),
    ("0 0 * * 1\n", "day-of-week field"),
    ("0 0 * * *\n* * * * *", "got 9"),
    ("1 2 3 4 5 6 7", "got 7"),
    ("* " * 500, "longer than 200"),
    ("0" * 1000, "longer than 200"),
]


@pytest.mark.parametrize(("expr", "fragment"), BAD_EXPRESSIONS)
def test_bad_expression_rejected(expr, fragment):
    for call in (lambda: parse(expr), lambda: validate(expr, "UTC")):
        with pytest.raises(ValidationError) as exc:
            call()
        assert exc.value.field == "cron"
        assert exc.value.message_dict == {"cron": [str(exc.value)]}
        assert str(exc.value).startswith("cron: ")
        assert fragment in str(exc.value), str(exc.value)
    with pytest.raises(ValidationError):
        next_fire_times(expr, "UTC", datetime(2024, 1, 1, tzinfo=UTC), 1)


@pytest.mark.parametrize("expr", [None, 5, 1.5, b"* * * * *", ["* * * * *"], ("*",) * 5])
def test_non_string_expression_rejected(expr):
    with pytest.raises(ValidationError) as exc:
        validate(expr, "UTC")
    assert exc.value.field == "cron"
    assert "must be a string" in str(exc.value)


def test_validation_error_is_value_error_and_django():
    from django.core.exceptions import ValidationError as DjangoValidationError

    with pytest.raises(ValueError):
        parse("61 * * * *")
    with pytest.raises(DjangoValidationError):
        parse("61 * * * *")


@pytest.mark.parametrize(
    "tz",
    ["Mars/Olympus", "", "../etc/passwd", "UTC" * 30, "/etc/localtime", "America", "UTC\x00",
     "Europe/London/", None, 3],
)
def test_bad_zone_rejected(tz):
    with pytest.raises(ValidationError) as exc:
        validate("* * * * *", tz)
    assert exc.value.field == "tz"
    with pytest.raises(ValidationError) as exc:
        next_fire_times("* * * * *", tz, datetime(2024, 1, 1, tzinfo=UTC), 1)
    assert exc.value.field == "tz"


def test_length_checked_before_work():
    huge = "1," * 100_000 + "1 * * * *"
    started = time.perf_counter()
    with pytest.raises(ValidationError, match="longer than 200"):
        validate(huge, "UTC")
    assert time.perf_counter() - started < 0.05


@pytest.mark.parametrize(
    "expr",
    ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *", "0 0 30,31 2 */2", "0 0 31 4 */2",
     "0 0 0 30 2 *", "0 0 31 APR,JUN *", "* * 30-31 2 *"],
)
def test_never_fires_rejected_fast(expr):
    started = time.perf_counter()
    with pytest.raises(ValidationError, match="can never fire") as exc:
        validate(expr, "UTC")
    assert exc.value.field == "cron"
    with pytest.raises(ValidationError, match="can never fire"):
        next_fire_times(expr, "Europe/London", datetime(2024, 1, 1, tzinfo=UTC), 5)
    assert time.perf_counter() - started < 0.5
    assert parse(expr).can_fire is False


@pytest.mark.parametrize(
    ("expr", "first"),
    [
        ("0 0 29 2 *", "2028-02-29T00:00:00Z"),
        ("0 0 30 2 1", "2025-02-03T00:00:00Z"),  # OR rule: Mondays in February
        ("0 0 31 4 MON", "2025-04-07T00:00:00Z"),  # OR rule: Mondays in April
        ("0 0 30 2 0-7", "2025-02-01T00:00:00Z"),  # OR rule, '0-7' is not starred
        ("0 0 29 2 */7", "2032-02-29T00:00:00Z"),  # AND: a Sunday 29 Feb
        ("0 0 29 2 1", "2025-02-03T00:00:00Z"),
    ],
)
def test_rare_but_possible(expr, first):
    validate(expr, "UTC")
    assert _z(next_fire_time(expr, "UTC", datetime(2025, 1, 1, tzinfo=UTC))) == first


def test_after_must_be_aware_datetime():
    for bad in (datetime(2024, 1, 1), "2024-01-01T00:00:00Z", 0, None):
        with pytest.raises(ValidationError) as exc:
            next_fire_times("* * * * *", "UTC", bad, 1)
        assert exc.value.field == "after"
    with pytest.raises(ValidationError) as exc:
        matches("* * * * *", "UTC", datetime(2024, 1, 1))
    assert exc.value.field == "instant"


def test_n():
    a = datetime(2024, 1, 1, tzinfo=UTC)
    assert next_fire_times("* * * * *", "UTC", a, 0) == []
    for bad in (-1, 1.0, "3", True):
        with pytest.raises(ValidationError) as exc:
            next_fire_times("* * * * *", "UTC", a, bad)
        assert exc.value.field == "n"
    got = next_fire_times("* * * * *", "UTC", a, 1000)
    assert len(got) == 1000 and got[-1] == a + timedelta(minutes=1000)


def test_end_of_time_does_not_crash_or_loop():
    with pytest.raises(ValidationError):
        next_fire_times("0 0 1 1 *", "Pacific/Kiritimati", datetime(9999, 12, 31, tzinfo=UTC), 3)
    with pytest.raises(ValidationError):
        next_fire_times("* * * * *", "UTC", datetime(9999, 12, 31, 23, 59, tzinfo=UTC), 3)


# ------------------------------------------------------------------- parse results


def test_parse_fields():
    cx = parse("*/15 9-17 1,15 JAN-mar mon-FRI")
    assert cx.seconds == frozenset({0}) and not cx.has_seconds
    assert cx.minutes == {0, 15, 30, 45}
    assert cx.hours == set(range(9, 18))
    assert cx.days == {1, 15}
    assert cx.months == {1, 2, 3}
    assert cx.weekdays == {1, 2, 3, 4, 5}
    assert (cx.dom_star, cx.dow_star, cx.wildcard) == (False, False, True)

    cx6 = parse("*/20 0 12 * * *")
    assert cx6.has_seconds and cx6.seconds == {0, 20, 40}
    assert cx6.wildcard is False  # the seconds field does not count
    assert parse("0 */2 * * *").wildcard and parse("0 * * * *").wildcard
    assert not parse("0 0-23 * * *").wildcard
    assert parse("0 0 */2 * 1").dom_star and not parse("0 0 1-31 * 1").dom_star
    assert parse("0 0 1 * */2").dow_star
    assert parse("0 0 * * 6-7").weekdays == {6, 0}
    assert parse("0 0 * * */2").weekdays == {0, 2, 4, 6}
    assert parse("0 0 * * 0-7").weekdays == set(range(7))
    assert parse("0 0 * * 5-7/2").weekdays == {5, 0}
    assert parse("1-30/7 0 * * *").minutes == {1, 8, 15, 22, 29}
    assert parse("*/45 * * * *").minutes == {0, 45}
    assert parse("*/100 * * * *").minutes == {0}
    assert parse("05 09 * * *").minutes == {5}
    assert parse("\t0  0 * * *  ").hours == {0}
    assert parse("0 0 * * *") is parse("0 0 * * *")  # cached
    with pytest.raises(dataclasses.FrozenInstanceError):
        parse("0 0 * * *").minutes = frozenset()  # type: ignore[misc]


@pytest.mark.parametrize("macro", sorted(MACROS))
def test_macros_equal_expansions(macro):
    expansion = MACROS[macro]
    a, b = parse(macro), parse(expansion)
    assert (a.minutes, a.hours, a.days, a.months, a.weekdays) == (
        b.minutes, b.hours, b.days, b.months, b.weekdays)
    assert (a.dom_star, a.dow_star, a.wildcard) == (b.dom_star, b.dow_star, b.wildcard)
    assert parse(macro.upper()).hours == a.hours
    after = datetime(2024, 3, 9, 12, tzinfo=UTC)
    assert next_fire_times(macro, "America/New_York", after, 5) == next_fire_times(
        expansion, "America/New_York", after, 5)


def test_macro_expansions():
    assert MACROS == {
        "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
        "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
        "@hourly": "0 * * * *",
    }
    assert parse("@hourly").wildcard and not parse("@daily").wildcard


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("0 0 * * 0", "0 0 * * 7"),
        ("0 0 * * SUN", "0 0 * * 7"),
        ("0 0 * * 6-7", "0 0 * * SAT,SUN"),
        ("0 0 * * MON-FRI", "0 0 * * 1-5"),
        ("0 0 * * mon-fri/2", "0 0 * * 1,3,5"),
        ("0 0 1 JAN-MAR *", "0 0 1 1-3 *"),
        ("0 0 1 jan,Jun,DEC *", "0 0 1 1,6,12 *"),
        ("0 0 1 */3 *", "0 0 1 JAN,APR,JUL,OCT *"),
    ],
)
def test_equivalent_spellings(a, b):
    after = datetime(2024, 1, 1, tzinfo=UTC)
    assert parse(a).weekdays == parse(b).weekdays and parse(a).months == parse(b).months
    assert next_fire_times(a, "Europe/London", after, 8) == next_fire_times(
        b, "Europe/London", after, 8)


def test_results_are_aware_utc_and_strict():
    after = datetime(2024, 1, 1, 0, 7, 30, 123456, tzinfo=ZoneInfo("Europe/Paris"))
    got = next_fire_times("*/15 * * * *", "Asia/Kolkata", after, 4)
    assert all(d.tzinfo is UTC for d in got)
    assert got[0] > after and all(x < y for x, y in zip(got, got[1:]))
    # 'after' equal to a fire time is exclusive
    assert next_fire_time("0 * * * *", "UTC", datetime(2024, 1, 1, 5, tzinfo=UTC)) == datetime(
        2024, 1, 1, 6, tzinfo=UTC)


def test_matches():
    assert matches("0 0 * * 0", "America/Santiago", datetime(2024, 9, 8, 4, tzinfo=UTC)) is False
    # 2024-09-08T04:00Z is 01:00 -03 on Sunday 8 Sep (00:00 did not exist)
    assert matches("0 1 * * SUN", "America/Santiago", datetime(2024, 9, 8, 4, tzinfo=UTC))
    assert matches("30 1 * * *", "America/New_York", datetime(2024, 11, 3, 5, 30, tzinfo=UTC))
    assert matches("30 1 * * *", "America/New_York", datetime(2024, 11, 3, 6, 30, tzinfo=UTC))
    assert not matches("30 1 * * *", "America/New_York", datetime(2024, 11, 3, 6, 31, tzinfo=UTC))
    assert matches("15 * * * * *", "UTC", datetime(2024, 1, 1, 0, 0, 15, tzinfo=UTC))
    assert not matches("* * * * *", "UTC", datetime(2024, 1, 1, 0, 0, 15, tzinfo=UTC))


def test_six_field_seconds_and_gap_collapse():
    after = datetime(2024, 1, 1, tzinfo=UTC)
    assert [_z(d) for d in next_fire_times("*/20 * * * * *", "UTC", after, 4)] == [
        "2024-01-01T00:00:20Z", "2024-01-01T00:00:40Z", "2024-01-01T00:01:00Z",
        "2024-01-01T00:01:20Z"]
    # fixed-time 6-field job (minute and hour fixed): every second of 02:30 collapses at the jump
    got = next_fire_times("* 30 2 * * *", "America/New_York",
                          datetime(2024, 3, 10, tzinfo=UTC), 3)
    assert [_z(d) for d in got] == [
        "2024-03-10T07:00:00Z", "2024-03-11T06:30:00Z", "2024-03-11T06:30:01Z"]


def test_historical_odd_offsets():
    # Amsterdam 1937-07-01: +00:19:32 -> +00:20, wall 00:00:00-00:00:27 skipped
    got = next_fire_times("0 0 0 1 7 *", "Europe/Amsterdam",
                          datetime(1937, 6, 30, 12, tzinfo=UTC), 2)
    assert got[0] == datetime(1937, 6, 30, 22, 40, 28, tzinfo=UTC)
    # Monrovia 1972-01-07: -00:44:30 -> +00:00 at 00:00:00 LMT-ish wall, 44.5 minutes skipped
    got = next_fire_times("10 0 7 1 *", "Africa/Monrovia", datetime(1972, 1, 6, tzinfo=UTC), 1)
    assert got[0] == datetime(1972, 1, 7, 0, 44, 30, tzinfo=UTC)
    # Apia skipped 30 Dec 2011 entirely: fixed job runs at the jump, wildcard job does not
    after = datetime(2011, 12, 29, tzinfo=UTC)
    assert next_fire_time("0 12 30 12 *", "Pacific/Apia", after) == datetime(
        2011, 12, 30, 10, tzinfo=UTC)
    assert next_fire_time("0 * 30 12 *", "Pacific/Apia", after).year == 2012
    # New York 1883: LMT -4:56:02 -> EST at 12:03:58 wall, 12:00:00-12:03:57 repeated
    after = datetime(1883, 11, 18, 16, 50, tzinfo=UTC)
    for expr in ("* 12 18 11 *", "0-59 12 18 11 *", "*/2 12 18 11 *", "3 12 18 11 *"):
        got = next_fire_times(expr, "America/New_York", after, 8)
        assert all(x < y for x, y in zip(got, got[1:]))
        for u in got:
            _assert_fire_is_justified(expr, "America/New_York", u)
        end = min(got[-1], after + timedelta(minutes=40))
        assert _brute(expr, "America/New_York", after, end, timedelta(seconds=1),
                      timedelta(minutes=20)) == [u for u in got if u <= end]
    assert next_fire_times("3 12 18 11 *", "America/New_York", after, 1)[0] == datetime(
        1883, 11, 18, 16, 59, 2, tzinfo=UTC)  # 12:03:00 LMT, once
    assert [u.minute for u in next_fire_times("* 12 18 11 *", "America/New_York", after, 6)
            ] == [56, 57, 58, 59, 0, 1]  # wildcard: 12:00-12:03 twice


def test_hot_path_is_fast():
    after = datetime(2024, 5, 5, 12, 3, tzinfo=UTC)
    next_fire_times("*/5 * * * *", "America/New_York", after, 1)
    loops = 2000
    started = time.perf_counter()
    for _ in range(loops):
        next_fire_times("*/5 * * * *", "America/New_York", after, 1)
    per_call = (time.perf_counter() - started) / loops
    assert per_call < 0.002  # generous: typically ~20 microseconds


# ------------------------------------------------------------ brute-force oracle


@cache
def _zone(tz: str) -> ZoneInfo:
    return ZoneInfo(tz)


def _wall(u: datetime, z: ZoneInfo) -> datetime:
    return u.astimezone(z).replace(tzinfo=None)


def _brute(expr: str, tz: str, after: datetime, end: datetime, step: timedelta,
           prewarm: timedelta) -> list[datetime]:
    """Fires in (after, end] by walking UTC instants at `step` granularity.

    Independent of the implementation's DST logic: a wildcard job fires
    whenever the running wall clock shows a matching time; a fixed-time job
    fires at the first instant the wall clock reaches or passes a matching wall
    time it has never shown before (covers gap catch-up and first-occurrence).
    """
    cx = parse(expr)
    z = _zone(tz)
    u = after.astimezone(UTC) - prewarm
    u = u.replace(microsecond=0)
    if step == timedelta(minutes=1):
        u = u.replace(second=0)
    high = _wall(u, z)
    out: list[datetime] = []
    u += step
    while u <= end:
        w = _wall(u, z)
        if cx.wildcard:
            fire = cx.matches_wall(w)
        else:
            fire = False
            if w > high:
                g = w
                while g > high:  # wall times newly reached, newest first
                    if cx.matches_wall(g):
                        fire = True
                        break
                    g -= step
            high = max(high, w)
        if fire and u > after:
            out.append(u)
        u += step
    return out


def _assert_fire_is_justified(expr: str, tz: str, u: datetime) -> None:
    cx = parse(expr)
    if matches(expr, tz, u):
        return
    # otherwise it must be the jump of a fixed-time job over a matching gap time
    assert not cx.wildcard, f"{u} does not match {expr!r} in {tz}"
    z = _zone(tz)
    before = _wall(u - timedelta(seconds=1), z)
    now = _wall(u, z)
    assert now - before > timedelta(seconds=1), f"{u} is neither a match nor a jump"
    g = now - timedelta(seconds=1)
    while g > before:  # the skipped wall times, second by second
        if cx.matches_wall(g):
            return
        g -= timedelta(seconds=1)
    pytest.fail(f"{u}: no matching wall time in the gap {before}..{now}")


# ----------------------------------------------------------- hypothesis strategies

ZONES = [
    "UTC", "America/New_York", "Europe/London", "Australia/Sydney", "Australia/Lord_Howe",
    "America/Santiago", "Asia/Kolkata", "Pacific/Chatham",
]


def _transitions(tz: str) -> list[datetime]:
    z = ZoneInfo(tz)
    out = []
    u = datetime(2020, 1, 1, tzinfo=UTC)
    prev = u.astimezone(z).utcoffset()
    while u.year < 2031:
        nxt = u + timedelta(hours=6)
        off = nxt.astimezone(z).utcoffset()
        if off != prev:
            lo, hi = u, nxt
            while hi - lo > timedelta(seconds=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(z).utcoffset() == prev:
                    lo = mid
                else:
                    hi = mid
            out.append(hi)
            prev = off
        u = nxt
    return out


TRANSITIONS = {tz: _transitions(tz) for tz in ZONES}
DST_ZONES = [tz for tz in ZONES if TRANSITIONS[tz]]


def _item(lo: int, hi: int, hot: int | None = None):
    num = st.integers(lo, hi)
    if hot is not None:  # bias towards small values (DST hours 0-3)
        num = st.one_of(st.integers(lo, hot), num)
    return st.one_of(
        st.just("*"),
        num.map(str),
        st.tuples(num, num).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        st.integers(1, hi + 1).map(lambda s: f"*/{s}"),
        st.tuples(num, num, st.integers(1, hi + 1)).map(
            lambda t: f"{min(t[0], t[1])}-{max(t[0], t[1])}/{t[2]}"),
    )


def _field(lo: int, hi: int, hot: int | None = None, star_weight: bool = False):
    f = st.lists(_item(lo, hi, hot), min_size=1, max_size=3).map(",".join)
    return st.one_of(st.just("*"), st.just("*"), f) if star_weight else f


@st.composite
def expressions(draw, six: bool | None = None):
    minute = draw(_field(0, 59))
    hour = draw(_field(0, 23, hot=3))
    dom = draw(_field(1, 31, star_weight=True))
    month = draw(st.one_of(st.just("*"), st.just("*"), st.just("*"), _field(1, 12)))
    dow = draw(_field(0, 7, star_weight=True))
    fields = [minute, hour, dom, month, dow]
    if six is None:
        six = draw(st.integers(0, 5)) == 0
    if six:
        fields.insert(0, draw(_field(0, 59)))
    return " ".join(fields)


@st.composite
def starts(draw, tz: str):
    trans = TRANSITIONS[tz]
    if trans and draw(st.booleans()):
        base = draw(st.sampled_from(trans))
        delta = timedelta(seconds=draw(st.integers(-30 * 3600, 4 * 3600)))
    else:
        base = datetime(2020, 1, 1, tzinfo=UTC)
        delta = timedelta(seconds=draw(st.integers(0, 11 * 365 * 86400)))
    after = base + delta
    if draw(st.booleans()):
        after = after.replace(second=0)
    if draw(st.integers(0, 4)) == 0:
        after = after.replace(microsecond=draw(st.integers(0, 999_999)))
    as_zone = draw(st.sampled_from([UTC, ZoneInfo(tz), ZoneInfo("Asia/Tokyo")]))
    return after.astimezone(as_zone)


zones_and_starts = st.sampled_from(ZONES).flatmap(lambda tz: st.tuples(st.just(tz), starts(tz)))


def _check_against_brute(expr: str, tz: str, after: datetime, n: int) -> None:
    cx = parse(expr)
    if not cx.can_fire:
        with pytest.raises(ValidationError, match="never fire"):
            next_fire_times(expr, tz, after, n)
        return
    got = next_fire_times(expr, tz, after, n)
    assert len(got) == n
    assert all(d.tzinfo is UTC for d in got)
    assert got[0] > after
    assert all(x < y for x, y in zip(got, got[1:]))
    for u in got:
        _assert_fire_is_justified(expr, tz, u)
    if cx.has_seconds:
        step, window = timedelta(seconds=1), timedelta(minutes=40)
        prewarm = timedelta(hours=1, minutes=5)
    else:
        step, window, prewarm = timedelta(minutes=1), timedelta(hours=30), timedelta(hours=26)
    end = min(got[-1], after + window)
    assert _brute(expr, tz, after, end, step, prewarm) == [u for u in got if u <= end]


# -------------------------------------------------------------- property tests

_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=250, **_SETTINGS)
@given(expr=expressions(six=False), zs=zones_and_starts, n=st.integers(1, 6))
def test_property_matches_brute_force_5_fields(expr, zs, n):
    tz, after = zs
    _check_against_brute(expr, tz, after, n)


@settings(max_examples=60, **_SETTINGS)
@given(expr=expressions(six=True), zs=zones_and_starts, n=st.integers(1, 6))
def test_property_matches_brute_force_6_fields(expr, zs, n):
    tz, after = zs
    _check_against_brute(expr, tz, after, n)


@settings(max_examples=120, **_SETTINGS)
@given(
    expr=st.sampled_from([
        "30 2 * * *", "0,30 2 * * *", "*/15 2 * * *", "0 * * * *", "*/30 * * * *",
        "45 1 * * *", "0 0 * * *", "0 1-3 * * *", "15 2 * * 0", "0 */2 * * *", "* 2 * * *",
        "59 1 * * *", "0 3 * * *", "30 1,2 * * *", "45 2 * * *",
    ]),
    tz=st.sampled_from(DST_ZONES),
    data=st.data(),
)
def test_property_dst_fixed_shapes(expr, tz, data):
    """Common job shapes started right around every DST transition in 2020-2030."""
    base = data.draw(st.sampled_from(TRANSITIONS[tz]))
    after = base + timedelta(minutes=data.draw(st.integers(-26 * 60, 3 * 60)))
    _check_against_brute(expr, tz, after, 6)


@st.composite
def croniter_safe_expressions(draw):
    """5-field expressions where cronie's and croniter's day rules cannot diverge:
    one day field is exactly '*' (both then AND with an all-days set)."""
    minute = draw(_field(0, 59))
    hour = draw(_field(0, 23))
    month = draw(st.one_of(st.just("*"), _field(1, 12)))
    restricted = draw(st.one_of(st.just("*"), _field(1, 31)))
    dow_restricted = draw(st.one_of(st.just("*"), _field(0, 6)))
    if draw(st.booleans()):
        dom, dow = "*", dow_restricted
    else:
        dom, dow = restricted, "*"
    return f"{minute} {hour} {dom} {month} {dow}"


# croniter 7.0.0 mis-expands one-value ranges ('5-5' -> '*', '3-3/2' -> '*/2'); see
# test_croniter_degenerate_range_bug.  Keep them out of the oracle comparison.
_DEGENERATE_RANGE = re.compile(r"(?<![0-9])([0-9]+)-\1(?![0-9])")


@pytest.mark.parametrize(
    ("expr", "ours", "theirs"),
    [
        ("5-5 * * * *", ["00:05", "01:05", "02:05"], ["00:01", "00:02", "00:03"]),
        ("0-0 * * * *", ["01:00", "02:00", "03:00"], ["00:01", "00:02", "00:03"]),
        ("3-3/2 * * * *", ["00:03", "01:03", "02:03"], ["00:02", "00:04", "00:06"]),
    ],
)
def test_croniter_degenerate_range_bug(expr, ours, theirs):
    """croniter 7.0.0 treats a one-value range N-N as '*' (every minute)."""
    _require_croniter_700()
    from croniter import croniter

    after = datetime(2020, 1, 1, tzinfo=UTC)
    assert [d.strftime("%H:%M") for d in next_fire_times(expr, "UTC", after, 3)] == ours
    it = croniter(expr, after)
    assert [it.get_next(datetime).strftime("%H:%M") for _ in range(3)] == theirs


@settings(max_examples=200, **_SETTINGS)
@given(
    expr=croniter_safe_expressions().filter(lambda e: not _DEGENERATE_RANGE.search(e)),
    after=st.datetimes(datetime(2020, 1, 1), datetime(2030, 12, 31), timezones=st.just(UTC)),
)
def test_property_croniter_oracle_utc(expr, after):
    pytest.importorskip("croniter")
    if not parse(expr).can_fire:
        with pytest.raises(ValidationError):
            validate(expr, "UTC")
        return
    ours = [_z(d) for d in next_fire_times(expr, "UTC", after, 3)]
    assert ours == _croniter_next(expr, "UTC", after, 3)
