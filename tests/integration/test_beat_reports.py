"""The beat drop-in says what it does not run as Celery beat would: ``expires`` mapped, custom schedule
classes named in the sync summary, ``manage.py check`` and ``cron_status``, DST differences reported once."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, schedule
from django.core import checks
from django.core.management import call_command

from cron_at_scale.api.schedule import db_now
from cron_at_scale.beat import sync_beat_schedule
from cron_at_scale.models import Job

pytestmark = pytest.mark.django_db


class EveryOtherTick(schedule):
    """A custom schedule class, as Saleor's beat schedule has one: its own is_due."""

    def is_due(self, last_run_at):
        return super().is_due(last_run_at)


def madrid(**fields) -> crontab:
    ct = crontab(**fields)
    ct.tz = ZoneInfo("Europe/Madrid")  # the app's timezone setting
    return ct


def test_expires_is_mapped_without_a_warning_from_options_or_the_entry():
    report = sync_beat_schedule({
        "in-options": {"task": "demo.tasks.noop", "schedule": 60, "options": {"expires": 30}},
        "on-entry": {"task": "demo.tasks.noop", "schedule": crontab(minute="*/5"), "expires": 45.0},
        "absolute": {"task": "demo.tasks.noop", "schedule": 60, "options": {"expires": db_now()}},
    })
    assert sorted(report.created) == ["in-options", "on-entry"] and report.warnings == []
    assert Job.objects.get(key="beat:in-options").options == {"expires": 30}
    assert Job.objects.get(key="beat:on-entry").options == {"expires": 45}
    assert report.unsupported[0][0] == "absolute" and "expires: a datetime applies to one-off jobs only" in \
        report.unsupported[0][1]


@pytest.fixture
def beat_schedule(celery_app):
    """``set(entries)``: the Celery app's beat_schedule for this test (put back afterwards)."""
    old = dict(celery_app.conf.beat_schedule or {})

    def set_(entries):
        celery_app.conf.beat_schedule = entries

    yield set_
    celery_app.conf.beat_schedule = old


def test_a_custom_schedule_class_is_named_by_the_sync_summary_check_and_status(beat_schedule):
    entries = {"custom": {"task": "demo.tasks.noop", "schedule": EveryOtherTick(timedelta(seconds=30))},
               "plain": {"task": "demo.tasks.noop", "schedule": 30}}
    report = sync_beat_schedule(entries)
    assert report.created == ["plain"]
    summary = report.summary()
    assert summary.startswith("1 created, 0 updated, 0 unchanged, 0 disabled, 1 not mapped (NOT RUNNING: custom: ")
    assert "EveryOtherTick is not supported" in summary and "docs/from-celery-beat.md" in summary

    beat_schedule(entries)
    found = [m for m in checks.run_checks() if m.id == "cron_at_scale.W006"]
    assert len(found) == 1 and "'custom'" in found[0].msg and "EveryOtherTick" in found[0].msg
    assert "does not run" in found[0].msg

    out = io.StringIO()
    call_command("cron_status", stdout=out)
    text = out.getvalue()
    assert "beat entries not mapped: 1" in text
    line = text.split("beat entries not mapped: 1")[1].splitlines()[1]
    assert line.split()[0] == "custom" and "EveryOtherTick" in line
    out = io.StringIO()
    call_command("cron_status", "--json", stdout=out)
    got = json.loads(out.getvalue())["beat_unmapped"]
    assert [e["name"] for e in got] == ["custom"]

    beat_schedule({"plain": entries["plain"]})
    assert not [m for m in checks.run_checks() if m.id == "cron_at_scale.W006"]
    out = io.StringIO()
    call_command("cron_status", stdout=out)
    assert "beat entries not mapped" not in out.getvalue()


def test_a_dst_difference_is_reported_once_across_syncs_and_again_when_the_entry_changes(caplog):
    entries = {
        "nightly": {"task": "demo.tasks.noop", "schedule": madrid(minute=30, hour=2)},
        "halfhourly": {"task": "demo.tasks.noop", "schedule": madrid(minute="*/30")},
        "morning": {"task": "demo.tasks.noop", "schedule": madrid(minute=0, hour=9)},
        "utc": {"task": "demo.tasks.noop", "schedule": crontab(minute=30, hour=2)},
    }
    with caplog.at_level("WARNING", logger="cron_at_scale.beat"):
        first = sync_beat_schedule(entries)
    notes = dict(first.dst)
    assert sorted(notes) == ["halfhourly", "nightly"]
    assert "does not exist in Europe/Madrid" in notes["nightly"] and "03:00 (the jump)" in notes["nightly"]
    assert "Celery beat ran it at 03:30" in notes["nightly"] and "docs/dst.md" in notes["nightly"]
    assert "occurs twice" in notes["halfhourly"] and "Celery beat only at the first" in notes["halfhourly"]
    assert "DST differs from Celery beat for 2: nightly, halfhourly" in first.summary()
    assert sum("DST differs" in r.getMessage() for r in caplog.records) == 2

    caplog.clear()
    with caplog.at_level("WARNING", logger="cron_at_scale.beat"):
        second = sync_beat_schedule(entries)  # the next start of beat: nothing new to say
    assert second.dst == [] and sorted(second.unchanged) == sorted(entries)
    assert "DST" not in second.summary() and not [r for r in caplog.records if "DST" in r.getMessage()]

    entries["nightly"] = {"task": "demo.tasks.noop", "schedule": madrid(minute=45, hour=2)}  # changed: said again
    third = sync_beat_schedule(entries)
    assert [n for n, _ in third.dst] == ["nightly"] and "02:45 does not exist" in third.dst[0][1]


def test_cron_import_beat_maps_expire_seconds_to_expires():
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every10 = IntervalSchedule.objects.create(every=10, period="seconds")
    PeriodicTask.objects.create(name="fresh-only", task="demo.tasks.noop", interval=every10, expire_seconds=30)
    out, err = io.StringIO(), io.StringIO()
    call_command("cron_import_beat", stdout=out, stderr=err)
    assert "1 created" in out.getvalue() and "expire_seconds" not in out.getvalue() + err.getvalue()
    assert Job.objects.get(key="django_celery_beat:fresh-only").options == {"expires": 30}
