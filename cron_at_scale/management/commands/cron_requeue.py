"""``manage.py cron_requeue``: put failed jobs (the dead-letter queue) back to pending."""

from __future__ import annotations

from datetime import datetime

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from cron_at_scale import ValidationError
from cron_at_scale.api.schedule import requeue
from cron_at_scale.management.commands._cliutil import flag_error, job_id


def _aware(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not an ISO-8601 datetime: {text!r}") from None
    if value.tzinfo is None:
        raise ValueError(f"give a UTC offset, e.g. {text}+00:00")
    return value


_aware.__name__ = "datetime"

# requeue()'s argument names -> this command's (its errors name the argument at fault)
FLAGS = {"job_id": "JOB_ID", "task": "--task", "queue": "--queue", "failed_after": "--failed-after",
         "failed_before": "--failed-before", "all_failed": "--all-failed"}


class Command(BaseCommand):
    help = (
        "Put failed jobs back to pending, due now, with their retries reset: one job by id, or every "
        "failed job matching --task / --queue / --failed-after / --failed-before, or --all-failed."
    )

    def add_arguments(self, parser):
        parser.add_argument("job_id", nargs="?", metavar="JOB_ID", type=job_id, help="the job's UUID")
        parser.add_argument("--task", help="only failed jobs of this task name")
        parser.add_argument("--queue", help="only failed jobs on this queue")
        parser.add_argument("--failed-after", type=_aware, help="ISO-8601 with offset, e.g. 2030-01-01T00:00+00:00")
        parser.add_argument("--failed-before", type=_aware, help="ISO-8601 with offset")
        parser.add_argument("--all-failed", "--all", dest="all", action="store_true",
                            help="every failed job (needed when no id or filter is given)")

    def handle(self, *args, **opts):
        if not opts["all"] and all(opts[k] is None for k in ("job_id", "task", "queue", "failed_after", "failed_before")):
            raise CommandError("give a JOB_ID, a filter (--task, --queue, --failed-after, --failed-before), "
                               "or --all-failed")
        try:
            n = requeue(opts["job_id"], task=opts["task"], queue=opts["queue"], failed_after=opts["failed_after"],
                        failed_before=opts["failed_before"], all_failed=opts["all"])
        except ValidationError as e:
            raise flag_error(e, FLAGS) from None
        except DatabaseError as e:
            raise CommandError(f"database error: {e}") from None
        if opts["job_id"] and n == 0:
            raise CommandError(f"job {opts['job_id']} is not a failed job (or its key is held by a live job)")
        self.stdout.write(f"requeued {n} job{'s' if n != 1 else ''}")
