"""``manage.py cron_import_beat``: import django-celery-beat's PeriodicTask rows as jobs.

Each row becomes one job keyed ``django_celery_beat:<name>``; running the
import again updates changed rows in place and leaves the rest unchanged.
Mapping (decisions, with the reason):

* crontab -> ``cron=`` in the crontab's own ``timezone`` (the app's zone when
  ``DJANGO_CELERY_BEAT_TZ_AWARE = False``); interval -> ``every=`` seconds;
  the same rules as ``celery beat`` entries (see :mod:`cron_at_scale.beat`),
  including Celery's day-of-month AND day-of-week rule: a row whose two day
  fields are both restricted is not mapped rather than run on other days.
* clocked -> a one-off job ``at=`` the clocked time (a past time fires now,
  as django-celery-beat would).
* ``one_off`` with an interval or crontab -> a one-off job at the first time
  the schedule gives (one interval from now, or the next cron time): what
  django-celery-beat runs before disabling the row.
* ``enabled=False`` -> the recurring job is created paused (note "disabled in
  django-celery-beat"); later imports leave pause/resume alone (it is
  managed in cron_at_scale from then on, and ``--disable-source`` disables
  every imported row). A disabled one-off is not imported (a one-off job
  cannot be paused, and django-celery-beat disables one-offs after they
  ran), unless it was imported before (then it is unchanged).
* ``start_time`` in the future: an interval job first fires at it, a cron job
  at its first occurrence at or after it, a one-off at the first time the
  schedule gives from it; a past ``start_time`` changes nothing.
* ``expires``: not mapped (cron_at_scale jobs have no end time; an expired row
  would never run again). ``expire_seconds`` (a per-message expiry) becomes
  the job's ``expires``; ``exchange``, ``routing_key`` and ``headers`` are
  ignored with a warning.
* ``queue`` and ``priority`` carry over; ``args``/``kwargs`` must be JSON
  (a list and an object); the task name must be registered.
* A one-off job that already finished is not scheduled again.
"""

from __future__ import annotations

import importlib.util
import json
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, router, transaction

from cron_at_scale import conf
from cron_at_scale import cron as cronlib
from cron_at_scale import sql as db
from cron_at_scale.api.schedule import build_job, pause
from cron_at_scale.beat.mapping import Unmappable, crontab_to_cron
from cron_at_scale.beat.sync import SyncReport, upsert
from cron_at_scale.exceptions import ValidationError
from cron_at_scale.models import Job

KEY_PREFIX = "django_celery_beat:"
DISABLED_NOTE = "disabled in django-celery-beat"
DISABLED_ONE_OFF = ("disabled one-off task: a one-off job cannot be paused (and django-celery-beat disables "
                    "one-offs after they ran); enable it to import it")


def _json(text: str | None, name: str, kind: type) -> Any:
    try:
        value = json.loads(text or ("[]" if kind is list else "{}"))
    except ValueError as e:
        raise Unmappable(f"{name} is not JSON: {e}") from None
    if not isinstance(value, kind):
        raise Unmappable(f"{name} must be a JSON {'array' if kind is list else 'object'}, got {type(value).__name__}")
    return value


def periodic_task_spec(pt, db_now) -> tuple[dict[str, Any], list[str]]:
    """``(schedule() arguments, warnings)`` for one PeriodicTask; raises :class:`Unmappable`."""
    if pt.solar_id:
        raise Unmappable("solar schedules are not supported")
    if pt.expires is not None:
        when = "expired" if pt.expires <= db_now else "expires"
        raise Unmappable(f"{when} at {pt.expires.isoformat()}: cron_at_scale jobs have no end time "
                         "(clear expires to import it, then cancel the job when it should end)")
    one_off = bool(pt.one_off or pt.clocked_id)
    spec: dict[str, Any] = {"task": pt.task, "args": _json(pt.args, "args", list),
                            "kwargs": _json(pt.kwargs, "kwargs", dict)}
    if pt.queue:
        spec["queue"] = pt.queue
    if pt.priority is not None:
        spec["priority"] = pt.priority
    if pt.expire_seconds:  # a per-message expiry: each run skipped if not started within it (cron_at_scale.policy.expiry)
        spec["expires"] = pt.expire_seconds
    ignored = [n for n in ("exchange", "routing_key") if getattr(pt, n)]
    if pt.headers and _json(pt.headers, "headers", dict):
        ignored.append("headers")
    warnings = [f"ignored {', '.join(ignored)}"] if ignored else []
    start = pt.start_time if pt.start_time is not None and pt.start_time > db_now else None

    if pt.clocked_id:
        spec["at"] = pt.clocked.clocked_time
    elif pt.interval_id:
        every = timedelta(**{pt.interval.period: pt.interval.every}).total_seconds()
        if one_off:
            spec["at"] = start or db_now + timedelta(seconds=every)
        else:
            spec.update(every=every, overlap="allow", **({"at": start} if start else {}))
    elif pt.crontab_id:
        expr, tz = crontab_to_cron(pt.crontab.schedule)  # a TzAwareCrontab in the row's zone, or the app's
        if one_off:
            spec["at"] = cronlib.next_fire_times(expr, tz, (start or db_now) - timedelta(microseconds=1), 1)[0]
        else:
            spec.update(cron=expr, tz=tz, overlap="allow")
    else:
        raise Unmappable("the row has no schedule")
    return spec, warnings


def import_periodic_tasks(*, dry_run: bool = False, disable_source: bool = False) -> SyncReport:
    """Import every PeriodicTask (see the module docstring); one transaction (one per database when the
    jobs are on their own, ``CRON_AT_SCALE["DATABASE"]``), rolled back on ``dry_run``.

    ``disable_source``: set ``enabled=False`` on every row that was mapped
    (listed in ``disabled``), so django-celery-beat stops running them;
    rows not mapped keep running there.
    """
    from django_celery_beat.models import PeriodicTask, PeriodicTasks

    report = SyncReport()
    mapped: list[int] = []
    alias, source = conf.db_alias(), router.db_for_write(PeriodicTask)  # the jobs' and the rows' databases
    with transaction.atomic(using=alias), transaction.atomic(using=source):  # a savepoint when the same
        db_now = db.db_now()
        rows = PeriodicTask.objects.select_related("interval", "crontab", "clocked").order_by("name")
        for pt in rows:
            key = f"{KEY_PREFIX}{pt.name}"
            if (pt.one_off or pt.clocked_id) and not pt.enabled:
                if Job.objects.using(conf.alias_of_key(key)).filter(key=key).exists():  # imported before (then disabled, or ran there)
                    report.unchanged.append(pt.name)
                    mapped.append(pt.pk)
                else:
                    report.unsupported.append((pt.name, DISABLED_ONE_OFF))
                continue
            try:
                spec, warnings = periodic_task_spec(pt, db_now)
                crontab_start = spec.get("cron") and pt.start_time and pt.start_time > db_now
                new = build_job(spec.pop("task"), key=key, _db_now=db_now, **spec)
            except (Unmappable, ValidationError, ValueError, TypeError) as e:
                report.unsupported.append((pt.name, str(e)))
                continue
            if crontab_start:  # first occurrence at or after start_time
                new.occurrence_at = new.fire_at = cronlib.next_fire_times(
                    new.cron_expr, new.timezone, pt.start_time - timedelta(microseconds=1), 1)[0]
            action, job = upsert(new, revive_finished=False, compare_fire_at=bool(pt.clocked_id))
            if action == "created" and not pt.enabled:
                pause(job.id, note=DISABLED_NOTE)
            getattr(report, action).append(pt.name)
            report.warnings += [(pt.name, w) for w in warnings]
            mapped.append(pt.pk)
        if disable_source:
            names = list(PeriodicTask.objects.filter(pk__in=mapped, enabled=True).values_list("name", flat=True))
            PeriodicTask.objects.filter(pk__in=mapped, enabled=True).update(enabled=False)
            PeriodicTasks.update_changed()  # a running django-celery-beat reloads its schedule
            report.disabled += sorted(names)
        if dry_run:
            transaction.set_rollback(True, using=alias)
            transaction.set_rollback(True, using=source)
    return report


class Command(BaseCommand):
    help = (
        "Import django-celery-beat's periodic tasks (crontab, interval, clocked, one-off) as cron_at_scale "
        "jobs keyed 'django_celery_beat:<name>'. Idempotent: a second run changes nothing and reports the "
        "rows unchanged; changed rows update their job in place. Rows that cannot be mapped with the same "
        "meaning (solar, expires, an unregistered task, Celery's day-of-month AND day-of-week rule, bad "
        "JSON args) are listed with the reason and left alone. Everything runs in one transaction."
    )

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true",
                            help="report what would be imported and write nothing")
        parser.add_argument("--disable-source", action="store_true",
                            help="set enabled=False on the imported PeriodicTask rows, so django-celery-beat "
                                 "stops running them (rows not mapped stay enabled)")

    def handle(self, *args, **opts):
        if not apps.is_installed("django_celery_beat"):
            if importlib.util.find_spec("django_celery_beat") is not None:
                raise CommandError("django-celery-beat is not installed as a Django app: add 'django_celery_beat' "
                                   "to INSTALLED_APPS (the package itself is importable)")
            raise CommandError("django-celery-beat is not installed: pip install django-celery-beat and add "
                               "'django_celery_beat' to INSTALLED_APPS")
        try:
            report = import_periodic_tasks(dry_run=opts["dry_run"], disable_source=opts["disable_source"])
        except DatabaseError as e:
            raise CommandError(f"cannot read django-celery-beat's tables (did you run migrate?): {e}") from e
        out = self.stdout.write
        for action in ("created", "updated", "unchanged"):
            for name in getattr(report, action):
                out(f"{action:<10} {name}")
        for name, text in report.warnings:
            out(f"warning    {name}: {text}")
        for name, reason in report.unsupported:
            self.stderr.write(f"not mapped {name}: {reason}")
        for name in report.disabled:
            out(f"disabled   {name} (in django-celery-beat)")
        suffix = " (dry run: nothing written)" if opts["dry_run"] else ""
        out(f"{len(report.created)} created, {len(report.updated)} updated, {len(report.unchanged)} unchanged, "
            f"{len(report.unsupported)} not mapped, {len(report.disabled)} disabled in django-celery-beat{suffix}")
