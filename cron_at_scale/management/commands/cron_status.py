"""``manage.py cron_status``: the scheduler's figures (the admin dashboard's), for people and machines."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from cron_at_scale.management.commands._cliutil import seconds
from cron_at_scale.ops.status import COUNT_CAP, DEFAULT_WINDOW, StatusReport, snapshot

BEHIND_AFTER = 5.0  # seconds a due job may wait before the scheduler counts as behind
OVERDUE_LISTED = 20  # overdue recurring jobs listed, most overdue first


class Command(BaseCommand):
    help = (
        "Show pending jobs by fire time, firing lag, attempts in progress, expired leases, the dead-letter "
        "queue, overdue recurring jobs, live dispatchers and Celery workers (alive, last consumed, stuck). 'behind' is true when a due job has waited longer than --behind-after "
        "seconds (dispatchers down or too slow). --json prints one JSON object (for scripts and monitoring); "
        "--fail-if-behind exits 2 when behind (for a cron or health check). Every query is bounded: counts "
        f"stop at {COUNT_CAP:,} (listed in 'capped')."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--behind-after", type=seconds, default=BEHIND_AFTER,
                            help=f"seconds a due job may wait before 'behind' (default {BEHIND_AFTER:g})")
        parser.add_argument("--window", type=seconds, default=DEFAULT_WINDOW,
                            help=f"seconds of recent runs the lag covers (default {DEFAULT_WINDOW:g})")
        parser.add_argument("--fail-if-behind", action="store_true", help="exit with status 2 when behind")

    def handle(self, *args, **opts):
        try:
            snap = snapshot(opts["window"] or DEFAULT_WINDOW)
        except DatabaseError as e:
            raise CommandError(f"cannot read the jobs table (is the database up and migrated?): {e}") from None
        behind = snap.behind(opts["behind_after"])
        if opts["json"]:
            self.stdout.write(snap.to_json(behind=behind, behind_after_seconds=opts["behind_after"]))
        else:
            self._human(snap, behind, opts["behind_after"])
        if behind and opts["fail_if_behind"]:
            sys.exit(2)

    def _human(self, s: StatusReport, behind: bool, after: float) -> None:
        out = self.stdout.write

        def n(name: str, value: int) -> str:
            return f"≥{value}" if name in s.capped else f"~{value}" if name in s.estimated else str(value)

        def ms(v):
            return "-" if v is None else f"{v * 1000:.1f} ms" if v < 10 else f"{v:.1f} s"

        out(f"database time     {s.db_now}")
        # The JSON's pending.overdue bucket is what the admin calls late (due, not yet claimed): "overdue"
        # is kept there for scripts; the text says late, as the admin does (overdue is the recurring rule).
        words = {"overdue": "late"}
        out("pending           " + "  ".join(f"{words.get(k, k.replace('_', ' '))} {n('pending.' + k, v)}"
                                             for k, v in s.pending.items()))
        out(f"oldest late job   waiting {s.oldest_overdue_seconds:.1f} s" + ("  BEHIND" if behind else "")
            + f" (threshold {after:g} s)")
        out(f"firing lag        p50 {ms(s.lag_seconds['p50'])}  p99 {ms(s.lag_seconds['p99'])}  "
            f"max {ms(s.lag_seconds['max'])}  ({s.lag_sample} runs, last {s.lag_window_seconds:g} s)")
        out(f"in progress       {n('in_progress', s.in_progress)} attempts, "
            f"{n('expired_leases', s.expired_leases)} with an expired lease")
        out(f"dead-letter queue {n('dlq', s.dlq)} failed jobs")
        out(f"paused            {n('paused', s.paused)} recurring jobs; {s.missed_occurrences} cron occurrences missed")
        out(f"overdue recurring {s.overdue_jobs_count}" + (" (no success within their grace)" if s.overdue_jobs_count else ""))
        for o in s.overdue_jobs[:OVERDUE_LISTED]:
            last = o["last_success_at"] or "never"
            out(f"  {o['id']} {o['key'] or o['task']:<28} due {o['expected_at']}, {o['late_seconds']:.0f} s ago "
                f"(grace {o['grace']:g} s), last success {last}")
        if s.overdue_jobs_count > OVERDUE_LISTED:
            out(f"  … {s.overdue_jobs_count - OVERDUE_LISTED} more (--json lists {len(s.overdue_jobs)}; admin: ?overdue=yes)")
        out(f"dispatchers alive {s.dispatchers_alive}" + (f" ({', '.join(s.dispatchers)})" if s.dispatchers else ""))
        for d in s.databases:  # SHARD_DATABASES: each database's share of the figures above
            out(f"database {d['database']} (shards {d['shards']}): pending {d['pending']}, late {d['late']} "
                f"(oldest {d['oldest_late_seconds']:.1f}s), in progress {d['in_progress']}, dlq {d['dlq']}, "
                f"dispatchers alive {d['dispatchers_alive']}")
        alive = [w for w in s.workers if w["alive"]]
        stuck = [w for w in alive if w["stuck"]]
        out(f"workers alive     {len(alive)}" + (f", {len(stuck)} STUCK" if stuck else ""))
        for w in s.workers:
            last = w["last_received_seconds_ago"]
            status = ("STUCK " + w["state"] if w["stuck"] else w["state"]) if w["alive"] else \
                f"gone (last seen {w['last_seen_seconds_ago']:.0f} s ago)"
            out(f"  {w['name']:<28} {status:<20} queues {','.join(w['queues']) or '-'}  "
                f"last consumed {'never' if last is None else f'{last:.0f} s ago'}  "
                f"pool {w['running']}/{w['concurrency']}" + (f"  {w['note']}" if w["note"] else ""))
        if s.beat_unmapped:
            out(f"beat entries not mapped: {len(s.beat_unmapped)} (they do not run under the beat drop-in)")
            for e in s.beat_unmapped:
                out(f"  {e['name']:<28} {e['reason']}")
        held = [q for q in s.queues if q["held"]]
        out(f"queues            {len(s.queues)}" + (f", {len(held)} HELD (their jobs wait in the database)" if held else ""))
        for q in s.queues:
            state = ("HELD: " if q["held"] else "") + q["state"]
            depth = "?" if q["depth"] is None else q["depth"]
            consumers = "?" if q["consumers"] is None else q["consumers"]
            out(f"  {q['queue']:<28} {state:<20} messages {depth}  consumers {consumers}")
