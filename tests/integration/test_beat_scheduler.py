"""The celery beat drop-in: beat_schedule -> jobs (sync_beat_schedule, Scheduler) and cron_import_beat."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab, schedule, solar
from django.core import checks
from django.core.management import call_command
from helpers import sql

import cron_at_scale
from cron_at_scale import cron as cronlib
from cron_at_scale.beat import Scheduler, Unmappable, crontab_to_cron, schedule_spec, sync_beat_schedule
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.django_db


def db_now():
    return sql("SELECT statement_timestamp()")[0][0]


def a_solar():
    """A ``solar`` schedule without the optional ``ephem`` package (its constructor needs it)."""
    return solar.__new__(solar)


def live(prefix="beat:"):
    return {j.key: j for j in Job.objects.filter(key__startswith=prefix, status__in=["pending", "in_progress", "paused"])}


# -- mapping ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("ct", "expr"), [
    (crontab(), "* * * * *"),
    (crontab(minute=0, hour="*/3"), "0 */3 * * *"),
    (crontab(minute="*/15", hour="9-17", day_of_week="mon-fri"), "*/15 9-17 * * 1-5"),
    (crontab(minute=30, hour=7, day_of_week="sat-mon"), "30 7 * * 0-1,6"),  # Celery's wrap-around range
    (crontab(minute="0,30", hour=0, day_of_month="1,15", month_of_year="*/3"), "0,30 0 1,15 */3 *"),
    # A full day-of-week set is no restriction in Celery: it must become "*", or cron would OR it.
    (crontab(minute=0, hour=0, day_of_week="0-6", day_of_month="13"), "0 0 13 * *"),
    # Both days restricted, one as a */S step: cron ANDs them too (cronie's rule), as Celery does.
    (crontab(minute=0, hour=0, day_of_month="*/2", day_of_week="mon"), "0 0 */2 * 1"),
])
def test_crontab_maps_to_a_cron_expression_with_celerys_fire_times(ct, expr):
    assert crontab_to_cron(ct) == (expr, "UTC")
    # Celery's own next-run computation agrees with ours over the next 30 runs.
    t = start = cronlib.next_fire_times(expr, "UTC", db_now(), 1)[0] - timedelta(microseconds=1)
    celery_times = []
    for _ in range(30):
        last, delta, _now = ct.remaining_delta(t)
        t = last + delta
        celery_times.append(t)
    assert cronlib.next_fire_times(expr, "UTC", start, 30) == celery_times


def test_celerys_day_of_month_and_day_of_week_rule_is_not_changed_into_cron_or():
    first_monday = crontab(minute=0, hour=9, day_of_month="1-7", day_of_week="mon")
    with pytest.raises(Unmappable, match="both day_of_month .1-7. and day_of_week .mon."):
        crontab_to_cron(first_monday)
    report = sync_beat_schedule({"first-monday": {"task": "demo.tasks.noop", "schedule": first_monday}})
    assert report.unsupported[0][0] == "first-monday" and "cron ORs" in report.unsupported[0][1]
    assert not live()


def test_crontab_time_zone_and_intervals():
    ct = crontab(minute=0, hour=8)
    ct.tz = ZoneInfo("Europe/Paris")  # the app's timezone setting, or django-celery-beat's per-row zone
    assert schedule_spec(ct) == {"cron": "0 8 * * *", "tz": "Europe/Paris"}
    assert schedule_spec(timedelta(minutes=5)) == {"every": 300.0}
    assert schedule_spec(2.5) == {"every": 2.5}
    assert schedule_spec(schedule(timedelta(hours=1))) == {"every": 3600.0}
    with pytest.raises(Unmappable, match="solar"):
        schedule_spec(a_solar())


# -- sync -------------------------------------------------------------------------------------

SCHEDULE = {
    "report": {"task": "demo.tasks.noop", "schedule": crontab(minute=0, hour=4), "args": (1, (2, 3)),
               "kwargs": {"x": "y"}, "options": {"queue": "celery", "priority": 5, "expires": 60}},
    "poll": {"task": "demo.tasks.noop", "schedule": timedelta(seconds=10)},
    "dawn": {"task": "demo.tasks.noop", "schedule": a_solar()},
    "ghost": {"task": "demo.tasks.no_such_task", "schedule": 60},
}


def test_sync_creates_one_job_per_entry_and_reports_what_it_cannot_map():
    before = db_now()
    report = sync_beat_schedule(SCHEDULE)
    assert sorted(report.created) == ["poll", "report"] and not report.updated and not report.disabled
    reasons = dict(report.unsupported)
    assert "solar" in reasons["dawn"] and "not a registered Celery task" in reasons["ghost"]
    assert report.warnings == []  # expires is mapped (cron_at_scale.policy.expiry), not ignored

    jobs = live()
    assert set(jobs) == {"beat:report", "beat:poll"}
    cron = jobs["beat:report"]
    assert (cron.schedule_type, cron.cron_expr, cron.timezone, cron.task) == ("cron", "0 4 * * *", "UTC", "demo.tasks.noop")
    assert cron.payload == {"args": [1, [2, 3]], "kwargs": {"x": "y"}}
    assert (cron.queue, cron.options, cron.overlap) == ("celery", {"priority": 5, "expires": 60}, "allow")
    interval = jobs["beat:poll"]
    assert (interval.schedule_type, interval.interval) == ("interval", 10.0)
    assert before + timedelta(seconds=10) <= interval.fire_at <= db_now() + timedelta(seconds=10)

    again = sync_beat_schedule(SCHEDULE)
    assert sorted(again.unchanged) == ["poll", "report"] and not again.created and not again.updated
    assert {k: (j.id, j.fire_at) for k, j in live().items()} == {k: (j.id, j.fire_at) for k, j in jobs.items()}


def test_changed_entries_update_the_same_row():
    sync_beat_schedule(SCHEDULE)
    old = live()
    changed = {**SCHEDULE, "report": {**SCHEDULE["report"], "args": [9]},
               "poll": {**SCHEDULE["poll"], "schedule": timedelta(seconds=30)}}
    before = db_now()
    report = sync_beat_schedule(changed)
    assert sorted(report.updated) == ["poll", "report"]
    new = live()
    assert {k: j.id for k, j in new.items()} == {k: j.id for k, j in old.items()}
    assert new["beat:report"].payload["args"] == [9]
    assert new["beat:report"].fire_at == old["beat:report"].fire_at  # same schedule: same next fire time
    assert new["beat:poll"].interval == 30.0  # new schedule: restarted from now
    assert before + timedelta(seconds=30) <= new["beat:poll"].fire_at <= db_now() + timedelta(seconds=30)

    cron_changed = {"report": {**changed["report"], "schedule": crontab(minute=15, hour=5)}}
    assert sync_beat_schedule(cron_changed).updated == ["report"]
    job = live()["beat:report"]
    assert job.id == old["beat:report"].id and job.cron_expr == "15 5 * * *"
    assert job.fire_at == job.occurrence_at == cronlib.next_fire_time("15 5 * * *", "UTC", before)


def test_removed_entries_are_paused_and_resume_when_added_again():
    sync_beat_schedule(SCHEDULE)
    poll_id = live()["beat:poll"].id
    report = sync_beat_schedule({"report": SCHEDULE["report"]})
    assert report.disabled == ["poll"] and report.unchanged == ["report"]
    paused = Job.objects.get(id=poll_id)
    assert (paused.status, paused.pause_note) == ("paused", "removed from beat_schedule")
    assert sync_beat_schedule({"report": SCHEDULE["report"]}).disabled == []  # already paused

    # Re-added much later: the same row, resumed from now (no catch-up of the gap).
    Job.objects.filter(id=poll_id).update(fire_at=db_now() - timedelta(hours=3))
    before = db_now()
    report = sync_beat_schedule({"report": SCHEDULE["report"], "poll": SCHEDULE["poll"]})
    assert report.updated == ["poll"]
    job = Job.objects.get(id=poll_id)
    assert (job.status, job.pause_note) == ("pending", "")
    assert job.fire_at >= before + timedelta(seconds=10)
    assert Job.objects.filter(key="beat:poll").count() == 1


def test_operator_pause_is_kept_cancelled_jobs_come_back_and_unmappable_entries_are_disabled():
    sync_beat_schedule(SCHEDULE)
    jobs = live()
    cron_at_scale.pause(jobs["beat:report"].id, note="maintenance")
    assert cron_at_scale.cancel(jobs["beat:poll"].id)
    report = sync_beat_schedule(SCHEDULE)
    assert report.unchanged == ["report"] and report.created == ["poll"]
    assert Job.objects.get(id=jobs["beat:report"].id).status == "paused"  # the operator's pause stays
    assert live()["beat:poll"].id != jobs["beat:poll"].id  # beat_schedule is the source of truth

    report = sync_beat_schedule({**SCHEDULE, "poll": {**SCHEDULE["poll"], "schedule": a_solar()}})
    assert report.disabled == ["poll"] and "poll" in dict(report.unsupported)
    assert live()["beat:poll"].status == "paused"


@pytest.mark.django_db(transaction=True)
def test_concurrent_syncs_make_exactly_one_job_per_entry():
    from django.db import connection

    entries = {f"e{i}": {"task": "demo.tasks.noop", "schedule": crontab(minute=i)} for i in range(20)}
    entries["every"] = {"task": "demo.tasks.noop", "schedule": 5}
    barrier = threading.Barrier(4)
    reports, errors = [], []

    def run():
        try:
            barrier.wait()
            for _ in range(3):
                reports.append(sync_beat_schedule(entries))
        except Exception as e:  # reported below
            errors.append(e)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(n for r in reports for n in r.created) == sorted(entries)  # each created once, by someone
    assert Job.objects.filter(key__startswith="beat:").count() == len(entries)
    assert all(not r.updated and not r.disabled for r in reports)


# -- the beat scheduler, in process -----------------------------------------------------------


def test_scheduler_syncs_at_start_then_ticks_as_a_dispatcher(celery_app, broker):
    saved = celery_app.conf.beat_schedule
    celery_app.conf.beat_schedule = {"poll": {"task": "demo.tasks.noop", "schedule": 60}}
    try:
        lazy = Scheduler(app=celery_app, lazy=True)
        assert lazy.dispatcher is None and not Job.objects.exists()  # lazy: beat's banner, no side effect
        scheduler = Scheduler(app=celery_app, schedule_filename="/nonexistent/celerybeat-schedule")
    finally:
        celery_app.conf.beat_schedule = saved
    assert "poll" in scheduler.report.created
    assert "beat:poll" in live()

    scheduler.dispatcher.batch_size = 2
    due = [cron_at_scale.schedule("demo.tasks.noop", args=[i]) for i in range(3)]
    assert scheduler.tick() == 0  # a full batch: go again at once
    assert scheduler.tick() == scheduler.dispatcher.poll_interval
    assert JobAttempt.objects.filter(job_id__in=[j.id for j in due]).count() == 3
    assert scheduler.dispatcher.published_total == 3
    scheduler.sync()
    scheduler.close()
    scheduler.close()  # beat's SIGTERM handler closes, then its loop's finally closes again
    assert scheduler.dispatcher is None


# -- cron_import_beat -------------------------------------------------------------------------


def periodic_tasks():
    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        SolarSchedule,
    )

    now = db_now()
    paris = CrontabSchedule.objects.create(minute="0", hour="4", timezone="Europe/Paris")
    every10 = IntervalSchedule.objects.create(every=10, period="seconds")
    every5m = IntervalSchedule.objects.create(every=5, period="minutes")
    clocked = ClockedSchedule.objects.create(clocked_time=now + timedelta(days=1))
    first_monday = CrontabSchedule.objects.create(minute="0", hour="9", day_of_month="1-7", day_of_week="1")
    sunrise = SolarSchedule.objects.create(event="sunrise", latitude=48.85, longitude=2.35)
    make = PeriodicTask.objects.create
    rows = {
        "nightly": make(name="nightly", task="demo.tasks.noop", crontab=paris, args="[1, 2]", kwargs='{"a": 1}',
                        queue="celery", priority=3),
        "poll": make(name="poll", task="demo.tasks.noop", interval=every10, exchange="ex"),
        "later": make(name="later", task="demo.tasks.noop", interval=every10, start_time=now + timedelta(hours=2)),
        "clocked": make(name="clocked", task="demo.tasks.noop", clocked=clocked, one_off=True),
        "once": make(name="once", task="demo.tasks.noop", interval=every5m, one_off=True),
        "off": make(name="off", task="demo.tasks.noop", crontab=CrontabSchedule.objects.create(minute="*/5"),
                    enabled=False),
        "first-monday": make(name="first-monday", task="demo.tasks.noop", crontab=first_monday),
        "sunrise": make(name="sunrise", task="demo.tasks.noop", solar=sunrise),
        "ghost": make(name="ghost", task="demo.tasks.no_such_task", interval=every10),
        "bad-args": make(name="bad-args", task="demo.tasks.noop", interval=every10, args="{not json"),
        "expiring": make(name="expiring", task="demo.tasks.noop", interval=every10, expires=now + timedelta(days=9)),
    }
    return now, rows


def run_import(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command("cron_import_beat", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_import_maps_every_kind_of_periodic_task_and_is_idempotent():
    now, rows = periodic_tasks()
    out, err = run_import()
    assert "6 created, 0 updated, 0 unchanged, 5 not mapped, 0 disabled" in out
    assert "warning    poll: ignored exchange" in out
    for name, reason in [("first-monday", "day_of_month (1-7) and day_of_week (1)"), ("sunrise", "solar"),
                         ("ghost", "not a registered Celery task"), ("bad-args", "args is not JSON"),
                         ("expiring", "no end time")]:
        assert f"not mapped {name}: " in err and reason in err.split(f"not mapped {name}: ")[1].splitlines()[0]

    jobs = live("django_celery_beat:")
    assert set(jobs) == {f"django_celery_beat:{n}" for n in ("nightly", "poll", "later", "clocked", "once", "off")}
    nightly = jobs["django_celery_beat:nightly"]
    assert (nightly.cron_expr, nightly.timezone, nightly.payload, nightly.queue, nightly.options) == (
        "0 4 * * *", "Europe/Paris", {"args": [1, 2], "kwargs": {"a": 1}}, "celery", {"priority": 3})
    assert (jobs["django_celery_beat:poll"].schedule_type, jobs["django_celery_beat:poll"].interval) == ("interval", 10.0)
    assert jobs["django_celery_beat:later"].fire_at == rows["later"].start_time
    clocked = jobs["django_celery_beat:clocked"]
    assert (clocked.schedule_type, clocked.fire_at) == ("once", rows["clocked"].clocked.clocked_time)
    once = jobs["django_celery_beat:once"]
    assert once.schedule_type == "once" and now + timedelta(minutes=5) <= once.fire_at <= db_now() + timedelta(minutes=5)
    off = jobs["django_celery_beat:off"]
    assert (off.status, off.pause_note) == ("paused", "disabled in django-celery-beat")

    state = {k: (j.id, j.fire_at, j.updated_at, j.status) for k, j in jobs.items()}
    out, _ = run_import()
    assert "0 created, 0 updated, 6 unchanged, 5 not mapped" in out
    assert {k: (j.id, j.fire_at, j.updated_at, j.status) for k, j in live("django_celery_beat:").items()} == state

    # A change in the source updates the job in place; a finished one-off is not scheduled again.
    rows["nightly"].crontab.hour = "5"
    rows["nightly"].crontab.save()
    Job.objects.filter(id=clocked.id).update(status="completed")
    out, _ = run_import()
    assert "0 created, 1 updated, 5 unchanged" in out and "updated    nightly" in out
    assert Job.objects.get(id=nightly.id).cron_expr == "0 5 * * *"
    assert Job.objects.filter(key="django_celery_beat:clocked").count() == 1


def test_import_dry_run_writes_nothing():
    periodic_tasks()
    out, _ = run_import("--dry-run")
    assert "6 created" in out and "(dry run: nothing written)" in out
    assert not Job.objects.exists()
    from django_celery_beat.models import PeriodicTask

    out, _ = run_import("--dry-run", "--disable-source")
    assert "5 disabled in django-celery-beat" in out and not Job.objects.exists()
    assert PeriodicTask.objects.filter(enabled=True).count() == 10  # all but "off", as before


def test_import_disable_source_stops_beat_running_what_was_imported():
    from django_celery_beat.models import PeriodicTask, PeriodicTasks

    periodic_tasks()
    out, _ = run_import("--disable-source")
    assert "6 created" in out and "5 disabled in django-celery-beat" in out
    enabled = set(PeriodicTask.objects.filter(enabled=True).values_list("name", flat=True))
    assert enabled == {"first-monday", "sunrise", "ghost", "bad-args", "expiring"}  # not mapped: beat keeps them
    assert PeriodicTasks.last_change() is not None
    # Importing again after the source was disabled pauses nothing: jobs are managed here now.
    out, _ = run_import()
    assert "0 created, 0 updated, 6 unchanged" in out
    assert [j.key for j in live("django_celery_beat:").values() if j.status == "paused"] == ["django_celery_beat:off"]


def test_import_command_help_and_a_clear_error_without_django_celery_beat():
    from demo.runner import PROJECT_DIR, child_env, database_url
    from django.conf import settings
    from django.db import connection

    env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL)  # example settings: no beat app
    run = lambda *a: subprocess.run([sys.executable, "manage.py", "cron_import_beat", *a], cwd=PROJECT_DIR, env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    helped = run("--help")
    assert helped.returncode == 0 and "--dry-run" in helped.stdout and "--disable-source" in helped.stdout
    failed = run()
    assert failed.returncode == 1 and "django-celery-beat is not installed" in failed.stderr
    # the dev extra installs the package; only INSTALLED_APPS lacks it, and the message says so
    assert "add 'django_celery_beat' to INSTALLED_APPS (the package itself is importable)" in failed.stderr


# The beat drop-in says what it does not run as Celery beat would: ``expires`` mapped, custom schedule
# classes named in the sync summary, ``manage.py check`` and ``cron_status``, DST differences reported once.


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
