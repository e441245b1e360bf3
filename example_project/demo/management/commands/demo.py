"""``manage.py demo``: run the whole system for real and report what happened.

Migrates, starts one dispatcher and two Celery workers, schedules jobs (most
due now, some over the next seconds, a few cron jobs firing every second, a
few cancelled before they fire), shows progress while they fire, then prints
scheduled / completed / cancelled / missed / duplicates / re-fires and the firing lag
per run, split into the scheduler's part and the workers' part.
Exits 1 if a job was missed or an attempt executed twice.
"""

from __future__ import annotations

import json
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

import cron_at_scale
from cron_at_scale.celery_app import get_app
from cron_at_scale.cron import next_fire_times
from demo.runner import Processes, child_env, database_url, wait_for_workers

CRON_EXPR = "* * * * * *"  # every second (6 fields: leading seconds)
# Every job, live or finished: a finished one moves to the history HISTORY_AFTER after it finished.
JOBS = ("(SELECT id, task, schedule_type, status FROM cron_at_scale_job "
        "UNION ALL SELECT id, task, schedule_type, status FROM cron_at_scale_jobhistory)")
ATTEMPTS = ("(SELECT job_id, scheduled_at, dispatched_at, started_at, outcome FROM cron_at_scale_jobattempt "
            "UNION ALL SELECT job_id, scheduled_at, dispatched_at, started_at, outcome FROM cron_at_scale_attempthistory)")


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


def _count(sql: str, params=()) -> int:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()[0]


class Command(BaseCommand):
    help = (
        "Run the whole scheduler for real: migrations, one dispatcher, two Celery workers; schedule "
        "--jobs jobs (most due now, some over the next --spread seconds, a few every-second cron jobs, a "
        "few cancelled), show progress, and print a summary (and with --json a final JSON line). Uses "
        "DATABASE_URL / CELERY_BROKER_URL when set, else the embedded PostgreSQL and broker of devservices/. Exit status 1 if a "
        "job was missed or an attempt executed twice."
    )

    def add_arguments(self, parser):
        parser.add_argument("--jobs", type=int, default=10_000, help="jobs to schedule (default 10000)")
        parser.add_argument("--spread", type=float, default=20.0, help="seconds over which delayed jobs are spread (default 20)")
        parser.add_argument("--cron-jobs", type=int, default=3, help="every-second cron jobs (default 3)")
        parser.add_argument("--workers", type=int, default=2, help="celery worker processes (default 2)")
        parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds (default 300)")
        parser.add_argument("--json", action="store_true", help="end the output with one JSON line of the figures")

    def handle(self, *args, **opts):
        n = opts["jobs"]
        if n < 10:
            raise CommandError("--jobs must be at least 10")
        if opts["workers"] < 1 or opts["spread"] < 0 or opts["cron_jobs"] < 0:
            raise CommandError("--workers must be >= 1; --spread and --cron-jobs must be >= 0")
        out = self.stderr if opts["json"] else self.stdout
        say = out.write

        say("migrating the database ...")
        call_command("migrate", verbosity=0)
        with connection.cursor() as cur:  # a clean slate for the demo's own rows
            cur.execute("TRUNCATE demo_execution")
            cur.execute("DELETE FROM cron_at_scale_jobattempt a USING cron_at_scale_job j "
                        "WHERE j.id = a.job_id AND j.task LIKE 'demo.tasks.%%'")
            cur.execute("DELETE FROM cron_at_scale_job WHERE task LIKE 'demo.tasks.%%'")
            cur.execute("DELETE FROM cron_at_scale_attempthistory a USING cron_at_scale_jobhistory j "
                        "WHERE j.id = a.job_id AND j.task LIKE 'demo.tasks.%%'")
            cur.execute("DELETE FROM cron_at_scale_jobhistory WHERE task LIKE 'demo.tasks.%%'")

        env = child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL)
        log_dir = Path(getattr(settings, "DATA_DIR", Path.cwd())) / "demo-logs"
        procs = Processes(env, log_dir=log_dir)
        app = get_app()
        app.control.purge()
        try:
            names = [f"demo-worker-{i + 1}" for i in range(opts["workers"])]
            for name in names:
                procs.worker(name)
            procs.dispatcher("demo-dispatcher")
            say(f"starting {len(names)} celery workers and 1 dispatcher (logs in {log_dir}) ...")
            wait_for_workers(app, names)
            self.procs = procs
            summary = self.run_jobs(n, opts, say)
        except KeyboardInterrupt:
            say("\ninterrupted: stopping the workers and the dispatcher")
            procs.stop()
            sys.exit(130)
        finally:
            procs.stop()
        summary_text = summary_lines(summary)
        say(summary_text)
        if opts["json"]:
            self.stdout.write(json.dumps(summary))
        if summary["missed"] or summary["duplicates"]:
            sys.exit(1)

    def run_jobs(self, n: int, opts: dict, say) -> dict:
        from tqdm import tqdm

        rng = random.Random(42)
        n_cron = opts["cron_jobs"]
        n_cancel = max(1, n // 100)
        n_delayed = (n - n_cron - n_cancel) * 15 // 100
        n_now = n - n_cron - n_cancel - n_delayed
        spread = opts["spread"]
        started = time.monotonic()

        specs = [{"task": "demo.tasks.record"} for _ in range(n_now)]
        specs += [{"task": "demo.tasks.record", "countdown": rng.uniform(0, spread)} for _ in range(n_delayed)]
        specs += [{"task": "demo.tasks.record", "countdown": spread + 30 + rng.uniform(0, 10)} for _ in range(n_cancel)]
        # The cancelled ones are scheduled first and cancelled at once, then the rest go in.
        jobs = cron_at_scale.schedule_many(specs[n_now + n_delayed:])
        for job in jobs:
            cron_at_scale.cancel(job.id)
        cancelled_ids = [j.id for j in jobs]
        # Every occurrence must run (the demo counts them): catch up all, let runs overlap.
        crons = [cron_at_scale.schedule("demo.tasks.record", cron=CRON_EXPR, catchup="all", overlap="allow")
                 for _ in range(n_cron)]
        cron_at_scale.schedule_many(specs[: n_now + n_delayed])
        say(f"scheduled {n} jobs: {n_now} due now, {n_delayed} over {spread:.0f}s, {n_cron} cron ({CRON_EXPR}), "
            f"{n_cancel} cancelled")

        one_off = n_now + n_delayed
        deadline = started + opts["timeout"]
        bar = tqdm(total=one_off, desc="firing", unit="job", file=sys.stderr, disable=None)
        done = 0
        while done < one_off and time.monotonic() < deadline:
            time.sleep(0.25)
            self.check_children()
            now_done = _count(f"SELECT count(*) FROM {JOBS} AS j WHERE task = 'demo.tasks.record' "
                              "AND schedule_type = 'once' AND status IN ('completed', 'failed')")
            bar.update(now_done - done)
            done = now_done
        bar.close()
        # Let the cron jobs run to the end of the spread window and until their
        # backlog has drained (no run waiting more than a second), then stop them.
        while time.monotonic() < deadline and (time.monotonic() < started + spread + 2 or _count(
            "SELECT count(*) FROM cron_at_scale_jobattempt a JOIN cron_at_scale_job j ON j.id = a.job_id "
            "WHERE j.task = 'demo.tasks.record' AND a.outcome = 'dispatched' "
            "AND a.dispatched_at < statement_timestamp() - interval '1 second'"
        )):
            time.sleep(0.2)
            self.check_children()
        time.sleep(2)
        for job in crons:
            cron_at_scale.cancel(job.id)
        with connection.cursor() as cur:
            cur.execute("SELECT statement_timestamp()")
            stopped_at = cur.fetchone()[0]
        # Wait for the cron runs already started to finish.
        while time.monotonic() < deadline and _count(
            "SELECT count(*) FROM cron_at_scale_jobattempt a JOIN cron_at_scale_job j ON j.id = a.job_id "
            "WHERE j.task = 'demo.tasks.record' AND a.finished_at IS NULL AND a.outcome <> 'dispatched'"
        ):
            time.sleep(0.2)
        time.sleep(0.5)
        return self.summarize(n, cancelled_ids, crons, stopped_at, time.monotonic() - started)

    def check_children(self) -> None:
        """Stop with a clear message if a worker or the dispatcher died (that is not a missed job)."""
        for p in self.procs.procs:
            if p.poll() is not None:
                raise CommandError(f"{p.name} exited with code {p.returncode}; see its log in "
                                   f"{self.procs.log_dir}")

    def summarize(self, n, cancelled_ids, crons, stopped_at, elapsed) -> dict:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'cancelled'),"
                " count(*) FILTER (WHERE status NOT IN ('completed', 'cancelled'))"
                f" FROM {JOBS} AS j WHERE schedule_type = 'once' AND task = 'demo.tasks.record'")
            completed, cancelled, unfinished = cur.fetchone()
            # Executions per (job, attempt): from the task's own table, not the scheduler's log.
            cur.execute("SELECT coalesce(sum(c - 1), 0) FROM (SELECT count(*) AS c FROM demo_execution "
                        "GROUP BY job_id, attempt HAVING count(*) > 1) d")
            duplicates = int(cur.fetchone()[0])
            # One-off jobs that should have run and have no execution at all.
            cur.execute(f"SELECT count(*) FROM {JOBS} AS j WHERE j.schedule_type = 'once' "
                        "AND j.task = 'demo.tasks.record' AND j.status <> 'cancelled' AND NOT EXISTS "
                        "(SELECT 1 FROM demo_execution e WHERE e.job_id = j.id)")
            missed_once = cur.fetchone()[0]
            cur.execute("SELECT count(*) FROM demo_execution WHERE job_id = ANY(%s)", [list(cancelled_ids)])
            cancelled_ran = cur.fetchone()[0]
            # Cron: every occurrence from its first fire_at up to 2 s before it was
            # stopped must have run (later ones may have been dispatched and then
            # skipped because the job was cancelled: that is what cancel means).
            missed_cron, cron_runs = 0, 0
            for job in crons:
                expected = set(next_fire_times(CRON_EXPR, "UTC", job.fire_at - timedelta(seconds=1),
                                               max(1, int((stopped_at - job.fire_at).total_seconds()))))
                expected = {t for t in expected if t <= stopped_at - timedelta(seconds=2)}
                cur.execute("SELECT DISTINCT a.scheduled_at FROM cron_at_scale_jobattempt a JOIN demo_execution e "
                            "ON e.job_id = a.job_id AND e.attempt = a.attempt WHERE a.job_id = %s", [job.id])
                ran = {r[0] for r in cur.fetchall()}
                cron_runs += len(ran)
                missed_cron += len(expected - ran)
            stats = run_stats(cur)
        return {
            "scheduled": n,
            "completed": completed,
            "cancelled": cancelled,
            "cron_runs": cron_runs,
            "missed": int(missed_once + missed_cron + unfinished),
            "duplicates": duplicates,
            "cancelled_but_ran": cancelled_ran,
            **stats,
            "elapsed_s": round(elapsed, 1),
        }


# Per run (a one-off job: all its attempts; a cron job: the attempts of one occurrence), database
# clock: when it was due, first dispatched (a run claimed ahead is published at its fire_at), first
# started, and its attempts; the lost ones by whether a worker had started them.
RUNS = f"""
SELECT min(a.scheduled_at) AS due,
       min(greatest(a.dispatched_at, a.scheduled_at)) AS dispatched,
       min(a.started_at) FILTER (WHERE a.outcome <> 'cancelled') AS started,
       count(*) AS attempts,
       count(*) FILTER (WHERE a.outcome = 'lost' AND a.started_at IS NULL) AS lost_queued,
       count(*) FILTER (WHERE a.outcome = 'lost' AND a.started_at IS NOT NULL) AS lost_running
FROM {ATTEMPTS} AS a JOIN {JOBS} AS j ON j.id = a.job_id
WHERE j.task = 'demo.tasks.record'
GROUP BY a.job_id, CASE WHEN j.schedule_type = 'once' THEN NULL ELSE a.scheduled_at END
"""


def run_stats(cur) -> dict:
    """The demo's attempts, per run: the firing lag (due -> first start) and its two parts, the
    scheduler's (due -> first dispatch: claimed and published) and the workers' (first dispatch ->
    first start: waiting in the broker for a free worker, and for the re-fire of an attempt whose
    dispatch lease ran out there); and the re-fires, attempts fired again after one was lost."""
    cur.execute(f"""SELECT extract(epoch FROM started - due) * 1000, extract(epoch FROM dispatched - due) * 1000,
                           extract(epoch FROM started - dispatched) * 1000, attempts, lost_queued, lost_running
                    FROM ({RUNS}) runs""")
    rows = cur.fetchall()
    started = [r for r in rows if r[0] is not None]
    return {
        "lag_ms": _percentiles(sorted(float(r[0]) for r in started)),
        "dispatch_lag_ms": _percentiles(sorted(float(r[1]) for r in started)),
        "queue_wait_ms": _percentiles(sorted(max(0.0, float(r[2])) for r in started)),
        "attempts": sum(r[3] for r in rows),
        "refires": sum(r[3] - 1 for r in rows),
        "lost_before_start": sum(r[4] for r in rows),
        "lost_while_running": sum(r[5] for r in rows),
    }


def summary_lines(summary: dict) -> str:
    """The human summary of ``summary`` (the JSON line's figures)."""
    lag, sched, work = summary["lag_ms"], summary["dispatch_lag_ms"], summary["queue_wait_ms"]
    return (
        f"scheduled {summary['scheduled']}  completed {summary['completed']}  cancelled {summary['cancelled']}  "
        f"cron runs {summary['cron_runs']}  missed {summary['missed']}  duplicates {summary['duplicates']}  "
        f"re-fires {summary['refires']} of {summary['attempts']} attempts\n"
        f"firing lag ms: p50 {lag['p50']}  p95 {lag['p95']}  p99 {lag['p99']}  max {lag['max']}  "
        f"(per run: fire_at -> its first start, database clock; {summary['elapsed_s']} s in all)\n"
        f"  the scheduler's part ms: p50 {sched['p50']}  p99 {sched['p99']}  max {sched['max']}  "
        "(fire_at -> first dispatch: claimed and published; also a queue held back while its workers are behind)\n"
        f"  the workers' part ms: p50 {work['p50']}  p99 {work['p99']}  max {work['max']}  "
        "(first dispatch -> first start: waiting for a free worker, and for re-fires)\n"
        f"re-fired attempts: {summary['refires']} (an attempt lost: {summary['lost_before_start']} "
        f"before a worker started it, its dispatch lease ran out in the queue; {summary['lost_while_running']} "
        "while running, its worker died)"
    )


def _percentiles(values: list[float]) -> dict[str, float]:
    return {k: round(percentile(values, p), 1) for k, p in (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100))}
