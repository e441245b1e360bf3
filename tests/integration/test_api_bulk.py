"""schedule_many's fast path (rows straight from the specs, streamed COPY, cheap Jobs) against build_job.

Whatever path a spec takes, schedule_many must store what schedule() stores, refuse what it refuses
with the same message, and return Jobs that behave like loaded ones.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from zoneinfo import ZoneInfo

import pytest
from demo.tasks import noop
from django.db import transaction

import cron_at_scale
from cron_at_scale import ValidationError
from cron_at_scale.api import bulk
from cron_at_scale.api import schedule as scheduling
from cron_at_scale.models import Job

pytestmark = pytest.mark.django_db

T = "demo.tasks.noop"
AT = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2)))
NOW = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)
# Columns set by the database itself, or random per job.
UNCOMPARED = {"id", "created_at", "updated_at", "shard"}

GOOD = [
    {"task": T},
    {"task": T, "args": [1, "two", 3.5, None, True], "kwargs": {"x": {"y": [1, 2]}}},
    {"task": noop, "args": (1, 2), "at": AT},
    {"task": T, "at": AT.replace(tzinfo=ZoneInfo("America/New_York"))},
    {"task": T, "countdown": 90},
    {"task": T, "countdown": 0.25, "queue": "celery", "max_retries": 0}, {"task": T, "max_retries": None},
    {"task": T, "max_retries": 1000, "priority": 3, "retry_backoff": 1.5, "retry_backoff_max": 60,
     "retry_jitter": False, "retry_all_exceptions": True},
    {"task": T, "tz": "Europe/Paris"},
    {"task": T, "tz": ZoneInfo("Asia/Tokyo")},
    {"task": T, "tz": timezone.utc},
    {"task": T, "args": ["tab\there", "line\nbreak\r", "back\\slash", '"quoted"', "é€😀", "\\N", "NULL", ""],
     "kwargs": {"k\\\t": "v\n"}},
    {"task": T, "queue": "q\t\\1\n", "args": [2**100, -(2**63), 2.0**52, 1e-300]},
    {"task": T, "key": None},
    # the fallback (build_job), still COPY
    {"task": T, "cron": "*/5 * * * *", "tz": "Europe/Paris"},
    {"task": T, "cron": "0 9 * * 1-5", "catchup": "all", "catchup_window": 60, "overlap": "allow"},
    {"task": T, "every": 90.5},
    {"task": T, "every": timedelta(minutes=5), "at": AT},
    {"task": T, "at": None, "countdown": 5},
    {"task": T, "args": [], "kwargs": None},
]


def _columns(job_id):
    return {k: v for k, v in Job.objects.filter(id=job_id).values()[0].items() if k not in UNCOMPARED}


@pytest.fixture
def fixed_now(monkeypatch):
    monkeypatch.setattr(scheduling, "db_now", lambda: NOW)  # schedule()
    monkeypatch.setattr(bulk, "db_now", lambda: NOW)  # schedule_many()


def test_each_spec_stores_what_schedule_stores(fixed_now):
    many = cron_at_scale.schedule_many(GOOD)
    for spec, job in zip(GOOD, many):
        spec = dict(spec)
        one = cron_at_scale.schedule(spec.pop("task"), **spec)
        assert _columns(job.id) == _columns(one.id), spec


def test_the_fast_path_takes_the_common_specs():
    fast = bulk._FastRows(NOW, set())
    taken = [spec for spec in GOOD if fast.row(spec) is not None]
    assert len(taken) == len(GOOD) - 5  # all but the four recurring ones and the explicit key=None
    assert fast.row(MappingProxyType({"task": T})) is None  # not a dict: build_job's business


def test_returned_jobs_are_saved_jobs():
    jobs = cron_at_scale.schedule_many(GOOD)
    for job in jobs:
        row = Job.objects.get(pk=job.pk)
        assert not job._state.adding and job._state.db == "default"
        for field in Job._meta.concrete_fields:
            if field.attname not in UNCOMPARED or field.attname == "id":
                assert getattr(job, field.attname) == getattr(row, field.attname), field.attname
        assert isinstance(job.id, uuid.UUID) and job.id.version == 7 and job.id.variant == uuid.RFC_4122
        assert job.created_at == row.created_at and job.shard == row.shard  # deferred: read on first use
        assert str(job) == str(row)
    assert len({job.id for job in jobs}) == len(jobs)
    job = jobs[0]
    job.queue = "elsewhere"
    job.save()
    job.refresh_from_db()
    assert job.queue == "elsewhere" and Job.objects.get(pk=job.pk).queue == "elsewhere"
    assert Job.objects.count() == len(jobs)  # save() updated, it did not insert


def test_order_across_paths_chunks_and_batches():
    specs = []
    for i in range(2600):
        specs.append({"task": T, "args": [i]})
        if i % 500 == 7:
            specs.append({"task": T, "args": [i], "cron": "@hourly"})  # build_job, then COPY
        if i % 700 == 3:
            specs.append({"task": T, "args": [i], "key": f"k{i % 2}"})  # INSERT ... ON CONFLICT
    jobs = cron_at_scale.schedule_many(specs, batch_size=1100)  # 3 COPYs of several chunks
    first_by_key = {}
    for spec, job in zip(specs, jobs, strict=True):
        key = spec.get("key")
        if key is None or key not in first_by_key:
            assert job.payload["args"] == spec["args"]
            assert job.schedule_type == ("cron" if "cron" in spec else "once")
            first_by_key.setdefault(key, job)
        else:
            assert job.id == first_by_key[key].id
    assert Job.objects.count() == sum(1 for s in specs if not s.get("key")) + len(first_by_key) - 1
    assert {j.id for j in jobs} == set(Job.objects.values_list("id", flat=True))


BAD = [
    {"args": "x"}, {"args": {"a": 1}}, {"args": 5}, {"args": b"ab"}, {"kwargs": [1]}, {"kwargs": {1: 2}},
    {"args": [float("nan")]}, {"args": [2**2000]}, {"args": ["a\x00"]}, {"args": ["\udcff"]},
    {"args": [2.0**60]}, {"args": [object()]}, {"kwargs": {"a": [[[[]]]] * 2, "b": {1}}},
    {"args": ["x" * 70_000]}, {"kwargs": {"k": "é" * 40_000}},
    {"queue": ""}, {"queue": 5}, {"queue": "\udcff"}, {"queue": "q" * 201}, {"queue": "a\x00"},
    {"max_retries": -1}, {"max_retries": True}, {"max_retries": 1001}, {"max_retries": "3"},
    {"priority": 256}, {"priority": True}, {"retry_backoff": -1}, {"retry_backoff_max": float("inf")},
    {"retry_jitter": 1}, {"retry_all_exceptions": None}, {"foo": 1},
    {"tz": "Mars/Base"}, {"tz": ""}, {"tz": 5}, {"tz": None}, {"tz": "UTC\x00"},
    {"at": datetime(2031, 1, 1)}, {"at": "2031-01-01"},
    {"at": datetime.max.replace(tzinfo=timezone(timedelta(hours=-5)))}, {"at": AT, "countdown": 5},
    {"countdown": -1}, {"countdown": float("nan")}, {"countdown": float("inf")}, {"countdown": True},
    {"countdown": "5"}, {"countdown": 10**10},
    {"task": 5}, {"task": ""}, {"task": "no.such.task"}, {"task": "t" * 201},
    {"catchup": "all"}, {"jitter": 5}, {"overlap": "allow"}, {"cron": "bad"}, {"every": 0},
]


@pytest.mark.parametrize("bad", BAD, ids=[repr(sorted(b))[:40] for b in BAD])
def test_every_refusal_is_schedules(bad, fixed_now):
    spec = {"task": T, **bad}
    task = spec.pop("task")
    with pytest.raises(ValidationError) as one:
        cron_at_scale.schedule(task, **spec)
    before = Job.objects.count()
    with pytest.raises(ValidationError) as many:
        cron_at_scale.schedule_many([{"task": T}, {"task": task, **spec}, {"task": T}])
    assert many.value.field == f"[1].{one.value.field}"
    assert str(many.value) == f"[1].{one.value.field}: {str(one.value).split(': ', 1)[1]}"
    assert Job.objects.count() == before


@pytest.mark.parametrize("batch_size", [1000, 10_000])  # 3 COPYs done and the 4th not begun; 1 COPY ended early
def test_a_bad_spec_after_rows_already_streamed_writes_nothing(batch_size):
    with transaction.atomic():
        kept = cron_at_scale.schedule(T)
        specs = [{"task": T, "args": [i]} for i in range(3000)] + [{"task": T, "countdown": -1}, {"task": T}]
        with pytest.raises(ValidationError) as err:
            cron_at_scale.schedule_many(specs, batch_size=batch_size)
        assert err.value.field == "[3000].countdown"
        assert list(Job.objects.values_list("id", flat=True)) == [kept.id]  # the caller's transaction goes on
    assert Job.objects.count() == 1


def test_mappings_that_are_not_dicts_iterables_and_empty_lists():
    jobs = cron_at_scale.schedule_many([MappingProxyType({"task": T, "args": [1]}), {"task": T},
                                        {"task": T, "args": (i for i in range(3))}])
    assert [j.payload["args"] for j in jobs] == [[1], [], [0, 1, 2]] and Job.objects.count() == 3
    assert cron_at_scale.schedule_many([]) == []


def test_every_job_of_a_call_keeps_the_callers_trace_context():
    from opentelemetry.sdk.trace import TracerProvider

    specs = [{"task": T}, {"task": T, "countdown": 5}, {"task": T, "cron": "0 9 * * *"},  # COPY: fast and build_job
             {"task": T, "key": "traced-bulk"}]  # INSERT: a keyed one
    with TracerProvider().get_tracer("t").start_as_current_span("request") as span, transaction.atomic():
        jobs = cron_at_scale.schedule_many(specs)
    ctx = span.get_span_context()
    want = {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"}
    assert [j.trace_context for j in jobs] == [want] * 4  # the returned jobs
    assert [Job.objects.get(id=j.id).trace_context for j in jobs] == [want] * 4  # the stored ones
    untraced = cron_at_scale.schedule_many([{"task": T}, {"task": T, "key": "untraced-bulk"}])
    assert [Job.objects.get(id=j.id).trace_context for j in untraced] == [None, None]
