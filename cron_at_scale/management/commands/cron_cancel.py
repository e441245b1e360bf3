"""``manage.py cron_cancel``: cancel jobs by id."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

import cron_at_scale
from cron_at_scale import ValidationError, conf
from cron_at_scale.management.commands._cliutil import flag_error, job_id
from cron_at_scale.models import Job


class Command(BaseCommand):
    help = (
        "Cancel jobs by id. A pending job will not fire; a claimed one is skipped by the worker; a running "
        "one is told (current_job().cancel_requested) at its next heartbeat. A recurring job stops for good "
        "(cron_pause holds it instead). Exits 1 if any id was not a cancellable job."
    )

    def add_arguments(self, parser):
        parser.add_argument("job_ids", nargs="+", metavar="JOB_ID", type=job_id,
                            help="job UUIDs (a malformed one stops the command before it cancels any)")

    def handle(self, *args, **opts):
        try:
            self._cancel(opts)
        except DatabaseError as e:
            raise CommandError(f"cannot reach the jobs table (is the database up and migrated?): {e}") from None

    def _cancel(self, opts):
        failed = []
        for jid in opts["job_ids"]:
            try:
                done = cron_at_scale.cancel(jid)
            except ValidationError as e:
                self.stderr.write(f"{jid}: {flag_error(e, {'job_id': 'JOB_ID'})}")
                failed.append(jid)
                continue
            if done:
                self.stdout.write(f"{jid}: cancelled")
                continue
            row = Job.objects.using(conf.alias_of_job(jid)).filter(id=jid).values_list("status", flat=True).first()
            self.stderr.write(f"{jid}: " + (f"not cancelled, it is already {row}" if row else "no such job"))
            failed.append(jid)
        if failed:
            raise CommandError(f"{len(failed)} of {len(opts['job_ids'])} jobs not cancelled")
