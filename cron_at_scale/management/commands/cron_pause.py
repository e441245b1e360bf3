"""``manage.py cron_pause``: hold recurring jobs (``cron_at_scale.pause``)."""

from __future__ import annotations

import getpass

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

import cron_at_scale
from cron_at_scale import ValidationError, conf
from cron_at_scale.management.commands._cliutil import add_job_selection, describe, flag_error, selected_jobs
from cron_at_scale.models import Job, ScheduleType, Status


def _default_note() -> str:
    try:
        return f"paused with manage.py cron_pause by {getpass.getuser()}"
    except Exception:  # noqa: BLE001  no user name in this environment (getpass raises several kinds)
        return "paused with manage.py cron_pause"


class Command(BaseCommand):
    help = (
        "Pause recurring (cron or interval) jobs, by id or key, or in bulk (--task NAME or --all, with --yes): "
        "no occurrence fires until cron_resume; a run already started goes on. One-off jobs cannot be "
        "paused (cancel them, or move them with cron_schedule --key K --update). A JOB that names no job, "
        "or a one-off job, stops the command before it pauses any. Exits 1 if any job was not paused "
        "(not pending: already paused, cancelled)."
    )

    def add_arguments(self, parser):
        add_job_selection(parser, "pause")
        parser.add_argument("--note", default=None,
                            help="why (shown in the admin and by cron_jobs --json; default: who paused it, and how)")

    def handle(self, *args, **opts):
        try:
            self._pause(opts)
        except DatabaseError as e:
            raise CommandError(f"cannot reach the jobs table (is the database up and migrated?): {e}") from None

    def _pause(self, opts):
        note = _default_note() if opts["note"] is None else opts["note"]
        jobs = selected_jobs(opts, Status.PENDING, "pause", self.stdout.write)
        once = [describe(j) for j in jobs if j.schedule_type == ScheduleType.ONCE]
        if once:
            raise CommandError(f"JOB: only recurring (cron, interval) jobs can be paused; one-off: {', '.join(once)} "
                               "(cron_cancel cancels one; nothing changed)")
        failed = 0
        for job in jobs:
            try:
                done = cron_at_scale.pause(job.id, note)
            except ValidationError as e:
                raise flag_error(e, {"note": "--note"}) from None
            if done:
                self.stdout.write(f"{describe(job)}: paused (next fire was {job.fire_at.isoformat()})")
                continue
            status = Job.objects.using(conf.alias_of_job(job.id)).filter(id=job.id).values_list("status", flat=True).first()
            self.stderr.write(f"{describe(job)}: already paused" if status == Status.PAUSED
                              else f"{describe(job)}: not paused, it is {status or 'gone'}")
            failed += 1
        if failed:
            raise CommandError(f"{failed} of {len(jobs)} jobs not paused")
