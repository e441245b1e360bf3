"""Benchmark: N jobs due at one instant -> firing throughput, completion throughput, firing lag.

    python bench/fire.py [--jobs 20000] [--workers 2] [--concurrency 1] [--json]

Uses DATABASE_URL / CELERY_BROKER_URL when set, embedded services otherwise
(as the demo does). Firing = jobs claimed and published per second (from
the instant they fell due to the last one's dispatch, database clock);
completion = jobs finished per second by the Celery workers; lag = attempt
start minus fire_at (database clock). Prints text, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "example_project")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
os.environ.setdefault("CRON_AT_SCALE_DATA_DIR", str(ROOT / ".demo-data"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2, help="celery worker processes")
    parser.add_argument("--concurrency", type=int, default=1, help="prefork children per worker")
    parser.add_argument("--task", default="demo.tasks.noop")
    parser.add_argument("--json", action="store_true", help="only the JSON line on stdout")
    args = parser.parse_args()

    import django

    django.setup()
    from demo.management.commands.demo import percentile
    from demo.runner import Processes, child_env, database_url, wait_for_workers
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    import cron_at_scale
    from cron_at_scale.app import get_app

    def q(sql, params=()):
        with connection.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []

    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    call_command("migrate", verbosity=0)
    q("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_job, demo_execution")
    app = get_app()
    app.control.purge()
    procs = Processes(child_env(database_url(connection.settings_dict), settings.CELERY_BROKER_URL),
                      log_dir=ROOT / ".demo-data" / "bench-logs")
    try:
        names = [f"bench-w{i}" for i in range(args.workers)]
        for name in names:
            procs.worker(name, concurrency=args.concurrency)
        procs.dispatcher("bench-d")
        wait_for_workers(app, names)
        (later,), = q("SELECT statement_timestamp() + interval '1 hour'")
        t0 = time.monotonic()
        for start in range(0, args.jobs, 10_000):
            cron_at_scale.schedule_many([{"task": args.task, "at": later}] * min(10_000, args.jobs - start))
        elapsed = time.monotonic() - t0
        say(f"scheduled {args.jobs} jobs in {elapsed:.1f}s ({args.jobs / elapsed:.0f} jobs/s); making them all due now")
        # All due at one instant: one statement moves every fire_at to the same database time.
        (due,), = q("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() RETURNING fire_at")[:1]
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            (done,), = q("SELECT count(*) FROM cron_at_scale_job WHERE status IN ('completed', 'failed')")
            if done >= args.jobs:
                break
            time.sleep(0.25)
    finally:
        procs.stop()
    (n, last_dispatch, last_finish), = q(
        "SELECT count(*), extract(epoch FROM max(dispatched_at) - %s), extract(epoch FROM max(finished_at) - %s) "
        "FROM cron_at_scale_jobattempt WHERE outcome = 'succeeded'", [due, due])
    lags = sorted(float(r[0]) for r in q(
        "SELECT extract(epoch FROM started_at - scheduled_at) * 1000 FROM cron_at_scale_jobattempt "
        "WHERE started_at IS NOT NULL"))
    result = {
        "jobs": args.jobs,
        "completed": n,
        "workers": args.workers * args.concurrency,
        "firing_jobs_per_s": round(n / float(last_dispatch), 1) if last_dispatch else None,
        "completion_jobs_per_s": round(n / float(last_finish), 1) if last_finish else None,
        "lag_ms": {k: round(percentile(lags, p), 1) for k, p in (("p50", 50), ("p99", 99), ("max", 100))},
    }
    say(f"firing:     {result['firing_jobs_per_s']} jobs/s (claimed and published)")
    say(f"completion: {result['completion_jobs_per_s']} jobs/s ({result['workers']} worker processes)")
    say(f"lag ms:     p50 {result['lag_ms']['p50']}  p99 {result['lag_ms']['p99']}  max {result['lag_ms']['max']}")
    print(json.dumps(result))
    return 0 if n == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
