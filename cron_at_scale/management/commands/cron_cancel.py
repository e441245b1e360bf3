"""``manage.py cron_cancel``: cancel jobs by id or key."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

import cron_at_scale
from cron_at_scale import ValidationError, conf
from cron_at_scale.management.commands._cliutil import flag_error, resolve_job
from cron_at_scale.models import Job


def _job_ids(refs: list[str]) -> list[str]:
    """The job id each ref names (:func:`resolve_job`, a key its live job), in order; a well-formed id
    that no job has is kept, for the cancel to report as no such job. Raises ``CommandError`` naming
    every ref that is neither an id nor a live job's key, before anything is cancelled."""
    out, unknown = [], []
    for ref in refs:
        job, uid, malformed = resolve_job(ref, live_key=True)
        if job is not None:
            out.append(str(job.id))
        elif uid is not None:
            out.append(uid)
        else:
            unknown.append(f"{malformed}, nor the key of a live job")
    if unknown:
        raise CommandError("argument JOB_ID: " + "; ".join(unknown) + " (nothing cancelled)")
    return out


class Command(BaseCommand):
    help = (
        "Cancel jobs by id or key (a key names its live job). A pending job will not fire; a claimed one "
        "is skipped by the worker; a running one is told (current_job().cancel_requested) at its next "
        "heartbeat. A recurring job stops for good (cron_pause holds it instead). A JOB that is neither a "
        "job id nor a live job's key stops the command before it cancels any. Exits 1 if any job was not "
        "cancellable (no job has that id, already finished)."
    )

    def add_arguments(self, parser):
        parser.add_argument("job_ids", nargs="+", metavar="JOB_ID",
                            help="job ids (UUIDs) or idempotency keys (one that is neither stops the command "
                                 "before it cancels any)")

    def handle(self, *args, **opts):
        try:
            self._cancel(opts)
        except DatabaseError as e:
            raise CommandError(f"cannot reach the jobs table (is the database up and migrated?): {e}") from None

    def _cancel(self, opts):
        failed = []
        for jid in _job_ids(opts["job_ids"]):
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
