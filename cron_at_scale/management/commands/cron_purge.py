"""``manage.py cron_purge``: retention, delete old finished jobs and their attempts."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from cron_at_scale import conf
from cron_at_scale.maintenance import archive, retention
from cron_at_scale.management.commands._cliutil import duration, positive_int


class Command(BaseCommand):
    help = (
        "Delete completed and cancelled jobs (and their attempt log) whose last change is older than "
        "--older-than, e.g. 7d, 12h, 30m or seconds. Failed jobs (the dead-letter queue), pending, running "
        "and paused jobs are never deleted. Works in small batches (--batch-size rows per statement, each "
        "its own short transaction), skipping rows another session holds, so it is safe to run beside "
        "dispatchers, from cron, as often as you like. The history tables (finished jobs moved out after "
        "HISTORY_AFTER) lose each partition whose whole range is older than --older-than, detached and dropped. "
        "--dry-run counts and deletes nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("--older-than", type=duration, required=True,
                            help="age of the last change, e.g. 7d, 12h, 30m, 45s, 1w or seconds")
        parser.add_argument("--batch-size", type=positive_int, default=retention.DEFAULT_BATCH_SIZE,
                            help=f"rows per delete statement (default {retention.DEFAULT_BATCH_SIZE})")
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")

    def handle(self, *args, **opts):
        for alias in conf.shard_aliases():  # every database of SHARD_DATABASES, each on its own
            with conf.using(alias):
                self.purge(opts, alias if conf.shard_map() is not None else None)

    def purge(self, opts, alias: str | None) -> None:
        try:
            jobs, attempts = retention.purge(opts["older_than"], opts["batch_size"], dry_run=opts["dry_run"])
            dropped = archive.keep_partitions(float(conf.get("HISTORY_PARTITION")), float(opts["older_than"]),
                                              attach=False, dry_run=opts["dry_run"])
        except DatabaseError as e:
            raise CommandError(f"purge stopped by a database error (what was deleted stays deleted): {e}") from None
        verb = "would delete" if opts["dry_run"] else "deleted"
        self.stdout.write((f"database {alias}: " if alias else "") + f"{verb} {jobs} jobs and {attempts} attempts "
                          f"finished more than {opts['older_than']:g} s ago")
        if not dropped["locked"]:
            self.stdout.write("history partitions: left alone, a dispatcher is keeping them right now")
        else:
            parts = sorted(n for n in dropped["dropped"] if n.startswith("cron_at_scale_jobhistory"))
            self.stdout.write(f"{'would drop' if opts['dry_run'] else 'dropped'} {len(parts)} history partitions"
                              + (f": {', '.join(parts)} (and their attempts')" if parts else ""))
