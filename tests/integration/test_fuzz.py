"""Fuzzing the scheduling API, whose callers pass whatever their users typed: random arguments of every type to ``schedule``,
``schedule_many``, ``cancel``, ``requeue``, ``pause`` and ``resume``.

The contract checked by every test: the only exception ever raised is
``cron_at_scale.ValidationError`` (its ``field`` names an argument), a call that
raises writes nothing (the table is compared before and after), and a call that
succeeds writes exactly the expected rows, whose payload reads back equal.

Each hypothesis example runs in its own savepoint, rolled back at its end, so
examples do not see each other's rows. The bugs this file found (lone
surrogates in text fields, 5000-digit ints, ``at`` offsets PostgreSQL refuses
or out of range in UTC, interval overflow near year 9999, private keywords)
are fixed; their cases stay at the end as ``test_fixed_*``. An integral float
of 2**53 or more is refused (jsonb would hand it back as an int).
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from demo.tasks import noop
from django.db import transaction
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cron_at_scale
from cron_at_scale import ValidationError
from cron_at_scale.models import LIVE_STATUSES, Job

pytestmark = pytest.mark.django_db

FUZZ = settings(deadline=None, max_examples=200, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much, HealthCheck.data_too_large])
FEW = settings(FUZZ, max_examples=120)

ARGUMENTS = {"args", "kwargs", "at", "countdown", "cron", "every", "tz", "queue", "max_retries", "key", "catchup",
             "catchup_window", "overlap", "jitter", "priority", "retry_backoff", "retry_backoff_max", "retry_jitter",
             "retry_all_exceptions"}
TASKS = ["demo.tasks.noop", "demo.tasks.record", noop]

# ----------------------------------------------------------------------------- strategies

surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3)
nasty_text = st.one_of(
    st.text(max_size=30),
    st.text(st.characters(codec="utf-8"), max_size=10).map(lambda s: s + "\x00" + s),
    st.builds(lambda a, s: a + s, st.text(max_size=5), surrogates),
    st.sampled_from(["", " ", "\t\n", "UTC" * 50, "x" * 201, "k" * 256, "é" * 300, "'; DROP TABLE cron_at_scale_job; --",
                     "%s", "%(x)s", "{0}", "$$", "\\", '"', "\u202e", "\ufeff", "🙂" * 70]),
    st.text(min_size=250, max_size=2500),
)
huge_ints = st.one_of(st.integers(min_value=2**63 - 2, max_value=2**64 + 2), st.integers(max_value=-(2**63) + 1, min_value=-(2**64)),
                      st.sampled_from([4299, -4301]).map(lambda d: 10**d if d > 0 else -(10**-d)), st.integers())
floats = st.one_of(st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308,
                                                 0.1, 1e15]))


class Opaque:
    def __repr__(self):
        return "<Opaque>"


def _tz_offsets():
    whole = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(lambda m: timezone(timedelta(minutes=m)))
    odd = st.timedeltas(min_value=timedelta(hours=-23, minutes=59), max_value=timedelta(hours=23, minutes=59)).map(timezone)
    zones = st.sampled_from(["UTC", "Europe/Paris", "Asia/Kolkata", "America/St_Johns", "Pacific/Kiritimati",
                             "Pacific/Pago_Pago", "Australia/Lord_Howe"]).map(ZoneInfo)
    return st.one_of(st.just(timezone.utc), whole, odd, zones)


aware = st.builds(lambda d, tz: d.replace(tzinfo=tz), st.datetimes(), _tz_offsets())
naive = st.datetimes()
datetimes = st.one_of(aware, naive, st.sampled_from([datetime(1, 1, 1, tzinfo=timezone.utc),
                                                     datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc),
                                                     datetime(1, 1, 1), datetime.max, datetime.min]))
scalars = st.one_of(st.none(), st.booleans(), huge_ints, floats, nasty_text, st.binary(max_size=20), datetimes,
                    st.timedeltas(), st.builds(Opaque), st.builds(uuid.uuid4), st.just(object))
anything = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                                         st.dictionaries(st.one_of(st.text(max_size=5), st.integers(), st.none()), inner, max_size=3),
                                                         st.frozensets(st.integers(), max_size=3)), max_leaves=12)


def _deep(depth: int):
    value: object = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8), inner, max_size=4)),
                           max_leaves=15)
json_or_junk = st.one_of(json_values, st.builds(_deep, st.integers(min_value=60, max_value=70)), anything)


def _cron_field(lo: int, hi: int, names: list[str] | None = None):
    num = st.integers(min_value=lo - 2, max_value=hi + 3).map(str)
    if names:
        num = st.one_of(num, st.sampled_from(names + [n.lower() for n in names]))
    item = st.one_of(
        st.just("*"), num,
        st.builds(lambda s: f"*/{s}", st.integers(min_value=-1, max_value=100)),
        st.builds(lambda a, b: f"{a}-{b}", num, num),
        st.builds(lambda a, b, s: f"{a}-{b}/{s}", num, num, st.integers(min_value=0, max_value=12000)),
        st.builds(lambda a, s: f"{a}/{s}", num, st.integers(min_value=1, max_value=9)),
        st.sampled_from(["?", "L", "5L", "1W", "MON#2", "H", "", "**", "1-", "-1", "*/", "٣", "00007"]),
    )
    return st.lists(item, min_size=1, max_size=3).map(",".join)


MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
cron_fields = [_cron_field(0, 59), _cron_field(0, 59), _cron_field(0, 23), _cron_field(1, 31),
               _cron_field(1, 12, MONTHS), _cron_field(0, 7, DAYS)]
cron_grammar = st.one_of(
    st.tuples(*cron_fields[1:]).map(" ".join),
    st.tuples(*cron_fields).map(" ".join),
    st.tuples(*cron_fields[1:]).map("\t  ".join),
    st.sampled_from(["@daily", "@HOURLY", "@reboot", "@every 5s", "@", "* * * * * * *", "* * * *", "0 0 30 2 *",
                     "0 0 31 4,6 *", "0 0 29 2 *", "* * * * *\n", "*/0 * * * *", "* " * 100, "1-0 * * * *"]),
)
valid_crons = st.sampled_from(["* * * * *", "*/5 * * * * *", "0 9 * * MON-FRI", "30 2 * * *", "@daily", "0 0 29 2 *",
                               "15,45 */2 1-15 JAN-JUN SUN,SAT", "0 0 1 1 *"])
crons = st.one_of(cron_grammar, nasty_text, anything)
valid_tzs = st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "Asia/Kathmandu", "Australia/Lord_Howe",
                             "Etc/GMT+12", "Pacific/Chatham", "posixrules"])
tzs = st.one_of(valid_tzs, st.sampled_from(["../../etc/passwd", "/etc/localtime", "Etc/../UTC", "UTC" * 50, "utc",
                                            "Europe/Paris ", "zone.tab", "tzdata.zi", "Mars/Base", ".", "Europe/",
                                            "UTC\x00", "Europe\\Paris"]), nasty_text, anything)
seconds = st.one_of(st.integers(min_value=-5, max_value=10**10), floats, st.timedeltas(), st.sampled_from([0, 0.001, 1, 3153600000, 3153600001]))


def _valid_spec():
    return st.fixed_dictionaries({}, optional={
        "args": st.lists(json_values, max_size=5) | st.tuples(json_values),
        "kwargs": st.dictionaries(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=10), json_values, max_size=5),
        "queue": st.text(min_size=1, max_size=200).filter(lambda s: "\x00" not in s),
        "key": st.sampled_from(["k1", "k2", "x" * 255, "'; DROP TABLE cron_at_scale_job; --"]),
        "max_retries": st.none() | st.integers(min_value=0, max_value=1000),
        "priority": st.integers(min_value=0, max_value=255),
        "retry_jitter": st.booleans(),
    }).flatmap(lambda base: st.one_of(
        st.just(base),
        st.builds(lambda at: {**base, "at": at}, aware),
        st.builds(lambda c: {**base, "countdown": c}, st.floats(min_value=0, max_value=3153600000)),
        st.builds(lambda c, tz: {**base, "cron": c, "tz": tz}, valid_crons, valid_tzs),
        st.builds(lambda e, j: {**base, "every": e, "jitter": j}, st.floats(min_value=0.001, max_value=10**6),
                  st.floats(min_value=0, max_value=100)),
    ))


junk_by_argument = {
    "args": json_or_junk, "kwargs": st.one_of(st.dictionaries(st.text(max_size=5), json_or_junk, max_size=3), json_or_junk),
    "at": st.one_of(datetimes, anything), "countdown": seconds, "cron": crons, "every": seconds, "tz": tzs,
    "queue": st.one_of(nasty_text, anything), "max_retries": st.one_of(huge_ints, anything), "key": st.one_of(nasty_text, anything),
    "catchup": st.one_of(st.sampled_from(["latest", "all", "skip", "LATEST", "none"]), anything),
    "catchup_window": seconds, "overlap": st.one_of(st.sampled_from(["skip", "buffer_one", "allow", "queue"]), anything),
    "jitter": seconds, "priority": st.one_of(huge_ints, anything), "retry_backoff": seconds, "retry_backoff_max": seconds,
    "retry_jitter": anything, "retry_all_exceptions": anything,
}
# Keyword names that are neither arguments nor options (not "task": a second value for a
# positional parameter is Python's own TypeError at the call site, not the API's).
unknown_names = st.one_of(st.sampled_from(["id", "status", "options", "Args", "eta", "expires", "countdown_", "payload",
                                           "fire_at", "shard", "__class__", "self", "spec", "specs"]),
                          st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)).filter(
    lambda n: n not in ARGUMENTS and n != "task")
random_spec = st.fixed_dictionaries({}, optional={**junk_by_argument}).flatmap(
    lambda d: st.dictionaries(unknown_names, anything, max_size=1).map(lambda extra: {**d, **extra}) if len(d) < 3
    else st.just(d))
random_task = st.one_of(st.sampled_from(TASKS), nasty_text, anything,
                        st.sampled_from(["os.system", "builtins.eval", "celery.backend_cleanup", "demo.tasks",
                                         "demo.tasks.noop ", "DEMO.TASKS.NOOP", "cron_at_scale.api.schedule.schedule"]))


@st.composite
def one_junk_argument(draw):
    """A valid spec with one argument (possibly unknown) replaced by junk."""
    spec = dict(draw(_valid_spec()))
    name = draw(st.one_of(st.sampled_from(sorted(junk_by_argument)), unknown_names))
    spec[name] = draw(junk_by_argument.get(name, anything))
    return spec


# ----------------------------------------------------------------------------- known limits


def _walk(value, depth=0):
    yield value
    if depth > 80:
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            yield from _walk(v, depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(k, depth + 1)
            yield from _walk(v, depth + 1)


def _has_surrogate(value) -> bool:
    return isinstance(value, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in value)


def _big_float(value) -> bool:
    """An integral float beyond 2**53: jsonb would hand it back as an int, so schedule() refuses it."""
    return any(isinstance(v, float) and math.isfinite(v) and abs(v) >= 2.0**53 and v.is_integer()
               for v in _walk(value))


# ----------------------------------------------------------------------------- helpers


def _normalised(value):
    return json.loads(json.dumps(list(value) if isinstance(value, (tuple, set, frozenset)) else value))


def _table():
    return sorted(Job.objects.values_list("id", "status", "fire_at", "task", "key", "payload",
                                          "pause_note", "cancel_requested", "retries", "lost_attempts", "updated_at"),
                  key=lambda r: str(r[0]))


def _job_count():
    return Job.objects.count()


def _expected_args(spec):
    args = spec.get("args", ())
    return _normalised(list(args))


def _check_stored(job, spec):
    row = Job.objects.get(pk=job.pk)
    payload = {"args": _expected_args(spec), "kwargs": _normalised(dict(spec.get("kwargs") or {}))}
    assert row.payload == payload
    assert row.fire_at == job.fire_at
    assert row.key == spec.get("key")
    assert row.queue == (spec.get("queue") or "")
    assert row.timezone == spec.get("tz", "UTC")
    assert row.cron_expr == (spec.get("cron") or "")
    assert row.max_retries == spec.get("max_retries")  # None: the task's
    assert row.status == "pending"


def _call_schedule(task, spec):
    """Call schedule() in a savepoint rolled back afterwards; check the contract; return the job or None."""
    with transaction.atomic():
        before = _job_count()
        key = spec.get("key")
        existing = None
        if isinstance(key, str) and "\x00" not in key and not _has_surrogate(key):
            existing = Job.objects.filter(key=key, status__in=LIVE_STATUSES).first()
        try:
            job = cron_at_scale.schedule(task, **spec)
        except ValidationError as e:
            assert isinstance(e.field, str) and e.field, e
            assert e.field in ARGUMENTS | {"task"} | set(spec), (e.field, e)
            assert _job_count() == before, f"a refused call wrote a row: {e}"
            job = None
        else:
            if existing is not None:
                assert job.pk == existing.pk and _job_count() == before
            else:
                assert _job_count() == before + 1
                _check_stored(job, spec)
        transaction.set_rollback(True)
    return job


# ----------------------------------------------------------------------------- schedule()


@FUZZ
@given(task=random_task, spec=random_spec)
def test_schedule_random_arguments_raise_only_validation_error(task, spec):
    _call_schedule(task, spec)


@FUZZ
@given(task=st.sampled_from(TASKS), spec=_valid_spec())
def test_schedule_valid_arguments_write_one_row_that_reads_back(task, spec):
    assume(not _big_float(spec))
    job = _call_schedule(task, spec)
    assert job is not None


@FUZZ
@given(task=st.sampled_from(TASKS), spec=one_junk_argument())
def test_schedule_one_bad_argument_is_named_or_accepted(task, spec):
    _call_schedule(task, spec)


@FEW
@given(at=datetimes, every=st.one_of(st.none(), st.floats(min_value=0.001, max_value=1e6)))
def test_schedule_at_any_datetime(at, every):
    spec = {"at": at} if every is None else {"at": at, "every": every}
    _call_schedule("demo.tasks.noop", spec)


@FEW
@given(cron=st.one_of(cron_grammar, crons), tz=st.one_of(valid_tzs, tzs))
def test_schedule_cron_grammar_and_time_zones(cron, tz):
    job = _call_schedule("demo.tasks.noop", {"cron": cron, "tz": tz})
    if job is not None and cron is not None:
        assert job.schedule_type == "cron" and job.fire_at is not None


# ----------------------------------------------------------------------------- schedule_many()

spec_item = st.one_of(
    _valid_spec().flatmap(lambda s: st.sampled_from(TASKS).map(lambda t: {**s, "task": t})),
    st.builds(lambda t, s: {**s, "task": t}, random_task, random_spec),
    random_spec,  # no 'task'
    anything,  # not a dict
    st.dictionaries(st.one_of(st.integers(), st.none(), st.just("task")), anything, max_size=2),
    st.fixed_dictionaries({"task": st.sampled_from(TASKS), "db_now": anything}),
    st.fixed_dictionaries({"task": st.sampled_from(TASKS), "_registered": anything}),
)


def _check_many(specs):
    with transaction.atomic():
        before = _job_count()
        try:
            jobs = cron_at_scale.schedule_many(specs)
        except ValidationError as e:
            assert isinstance(e.field, str) and (e.field.startswith("[") or e.field == "specs"), e
            assert _job_count() == before, f"a refused schedule_many wrote rows: {e}"
        else:
            specs = list(specs)
            assert len(jobs) == len(specs)
            keys = {s.get("key") for s in specs if s.get("key") is not None}
            plain = sum(1 for s in specs if s.get("key") is None)
            assert _job_count() == before + plain + len(keys)
            first_by_key = {}
            for job, spec in zip(jobs, specs):
                spec = {k: v for k, v in spec.items() if k != "task"}
                if spec.get("key") is None:
                    _check_stored(job, spec)
                elif spec["key"] not in first_by_key:
                    first_by_key[spec["key"]] = job
                    _check_stored(job, spec)
                else:
                    assert job.id == first_by_key[spec["key"]].id
        transaction.set_rollback(True)


@FUZZ
@given(specs=st.lists(spec_item, max_size=6))
def test_schedule_many_is_all_or_nothing(specs):
    _check_many(specs)


@FEW
@given(specs=st.lists(_valid_spec().flatmap(lambda s: st.sampled_from(TASKS).map(lambda t: {**s, "task": t})),
                      min_size=1, max_size=8),
       bad=st.one_of(st.none(), st.tuples(st.integers(min_value=0, max_value=8), st.one_of(spec_item, anything))))
def test_schedule_many_valid_batch_with_at_most_one_bad_spec(specs, bad):
    if bad is not None:
        specs = list(specs)
        specs.insert(min(bad[0], len(specs)), bad[1])
    _check_many(specs)


@FEW
@given(specs=st.one_of(st.text(max_size=4), st.binary(max_size=4), st.tuples(spec_item), st.frozensets(st.integers(), max_size=3),
                       st.dictionaries(st.text(max_size=3), anything, max_size=2)))
def test_schedule_many_iterables_that_are_not_lists(specs):
    _check_many(specs)


# ----------------------------------------------------------------------------- cancel, pause, resume, requeue


@pytest.fixture
def jobs():
    """One job of each kind the id-taking calls act on: pending once, cron, interval, paused, failed, completed."""
    made = {
        "once": cron_at_scale.schedule(noop, countdown=3600),
        "cron": cron_at_scale.schedule(noop, cron="0 9 * * *"),
        "interval": cron_at_scale.schedule(noop, every=60),
        "paused": cron_at_scale.schedule(noop, cron="*/5 * * * *"),
        "failed": cron_at_scale.schedule(noop, countdown=10, queue="q1", key="failed-1"),
        "completed": cron_at_scale.schedule(noop, countdown=10),
    }
    cron_at_scale.pause(made["paused"].id, note="held")
    Job.objects.filter(pk=made["failed"].pk).update(status="failed")
    Job.objects.filter(pk=made["completed"].pk).update(status="completed")
    return made


def id_strategy(jobs):
    real = [j.id for j in jobs.values()]
    return st.one_of(
        st.sampled_from(real), st.sampled_from(real).map(str), st.sampled_from(real).map(lambda u: str(u).upper()),
        st.sampled_from(real).map(lambda u: u.hex), st.sampled_from(real).map(lambda u: f"{{{u}}}"),
        st.sampled_from(real).map(lambda u: f"urn:uuid:{u}"), st.sampled_from(real).map(lambda u: f" {u}\n"),
        st.builds(uuid.uuid4), st.uuids().map(str), st.just(uuid.UUID(int=0)), st.just("00000000-0000-0000-0000-000000000000"),
        st.sampled_from(real).map(lambda u: str(u) + "'; DROP TABLE cron_at_scale_job; --"),
        st.sampled_from(real).map(lambda u: str(u)[:-1] + "\x00"),
        anything,
    )


def _only_rows_changed(before, after, allowed_ids):
    b, a = {r[0]: r for r in before}, {r[0]: r for r in after}
    assert set(b) == set(a), "rows appeared or disappeared"
    changed = {i for i in b if b[i] != a[i]}
    assert changed <= set(allowed_ids), f"unexpected rows changed: {changed - set(allowed_ids)}"
    return changed


def _resolve(job_id):
    try:
        return job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
    except Exception:
        return None


def _check_id_call(fn, job_id, *extra):
    with transaction.atomic():
        before = _table()
        try:
            result = fn(job_id, *extra)
        except ValidationError as e:
            assert e.field in ("job_id", "note"), e
            assert _table() == before, f"a refused call changed rows: {e}"
            return
        target = _resolve(job_id)
        changed = _only_rows_changed(before, _table(), [target] if target else [])
        assert isinstance(result, bool)
        assert bool(changed) == result, (result, changed)
        transaction.set_rollback(True)


@FEW
@given(data=st.data())
def test_cancel_random_ids(jobs, data):
    _check_id_call(cron_at_scale.cancel, data.draw(id_strategy(jobs)))


@FEW
@given(data=st.data())
def test_resume_random_ids(jobs, data):
    _check_id_call(cron_at_scale.resume, data.draw(id_strategy(jobs)))


@FEW
@given(data=st.data(), note=st.one_of(st.text(max_size=30), st.just("x" * 2001), st.just("n\x00"), anything,
                                      st.just("'; DROP TABLE cron_at_scale_job; --"), st.just("%(x)s %s $$")))
def test_pause_random_ids_and_notes(jobs, data, note):
    _check_id_call(cron_at_scale.pause, data.draw(id_strategy(jobs)), note)


@FEW
@given(data=st.data(), filters=st.fixed_dictionaries({}, optional={
    "task": st.one_of(st.sampled_from(["demo.tasks.noop", "nope"]), nasty_text, anything),
    "queue": st.one_of(st.sampled_from(["q1", "q2"]), nasty_text, anything),
    "failed_after": st.one_of(datetimes, anything), "failed_before": st.one_of(datetimes, anything),
    "all_failed": st.one_of(st.booleans(), anything)}), with_id=st.booleans())
def test_requeue_random_ids_and_filters(jobs, data, filters, with_id):
    job_id = data.draw(id_strategy(jobs)) if with_id else None
    with transaction.atomic():
        before = _table()
        failed = {r[0] for r in before if r[1] == "failed"}
        try:
            n = cron_at_scale.requeue(job_id, **filters)
        except ValidationError as e:
            assert e.field in ("job_id", "task", "queue", "failed_after", "failed_before"), e
            assert _table() == before
        else:
            changed = _only_rows_changed(before, _table(), failed)
            assert n == len(changed)
            assert all(Job.objects.get(pk=i).status == "pending" for i in changed)
        transaction.set_rollback(True)


# ----------------------------------------------------------------------------- known bugs, one test each

T = "demo.tasks.noop"


def _refused_and_nothing_written(call, field=None):
    with transaction.atomic():
        before = _job_count()
        with pytest.raises(ValidationError) as e:
            call()
        assert _job_count() == before
        transaction.set_rollback(True)
    if field is not None:
        assert e.value.field == field


@pytest.mark.parametrize("field", ["key", "queue"])
def test_fixed_schedule_surrogate_in_key_or_queue(field):
    _refused_and_nothing_written(lambda: cron_at_scale.schedule(T, **{field: "ab\ud800"}), field)


@pytest.mark.parametrize("field", ["key", "queue"])
def test_fixed_schedule_many_surrogate_in_key_or_queue(field):
    _refused_and_nothing_written(lambda: cron_at_scale.schedule_many([{"task": T}, {"task": T, field: "\udcff"}]),
                                 f"[1].{field}")


def test_fixed_pause_note_with_surrogate(jobs):
    with pytest.raises(ValidationError):
        cron_at_scale.pause(jobs["cron"].id, note="\ud800")


@pytest.mark.parametrize("field", ["task", "queue"])
def test_fixed_requeue_filter_with_surrogate(field):
    with pytest.raises(ValidationError):
        cron_at_scale.requeue(**{field: "\ud800"})


def test_fixed_huge_int_in_payload():
    _refused_and_nothing_written(lambda: cron_at_scale.schedule(T, args=[10**5000]), "args")


@pytest.mark.parametrize("call", ["task", "priority", "cancel", "pause", "schedule_many"])
def test_fixed_huge_int_in_error_messages(call):
    huge = 10**5000
    _refused_and_nothing_written({
        "task": lambda: cron_at_scale.schedule(huge),
        "priority": lambda: cron_at_scale.schedule(T, priority=huge),
        "cancel": lambda: cron_at_scale.cancel(huge),
        "pause": lambda: cron_at_scale.pause(huge),
        "schedule_many": lambda: cron_at_scale.schedule_many([{"task": huge}]),
    }[call])


@pytest.mark.parametrize("hours", [16, -20])
def test_fixed_at_with_offset_postgres_refuses(hours):
    at = datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=hours)))
    with transaction.atomic():
        job = cron_at_scale.schedule(T, at=at)
        assert Job.objects.get(pk=job.pk).fire_at == at
        transaction.set_rollback(True)


@pytest.mark.parametrize("at", [datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14))),
                                datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))])
def test_fixed_at_out_of_range_in_utc(at):
    _refused_and_nothing_written(lambda: cron_at_scale.schedule(T, at=at), "at")


def test_fixed_at_with_sub_second_offset():
    at = datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=5, seconds=17, microseconds=5)))
    with transaction.atomic():
        job = cron_at_scale.schedule(T, at=at)
        assert Job.objects.get(pk=job.pk).fire_at == at
        transaction.set_rollback(True)


def test_fixed_interval_with_jitter_at_the_end_of_time():
    _refused_and_nothing_written(lambda: cron_at_scale.schedule(
        T, at=datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc), every=1, jitter=1), None)


def test_fixed_schedule_db_now_keyword():
    _refused_and_nothing_written(lambda: cron_at_scale.schedule(T, db_now="x"), "db_now")


def test_fixed_schedule_registered_keyword():
    _refused_and_nothing_written(lambda: cron_at_scale.schedule("demo.tasks.noop", _registered=[]), "_registered")


@pytest.mark.parametrize("specs", [None, 5, object()])
def test_fixed_schedule_many_not_iterable(specs):
    _refused_and_nothing_written(lambda: cron_at_scale.schedule_many(specs))


@pytest.mark.parametrize("batch_size", [0, -1, "x", 1.5, None, True, 1_000_001])
def test_fixed_schedule_many_bad_batch_size(batch_size):
    # batch_size=-1 once returned two unsaved jobs and wrote none
    _refused_and_nothing_written(lambda: cron_at_scale.schedule_many([{"task": T}, {"task": T}], batch_size=batch_size),
                                 "batch_size")


def test_fixed_requeue_zero_batch_size(jobs):
    with pytest.raises(ValidationError):
        cron_at_scale.requeue(all_failed=True, batch_size=0)


@pytest.mark.parametrize("value", [2.0**53, 1e16, 1e23, -1.5e300])
def test_fixed_big_integral_float_is_refused(value):
    # jsonb keeps an integral float as an exact number and hands it back as an int
    _refused_and_nothing_written(lambda: cron_at_scale.schedule(T, args=[value]), "args")
    _refused_and_nothing_written(lambda: cron_at_scale.schedule_many([{"task": T, "kwargs": {"x": value}}]),
                                 "[0].kwargs")


@pytest.mark.parametrize("value", [2.0**53 - 1, -(2.0**53 - 1), 1e15, 2.0**51 + 0.5, 1.5e-300, -0.0])
def test_floats_below_two_to_the_53_round_trip_as_floats(value):
    with transaction.atomic():
        job = cron_at_scale.schedule(T, args=[value])
        stored = Job.objects.get(pk=job.pk).payload["args"][0]
        assert type(stored) is float and stored == value, (stored, value)
        transaction.set_rollback(True)
