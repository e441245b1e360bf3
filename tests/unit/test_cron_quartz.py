"""The Quartz day forms (L, L-N, LW, L-NW, NW in day-of-month; NL, N#K in day-of-week).

Reference cases in ``tests/data/quartz_cases.json`` (format of ``cron_cases.json``; a
refusal has an empty ``expected.next``, ``expected.error_field``, the cron field its
message names, and ``expected.error``, a fragment of it). An independent oracle
(``quartz_oracle.py``) judges every date from the definitions.
"""

from __future__ import annotations

import calendar
import json
import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cron_at_scale.cron import matches, next_fire_time, next_fire_times, parse, rule_text, validate
from cron_at_scale.exceptions import ValidationError
from unit.quartz_oracle import day_matches
from unit.test_cron import TRANSITIONS, _check_against_brute

UTC = timezone.utc
CASES = json.loads((Path(__file__).resolve().parents[1] / "data" / "quartz_cases.json").read_text(encoding="utf-8"))


def _z(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_cases_cover_each_form():
    crons = " ".join(c["input"]["cron"] for c in CASES)
    for form in (" L ", "L-3", "LW", "L-2W", "15W", "1W", "31W", "5L", "0L", "7L", "2#2", "#5"):
        assert form in crons, form
    assert len(CASES) >= 30
    assert all(c["notes"] for c in CASES)
    assert len({c["id"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in CASES if c["expected"]["next"]])
def test_quartz_case(case):
    inp, expected = case["input"], case["expected"]["next"]
    after = datetime.fromisoformat(inp["after"])
    validate(inp["cron"], inp["tz"])
    got = next_fire_times(inp["cron"], inp["tz"], after, len(expected))
    assert [_z(d) for d in got] == expected, case["notes"]
    assert next_fire_time(inp["cron"], inp["tz"], after) == got[0]
    if inp["tz"] == "UTC":  # the oracle agrees (no DST: each fire is its own wall time)
        fields = inp["cron"].split()[-5:]
        for u in got:
            assert day_matches(fields[2], fields[4], u.year, u.month, u.day), u
            assert matches(inp["cron"], "UTC", u)


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in CASES if not c["expected"]["next"]])
def test_quartz_refusal(case):
    inp, exp = case["input"], case["expected"]
    started = time.perf_counter()
    with pytest.raises(ValidationError) as exc:
        validate(inp["cron"], inp["tz"])
    assert exc.value.field == "cron"
    message = str(exc.value)
    assert exp["error_field"] in message and exp["error"] in message, message
    if case["kind"] == "quartz-never-fires":
        assert parse(inp["cron"]).can_fire is False
    else:
        assert f"bad {exp['error_field']} field" in message
    with pytest.raises(ValidationError) as exc:
        next_fire_times(inp["cron"], inp["tz"], datetime.fromisoformat(inp["after"]), 3)
    assert exc.value.field == "cron"
    assert time.perf_counter() - started < 0.5  # decided up front, never by looping


def test_parse_results():
    cx = parse("0 0 L-3 * *")
    assert (cx.dom_rule, cx.dow_rule, cx.days, cx.dom_star, cx.dow_star) == (("L", 3), None, frozenset(), False, True)
    assert parse("0 0 * * 7L").dow_rule == ("NL", 0) == parse("0 0 * * sunl").dow_rule
    assert parse("0 0 * * TUE#2").dow_rule == ("#", 2, 2)
    assert parse("0 0 lw * *").dom_rule == ("LW", 0)
    assert parse("0 0 15w * *").dom_rule == ("W", 15)
    assert parse("0 0 * * WED").dow_rule is None  # a day name with a W in it stays plain
    assert parse("0 0 * * 1").dom_rule is None and parse("0 0 * * 1")._day_table is None
    for text in ("L", "L-3", "LW", "L-3W", "15W"):
        assert rule_text(parse(f"0 0 {text} * *").dom_rule) == text
    for text in ("5L", "2#2"):
        assert rule_text(parse(f"0 0 * * {text}").dow_rule) == text


def test_day_names_stay_plain():
    after = datetime(2024, 1, 1, tzinfo=UTC)
    assert next_fire_times("0 0 * * WED", "UTC", after, 3) == next_fire_times("0 0 * * 3", "UTC", after, 3)


# ------------------------------------------------------------------ property tests

_DOM_FORMS = st.one_of(
    st.just("L"), st.just("LW"),
    st.integers(0, 30).map(lambda k: f"L-{k}"),
    st.integers(0, 30).map(lambda k: f"L-{k}W"),
    st.integers(1, 31).map(lambda n: f"{n}W"),
)
_DOW_FORMS = st.one_of(
    st.integers(0, 7).map(lambda w: f"{w}L"),
    st.tuples(st.integers(0, 7), st.integers(1, 5)).map(lambda t: f"{t[0]}#{t[1]}"),
)
_PLAIN_DOM = st.sampled_from(["*", "*/2", "*/31", "1", "1-7", "13", "29-31", "28"])
_PLAIN_DOW = st.sampled_from(["*", "*/2", "*/7", "0", "1-5", "6,0", "5"])
_MONTHS = st.sampled_from(["*", "*", "2", "2,4", "4,6,9,11", "1-3", "12"])


@st.composite
def day_fields(draw):
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return draw(_DOM_FORMS), draw(_PLAIN_DOW)
    if kind == 1:
        return draw(_PLAIN_DOM), draw(_DOW_FORMS)
    return draw(_DOM_FORMS), draw(_DOW_FORMS)


def _oracle_days(dom: str, dow: str, months: str, after: date, n: int) -> list[date] | None:
    """The next n matching dates after ``after`` by scanning days (None: none within 400 years)."""
    wanted = set(range(1, 13)) if months == "*" else {int(m) for m in months.replace("-", ",").split(",")}
    if "-" in months:
        a, b = (int(x) for x in months.split("-"))
        wanted = set(range(a, b + 1))
    out: list[date] = []
    y, m = after.year, after.month
    empty: set[tuple[int, int]] = set()  # (days, weekday of the 1st) of months known to match no day
    for _ in range(400 * 12):
        shape = (calendar.monthrange(y, m)[1], date(y, m, 1).weekday())
        if m in wanted and shape not in empty:
            found = False
            for d in range(1, shape[0] + 1):
                if day_matches(dom, dow, y, m, d):
                    found = True
                    if date(y, m, d) > after:
                        out.append(date(y, m, d))
                        if len(out) == n:
                            return out
            if not found:
                empty.add(shape)
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out or None


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=400, **_SETTINGS)
@given(days=day_fields(), months=_MONTHS,
       after=st.dates(date(1990, 1, 1), date(2090, 12, 31)), n=st.integers(1, 4))
def test_property_days_match_the_oracle(days, months, after, n):
    dom, dow = days
    expr = f"0 0 {dom} {months} {dow}"
    start = datetime(after.year, after.month, after.day, tzinfo=UTC)
    expected = _oracle_days(dom, dow, months, after, n)
    if expected is None:
        with pytest.raises(ValidationError, match="never fire"):
            validate(expr, "UTC")
        assert parse(expr).can_fire is False
        return
    got = next_fire_times(expr, "UTC", start, len(expected))
    assert [u.date() for u in got] == expected


@settings(max_examples=60, **_SETTINGS)
@given(days=day_fields().filter(lambda d: parse(f"0 0 {d[0]} * {d[1]}").can_fire),
       minute=st.sampled_from(["0", "30", "*/30", "*/15"]), hour=st.sampled_from(["1", "2", "1-3", "*", "2,3"]),
       tz=st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]), data=st.data())
def test_property_dst_policy_unchanged(days, minute, hour, tz, data):
    """Around DST transitions the Quartz days map to instants like any other day (brute force)."""
    base = data.draw(st.sampled_from(TRANSITIONS[tz] if tz in TRANSITIONS else TRANSITIONS["America/New_York"]))
    after = base + timedelta(hours=data.draw(st.integers(-30, 3)))
    _check_against_brute(f"{minute} {hour} {days[0]} * {days[1]}", tz, after, 3)


def test_dst_transition_days_with_brute_force():
    """Expressions whose days are transition days, checked against test_cron's brute-force walk."""
    for expr, tz, after in [
        ("0 2 L * *", "Europe/Berlin", datetime(2024, 3, 30, 12, tzinfo=UTC)),
        ("*/30 2 L * *", "Europe/Berlin", datetime(2024, 3, 30, 12, tzinfo=UTC)),
        ("0,30 2 * 3 0#2", "America/New_York", datetime(2024, 3, 9, 12, tzinfo=UTC)),
        ("*/30 1 * 11 0#1", "America/New_York", datetime(2024, 11, 2, 12, tzinfo=UTC)),
        ("30 2 * 10 0L", "Europe/Berlin", datetime(2024, 10, 26, 12, tzinfo=UTC)),
    ]:
        _check_against_brute(expr, tz, after, 3)
