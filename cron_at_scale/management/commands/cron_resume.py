"""``manage.py cron_resume``: resume paused jobs (``cron_at_scale.resume``)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

import cron_at_scale
from cron_at_scale import ValidationError, conf
from cron_at_scale.api.validation import RESUME_CHOICES
from cron_at_scale.management.commands._cliutil import add_job_selection, describe, flag_error, selected_jobs
from cron_at_scale.models import Job, Status

MISSED_HELP = {
    "skip": "fire none of them; wait for the next future occurrence",
    "latest": "fire the latest of them, once",
    "all": "fire each of them",
}


class Command(BaseCommand):
    help = (
        "Resume paused jobs, by id or key, or in bulk (--task NAME or --all, with --yes). --missed says what "
        "to do with the occurrences that fell due while a job was paused, within its catchup_window (older "
        "ones are always missed, and counted): "
        + "; ".join(f"{k}: {v}" for k, v in MISSED_HELP.items())
        + ". Without --missed, the job's own catch-up policy decides at its next claim, as after any outage "
        "(the admin's Resume page asks the same question). Runs fired follow the job's overlap policy. A JOB "
        "that names no job stops the command before it resumes any. Exits 1 if any job was not resumed "
        "(it was not paused)."
    )

    def add_arguments(self, parser):
        add_job_selection(parser, "resume")
        parser.add_argument("--missed", choices=RESUME_CHOICES, default=None,
                            help="what to do with the occurrences missed while paused (default: the job's "
                                 "catchup policy)")

    def handle(self, *args, **opts):
        try:
            self._resume(opts)
        except DatabaseError as e:
            raise CommandError(f"cannot reach the jobs table (is the database up and migrated?): {e}") from None

    def _resume(self, opts):
        jobs = selected_jobs(opts, Status.PAUSED, "resume", self.stdout.write)
        failed = 0
        for job in jobs:
            try:
                done = cron_at_scale.resume(job.id, missed=opts["missed"])
            except ValidationError as e:
                raise flag_error(e, {"missed": "--missed", "job_id": "JOB"}) from None
            if not done:
                status = Job.objects.using(conf.alias_of_job(job.id)).filter(id=job.id).values_list("status", flat=True).first()
                self.stderr.write(f"{describe(job)}: not resumed, it is {status or 'gone'} (not paused)")
                failed += 1
                continue
            after = Job.objects.using(conf.alias_of_job(job.id)).get(id=job.id)
            if opts["missed"]:
                how = (f"missed occurrences ({opts['missed']}): {after.attempts - job.attempts} fired now, "
                       f"{after.missed_occurrences - job.missed_occurrences} counted missed")
            else:
                how = f"missed occurrences: its catchup policy ({job.catchup}) decides at the next claim"
            self.stdout.write(f"{describe(job)}: resumed, next fire {after.fire_at.isoformat()}; {how}")
        if failed:
            raise CommandError(f"{failed} of {len(jobs)} jobs not resumed")
