"""``manage.py cron_schedule``: schedule one job from the command line."""

from __future__ import annotations

import argparse

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

import cron_at_scale
from cron_at_scale import KeyConflict, ValidationError
from cron_at_scale.management.commands._cliutil import aware_datetime, flag_error, json_of, seconds

# schedule()'s argument names -> this command's (its errors name the argument at fault)
FLAGS = {"task": "TASK", "args": "--args", "kwargs": "--kwargs", "at": "--at", "countdown": "--countdown",
         "cron": "--cron", "every": "--every", "tz": "--tz", "queue": "--queue", "key": "--key",
         "max_retries": "--max-retries", "expires": "--expires"}


class Command(BaseCommand):
    help = (
        "Schedule one job and print its id. TASK is a registered Celery task name (e.g. "
        "myapp.tasks.send_invoice). Without --at/--countdown/--cron/--every it is due now. Examples:\n"
        "  cron_schedule myapp.tasks.report --args '[42]' --countdown 300      # once, in 5 minutes\n"
        "  cron_schedule myapp.tasks.report --at 2030-01-01T09:00:00+01:00     # once, at that instant\n"
        "  cron_schedule myapp.tasks.report --cron '0 9 * * MON-FRI' --tz Europe/Paris --key daily-report\n"
        "  cron_schedule myapp.tasks.poll --every 30                           # every 30 seconds\n"
        "  cron_schedule myapp.tasks.report --cron '0 10 * * MON-FRI' --key daily-report --update  # change it"
    )

    def create_parser(self, prog_name, subcommand, **kwargs):
        from django.core.management.base import DjangoHelpFormatter

        class Formatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
            pass

        return super().create_parser(prog_name, subcommand, formatter_class=Formatter, **kwargs)

    def add_arguments(self, parser):
        parser.add_argument("task", help="registered Celery task name")
        parser.add_argument("--args", dest="task_args", metavar="JSON", type=json_of(list), default=[], help="positional arguments, a JSON list")
        parser.add_argument("--kwargs", dest="task_kwargs", metavar="JSON", type=json_of(dict), default={}, help="keyword arguments, a JSON object")
        when = parser.add_mutually_exclusive_group()
        when.add_argument("--at", type=aware_datetime, help="run once at this ISO-8601 time with a UTC offset")
        when.add_argument("--countdown", type=seconds, help="run once after this many seconds (database clock)")
        when.add_argument("--cron", help="crontab(5) expression: 5 fields, or 6 with leading seconds, or @daily …")
        when.add_argument("--every", type=seconds, help="run every this many seconds")
        parser.add_argument("--tz", default="UTC", help="IANA time zone of --cron (default UTC)")
        parser.add_argument("--queue", help="Celery queue (default: the task's routing)")
        parser.add_argument("--key", help="idempotency key: if a live job has it with the same schedule, that job's "
                                          "id is printed and nothing new is scheduled; with another schedule, an "
                                          "error names what differs (see --update)")
        parser.add_argument("--update", action="store_true",
                            help="with --key: change the live job holding the key in place to this definition "
                                 "(cron_at_scale.reschedule: from the new schedule's next occurrence, no run lost "
                                 "or doubled)")
        parser.add_argument("--max-retries", type=int, default=None,
                            help="retries after the first attempt (default: the task's, Celery's meaning)")
        parser.add_argument("--expires", type=seconds, default=None,
                            help="seconds: a run not started this long after its time is skipped, never run")

    def handle(self, *args, **opts):
        if opts["update"] and not opts["key"]:
            raise CommandError("--update needs --key: it changes the live job holding that key")
        spec = {"args": opts["task_args"], "kwargs": opts["task_kwargs"], "tz": opts["tz"], "queue": opts["queue"],
                "key": opts["key"], "max_retries": opts["max_retries"]}
        for name in ("at", "countdown", "cron", "every", "expires"):
            if opts[name] is not None:
                spec[name] = opts[name]
        try:
            job = cron_at_scale.schedule(opts["task"], update=opts["update"], **spec)
        except KeyConflict as e:
            raise CommandError(f"{e} (here: --update)") from None
        except ValidationError as e:
            raise flag_error(e, FLAGS) from None
        except DatabaseError as e:
            raise CommandError(f"cannot write the job (is the database up and migrated?): {e}") from None
        self.stdout.write(str(job.id))
        if opts["verbosity"] >= 2:
            self.stderr.write(f"{job.task} {job.schedule_type}, next fire at {job.fire_at.isoformat()}")
