"""``manage.py cron_jobs``: list and filter jobs, as a table or as JSON (the fields: docs/admin.md)."""

from __future__ import annotations

import json
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.db.models import DurationField, Value
from django.db.models.functions import Now

from cron_at_scale.management.commands._cliutil import duration, positive_int
from cron_at_scale.models import Job, ScheduleType, Status
from cron_at_scale.ops.fire_order import in_fire_order, pending_in_fire_order

DEFAULT_LIMIT = 50
TYPES = ("once", "cron", "interval", "recurring")  # recurring: cron and interval
# The columns read (never the payload: it may be large); each row's JSON object has these
# fields and the computed ones (schedule, late_seconds), in this order: docs/admin.md.
COLUMNS = ("id", "key", "task", "queue", "status", "schedule_type", "cron_expr", "timezone", "interval", "fire_at",
           "attempts", "retries", "max_retries", "pause_note", "created_at", "updated_at")
WIDE = 40  # characters of a key or task name shown in the table


def schedule_text(row: dict) -> str:
    """``once``, ``cron <expr> [<zone>]`` or ``every <seconds>s``."""
    if row["schedule_type"] == ScheduleType.CRON:
        return f"cron {row['cron_expr']}" + ("" if row["timezone"] == "UTC" else f" {row['timezone']}")
    if row["schedule_type"] == ScheduleType.INTERVAL:
        return f"every {row['interval']:g}s"
    return "once"


def late_text(seconds: float | None) -> str:
    """``-``, ``4.2s``, ``3m07s``, ``2h05m``, ``3d04h``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _cut(text: str, width: int = WIDE) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class Command(BaseCommand):
    help = (
        "List jobs, ordered by fire_at (then id; --reverse: latest first), at most --limit (default "
        f"{DEFAULT_LIMIT}) of them. Filters combine: --status, --task, --queue, --key (exact, or a prefix "
        "ending in *), --type, --late (pending past due). The table shows id, key, task, queue, status, "
        "schedule, fire_at (UTC) and how late a pending job is (database clock); --json prints one JSON list "
        "of objects (fields in docs/admin.md). Each filter walks an index of the job table (docs/indexes.md) "
        "and nothing counts the whole table: the last line says when more jobs match than were shown. "
        "Finished jobs leave the job table HISTORY_AFTER seconds after they finish (an hour by default): "
        "the admin's \"finished jobs (history)\" lists them then."
    )

    def add_arguments(self, parser):
        parser.add_argument("--status", choices=Status.values, help="only jobs in this status")
        parser.add_argument("--task", help="only jobs of this task name (exact)")
        parser.add_argument("--queue", help="only jobs on this queue (exact; '' for the task's own routing)")
        parser.add_argument("--key", help="only the job(s) with this idempotency key; KEY* for a key prefix")
        parser.add_argument("--type", "--schedule-type", dest="schedule_type", choices=TYPES,
                            help="only one-off, cron or interval jobs (recurring: cron and interval)")
        parser.add_argument("--late", nargs="?", type=duration, const=0.0, default=None, metavar="DURATION",
                            help="only pending jobs past their fire_at (by more than DURATION, e.g. 30s, 5m; "
                                 "default 0), most late first")
        parser.add_argument("--limit", type=positive_int, default=DEFAULT_LIMIT,
                            help=f"at most this many jobs (default {DEFAULT_LIMIT})")
        parser.add_argument("--reverse", action="store_true", help="latest fire_at first")
        parser.add_argument("--json", action="store_true", help="print one JSON list of objects")

    def handle(self, *args, **opts):
        if opts["late"] is not None and opts["status"] not in (None, Status.PENDING):
            raise CommandError(f"--late lists pending jobs: it cannot go with --status {opts['status']}")
        if opts["key"] is not None and opts["key"].rstrip("*") == "":
            raise CommandError("--key: give a key, or a prefix before the * (an empty prefix would match every "
                               "keyed job)")
        try:
            rows, more = self.fetch(opts)
        except DatabaseError as e:
            raise CommandError(f"cannot read the jobs table (is the database up and migrated?): {e}") from None
        if opts["json"]:
            self.stdout.write(json.dumps([self.as_json(r) for r in rows], indent=None))
        else:
            self.table(rows, more, opts["limit"])

    @classmethod
    def fetch(cls, opts) -> tuple[list[dict], bool]:
        """The rows (``COLUMNS`` and ``db_now``), at most ``--limit``; and whether more matched. With
        ``SHARD_DATABASES``, the first ``--limit`` in fire_at order of every database's."""
        from cron_at_scale import conf

        rows = [row for alias in conf.shard_aliases() for row in cls.fetch_on(alias, opts)]
        rows.sort(key=lambda r: (r["fire_at"], r["id"]), reverse=bool(opts["reverse"]))
        return rows[: opts["limit"]], len(rows) > opts["limit"]

    @staticmethod
    def fetch_on(alias: str, opts) -> list[dict]:
        """At most ``--limit`` + 1 rows of the database ``alias``."""
        query = Job.objects.using(alias).all()
        if opts["status"] is not None:
            query = query.filter(status=opts["status"])
        if opts["late"] is not None:
            query = query.filter(status=Status.PENDING,
                                 fire_at__lt=Now() - Value(timedelta(seconds=opts["late"]), DurationField()))
        if opts["task"] is not None:
            query = query.filter(task=opts["task"])
        if opts["queue"] is not None:
            query = query.filter(queue=opts["queue"])
        key = opts["key"]
        if key is not None:
            query = query.filter(key__startswith=key[:-1]) if key.endswith("*") else query.filter(key=key)
        kind = opts["schedule_type"]
        if kind == "recurring":
            query = query.exclude(schedule_type=ScheduleType.ONCE)
        elif kind is not None:
            query = query.filter(schedule_type=kind)
        rows = query.annotate(db_now=Now()).values(*COLUMNS, "db_now")
        # no filter but status or lateness with an index of its own in fire_at order
        merged = opts["task"] is None and opts["key"] is None and not opts["queue"] and kind in (None, ScheduleType.ONCE)
        if merged and opts["status"] is None and opts["late"] is None:
            return in_fire_order(rows, stop=opts["limit"] + 1, descending=bool(opts["reverse"]))
        if merged and (opts["status"] == Status.PENDING or opts["late"] is not None):
            # pending jobs alone are in fire_at order only in the claim's index, shard by shard: merged
            return pending_in_fire_order(rows, stop=opts["limit"] + 1, descending=bool(opts["reverse"]))
        order = ("-fire_at", "-id") if opts["reverse"] else ("fire_at", "id")
        return list(rows.order_by(*order)[: opts["limit"] + 1])

    @staticmethod
    def late_seconds(row: dict) -> float | None:
        """Seconds a pending job is past its fire_at, database clock; None when it is not (or not pending)."""
        if row["status"] != Status.PENDING or row["fire_at"] >= row["db_now"]:
            return None
        return (row["db_now"] - row["fire_at"]).total_seconds()

    def as_json(self, row: dict) -> dict:
        out = {}
        for name in COLUMNS:
            value = row[name]
            if name == "id":
                value = str(value)
            elif name in ("fire_at", "created_at", "updated_at") and value is not None:
                value = value.isoformat()
            out["interval_seconds" if name == "interval" else name] = value
        out["schedule"] = schedule_text(row)
        out["late_seconds"] = None if (late := self.late_seconds(row)) is None else round(late, 3)
        return out

    def table(self, rows: list[dict], more: bool, limit: int) -> None:
        head = ("ID", "KEY", "TASK", "QUEUE", "STATUS", "SCHEDULE", "FIRE_AT (UTC)", "LATE BY")
        lines = [(str(r["id"]), _cut(r["key"] or "-"), _cut(r["task"]), _cut(r["queue"] or "-", 24), r["status"],
                  _cut(schedule_text(r), 32), r["fire_at"].strftime("%Y-%m-%d %H:%M:%S"),
                  late_text(self.late_seconds(r))) for r in rows]
        widths = [max(len(c[i]) for c in [head, *lines]) for i in range(len(head))]
        for cells in [head, *lines]:
            self.stdout.write("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
        if not rows:
            self.stdout.write("no jobs match")
        elif more:
            self.stdout.write(f"{len(rows)} job{'s' if len(rows) != 1 else ''} shown; more match (--limit {limit}: raise it, or narrow the filters)")
        else:
            self.stdout.write(f"{len(rows)} job{'s' if len(rows) != 1 else ''}")
