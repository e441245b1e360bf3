"""The admin, the dashboard and the metrics at 10M jobs; then retention after churn.

Usage (PostgreSQL from ``BENCH_DATABASE_URL``, default a local server;
the databases are created and filled here, never your own)::

    python bench/admin_10m.py                      # 10M rows into database cron_admin_bench, then time
    python bench/admin_10m.py --reuse              # time again without regenerating
    python bench/admin_10m.py --rows 1000000 --churn-rows 200000 --json

Part 1 fills ``--db`` with ``--rows`` jobs (``INSERT … SELECT
generate_series``, secondary indexes built after the load; 85% completed
over the last 7 days, 1% failed, 0.5% cancelled, 13% pending over the next
30 days, 1,000 cron jobs, 50 task names, 5 queues, a key on every 10th
job; one attempt per fired job) and times admin pages with Django's test
client (median of 3 after a warm-up), with the number of SQL queries each.

Part 2 (churn) fills ``--churn-db`` with ``--churn-rows`` jobs plus 10,000
due ones, times the claim statement and the changelist, purges the finished
jobs older than 3.5 days (about half the table) with
``cron_at_scale.maintenance.retention.purge``, runs a plain ``VACUUM`` and times them
again. Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "example_project")]

BASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def _url(db: str) -> str:
    return BASE_URL.rsplit("/", 1)[0] + "/" + db


def create_database(db: str, fresh: bool = False) -> None:
    """Create ``db``; with ``fresh``, drop it first (an interrupted load leaves it without its indexes)."""
    import psycopg2

    conn = psycopg2.connect(BASE_URL)
    conn.autocommit = True
    with conn.cursor() as cur:
        if fresh:
            cur.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db])
        if cur.fetchone() is None:
            cur.execute(f'CREATE DATABASE "{db}"')
    conn.close()


def setup_django(db: str) -> None:
    os.environ["DATABASE_URL"] = _url(db)
    os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django

    django.setup()
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client's response.context; ALLOWED_HOSTS += testserver


def switch_database(db: str) -> None:
    from django.db import connection

    connection.close()
    connection.settings_dict["NAME"] = db


def sql(query: str, params=None, fetch: bool = False):
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall() if fetch else cur.rowcount


def generate(rows: int, extra_due: int = 0) -> dict:
    """Fill the jobs and attempts tables; returns seconds spent per step."""
    from django.core.management import call_command

    took = {}
    t = time.monotonic()
    call_command("migrate", verbosity=0)
    sql("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_job")
    # Secondary indexes (not those backing a constraint) are dropped for the load and built after it.
    indexes = sql("""SELECT i.indexname, i.indexdef FROM pg_indexes i
                     WHERE i.tablename IN ('cron_at_scale_job', 'cron_at_scale_jobattempt')
                       AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = (quote_ident(i.indexname))::regclass)""",
                  fetch=True)
    for name, _ in indexes:
        sql(f'DROP INDEX "{name}"')
    sql("SET session_replication_role = replica")  # no FK triggers during the load (superuser)
    sql("SET maintenance_work_mem = '512MB'")
    took["setup"] = time.monotonic() - t
    t = time.monotonic()
    sql(f"""
        INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, cron_expr, timezone, task, payload, queue, options,
            status, retries, max_retries, attempts, lost_attempts, cancel_requested, locked_by, locked_until, key,
            occurrence_at, catchup, catchup_window, overlap, jitter, missed_occurrences, skipped_occurrences,
            pause_note, created_at, updated_at)
        SELECT md5(i::text)::uuid,
               CASE WHEN i % 10000 = 9999 THEN 'cron' ELSE 'once' END,
               f.fire_at, CASE WHEN i % 10000 = 9999 THEN '*/5 * * * *' ELSE '' END, 'UTC',
               'app.tasks.t' || (i % 50), jsonb_build_object('args', jsonb_build_array(i), 'kwargs', '{{}}'::jsonb),
               (ARRAY['', 'default', 'emails', 'reports', 'bulk'])[1 + i % 5], '{{}}'::jsonb,
               s.status, CASE WHEN s.status = 'failed' THEN 3 ELSE 0 END, 3,
               CASE WHEN s.status IN ('pending', 'cancelled') AND i % 10000 <> 9999 THEN 0 ELSE 1 END, 0, false,
               CASE WHEN s.status = 'in_progress' THEN 'bench-host:1' ELSE '' END,
               CASE WHEN s.status = 'in_progress' THEN now() + interval '30 seconds' END,
               CASE WHEN i % 10 = 0 THEN 'order-' || i END,
               CASE WHEN i % 10000 = 9999 THEN f.fire_at END, 'latest', 300, 'skip', 0, 0, 0, '',
               f.fire_at - interval '1 minute', f.fire_at + interval '1 second'
        FROM generate_series(1, {int(rows)}) AS i,
        LATERAL (SELECT CASE
            WHEN i % 10000 = 9999 THEN 'pending'
            WHEN i % 100000 < 5 THEN 'pending'            -- due (overdue) one-offs
            WHEN i % 100000 < 15 THEN 'in_progress'
            WHEN i % 1000 < 850 THEN 'completed'
            WHEN i % 1000 < 860 THEN 'failed'
            WHEN i % 1000 < 865 THEN 'cancelled'
            ELSE 'pending' END AS status) AS s,
        LATERAL (SELECT CASE
            WHEN s.status = 'pending' AND (i % 100000 < 5) THEN now() - interval '2 seconds'
            WHEN s.status IN ('pending') THEN now() + make_interval(secs => (i % 2592000) + 1)
            ELSE now() - make_interval(secs => ((i::bigint * 7919) % 604800)::int) END AS fire_at) AS f
    """)
    if extra_due:
        sql(f"""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options, status, created_at, updated_at)
               SELECT md5('due' || i)::uuid, now() - make_interval(secs => i % 60), 'app.tasks.t1',
                      '{{"args": [], "kwargs": {{}}}}', '{{}}', 'pending', now(), now()
               FROM generate_series(1, {int(extra_due)}) AS i""")
    took["jobs"] = time.monotonic() - t
    t = time.monotonic()
    sql("""
        INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, started_at, finished_at,
                                              locked_until, worker, outcome, error, traceback)
        SELECT id, 1, fire_at, fire_at + interval '3 ms', fire_at + interval '8 ms',
               CASE WHEN status = 'in_progress' THEN NULL ELSE fire_at + interval '20 ms' END,
               CASE WHEN status = 'in_progress' THEN now() + interval '60 seconds' END,
               'worker-' || (get_byte(decode(md5(id::text), 'hex'), 0) % 4) || ':1',
               CASE status WHEN 'completed' THEN 'succeeded' WHEN 'failed' THEN 'failed'
                           WHEN 'in_progress' THEN 'running' ELSE 'cancelled' END,
               CASE WHEN status = 'failed' THEN 'ValueError: bench' ELSE '' END, ''
        FROM cron_at_scale_job WHERE attempts > 0
    """)
    sql("SET session_replication_role = origin")
    took["attempts"] = time.monotonic() - t
    t = time.monotonic()
    for _, definition in indexes:
        sql(definition)
    took["indexes"] = time.monotonic() - t
    t = time.monotonic()
    sql("VACUUM ANALYZE cron_at_scale_job")
    sql("VACUUM ANALYZE cron_at_scale_jobattempt")
    took["vacuum_analyze"] = time.monotonic() - t
    return {k: round(v, 1) for k, v in took.items()}


def client():
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.filter(username="bench").first() or User.objects.create_superuser("bench", "b@example.com", "x")
    c = Client()
    c.force_login(user)
    return c


def time_page(c, url: str, runs: int = 3) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    r = c.get(url)  # warm-up (plans, caches)
    assert r.status_code == 200, (url, r.status_code, r.content[:500])
    times = []
    for _ in range(runs):
        with CaptureQueriesContext(connection) as q:
            t = time.perf_counter()
            r = c.get(url)
            times.append(time.perf_counter() - t)
        assert r.status_code == 200, (url, r.status_code)
    slowest = max(q.captured_queries, key=lambda x: float(x["time"]), default={"time": "0", "sql": ""})
    return {"ms": round(statistics.median(times) * 1000, 1), "queries": len(q.captured_queries),
            "slowest_query_ms": round(float(slowest["time"]) * 1000, 1), "slowest_query": slowest["sql"][:160]}


def admin_pages(c) -> dict:
    (job_id,), = sql("SELECT id FROM cron_at_scale_job WHERE status = 'completed' LIMIT 1", fetch=True)
    (failed_id,), = sql("SELECT id FROM cron_at_scale_job WHERE status = 'failed' LIMIT 1", fetch=True)
    (key,), = sql("SELECT key FROM cron_at_scale_job WHERE key IS NOT NULL LIMIT 1", fetch=True)
    base = "/admin/cron_at_scale/job/"
    pages = {
        "changelist": base,
        "changelist page 50": base + "?p=50",
        "filter status=pending": base + "?status__exact=pending",
        "filter status=failed": base + "?status__exact=failed",
        "filter schedule_type=cron": base + "?schedule_type__exact=cron",
        "filter task": base + "?task=app.tasks.t7",
        "filter queue": base + "?queue=emails",
        "filter queue (default)": base + "?queue=",
        "filter status+task": base + "?status__exact=failed&task=app.tasks.t7",
        "search id": base + f"?q={job_id}",
        "search id tail (latest 100,000)": base + f"?q={str(job_id)[-12:]}",
        "search id start": base + f"?q={str(job_id)[:13]}",
        "filter due=late": base + "?due=late",
        "ordered by next fire": base + "?o=-7",
        "ordered by next fire, soonest first": base + "?o=7",
        "ordered by next fire, page 50": base + "?o=-7&p=50",
        "filter schedule_type=once": base + "?schedule_type__exact=once",
        "search key prefix": base + f"?q={key[:9]}",
        "change page": base + f"{job_id}/change/",
        "change page (failed)": base + f"{failed_id}/change/",
        "dashboard": base + "dashboard/",
        "attempts changelist": "/admin/cron_at_scale/jobattempt/",
        "metrics": "/metrics",
    }
    return {name: time_page(c, url) for name, url in pages.items()}


def time_claim(runs: int = 5) -> float:
    """Median ms of one claim of 1,000 due jobs, each in a transaction rolled back."""
    from django.db import transaction

    from cron_at_scale.dispatcher import Dispatcher

    dispatcher = Dispatcher(name="bench", batch_size=1000, shards="all", lookahead=0)
    times = []
    for _ in range(runs + 1):
        with transaction.atomic():
            t = time.perf_counter()
            n = len(dispatcher.claim())  # the dispatcher's own claim (statement + recurring advance)
            times.append(time.perf_counter() - t)
            transaction.set_rollback(True)
        assert n == 1000, n
    return round(statistics.median(times[1:]) * 1000, 1)


def sizes() -> dict:
    rows = sql("""SELECT relname, pg_total_relation_size(oid) / 1048576 FROM pg_class
                  WHERE relname IN ('cron_at_scale_job', 'cron_at_scale_jobattempt')""", fetch=True)
    return {name: int(mb) for name, mb in rows}


def churn(rows: int) -> dict:
    from cron_at_scale.maintenance import retention

    out = {"rows": rows, "generate_s": generate(rows, extra_due=10_000)}
    c = client()
    out["before"] = {"claim_ms": time_claim(), "changelist": time_page(c, "/admin/cron_at_scale/job/")["ms"],
                     "dashboard": time_page(c, "/admin/cron_at_scale/job/dashboard/")["ms"], "mb": sizes()}
    t = time.monotonic()
    jobs, attempts = retention.purge(3.5 * 86400, batch_size=1000)
    purge_s = time.monotonic() - t
    out["purge"] = {"jobs": jobs, "attempts": attempts, "seconds": round(purge_s, 1),
                    "jobs_per_s": round(jobs / purge_s) if purge_s else None}
    t = time.monotonic()
    sql("VACUUM cron_at_scale_job")
    sql("VACUUM cron_at_scale_jobattempt")
    out["vacuum_s"] = round(time.monotonic() - t, 1)
    out["after"] = {"claim_ms": time_claim(), "changelist": time_page(c, "/admin/cron_at_scale/job/")["ms"],
                    "dashboard": time_page(c, "/admin/cron_at_scale/job/dashboard/")["ms"], "mb": sizes()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--db", default="cron_admin_bench")
    parser.add_argument("--reuse", action="store_true", help="keep the rows already in --db")
    parser.add_argument("--churn-rows", type=int, default=1_000_000, help="0: skip the churn part")
    parser.add_argument("--churn-db", default="cron_admin_churn")
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    create_database(args.db, fresh=not args.reuse)
    if args.churn_rows:
        create_database(args.churn_db, fresh=True)
    setup_django(args.db)
    report = {"rows": args.rows}
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))
    if not args.reuse:
        say(f"generating {args.rows:,} jobs in {args.db} …")
        report["generate_s"] = generate(args.rows)
        say(f"  took {report['generate_s']}")
    (n,), = sql("SELECT reltuples::bigint FROM pg_class WHERE relname = 'cron_at_scale_job'", fetch=True)
    report["jobs_estimated"] = n
    report["mb"] = sizes()
    c = client()
    report["pages"] = admin_pages(c)
    say(f"\n{'page':<28}{'ms':>8}{'queries':>9}{'slowest q ms':>14}")
    for name, p in report["pages"].items():
        say(f"{name:<28}{p['ms']:>8}{p['queries']:>9}{p['slowest_query_ms']:>14}")
    if args.churn_rows:
        switch_database(args.churn_db)
        say(f"\nchurn: {args.churn_rows:,} jobs in {args.churn_db}, purge finished jobs older than 3.5 days, VACUUM")
        report["churn"] = ch = churn(args.churn_rows)
        say(f"  purged {ch['purge']['jobs']:,} jobs + {ch['purge']['attempts']:,} attempts in "
            f"{ch['purge']['seconds']} s ({ch['purge']['jobs_per_s']} jobs/s); VACUUM {ch['vacuum_s']} s")
        for when in ("before", "after"):
            w = ch[when]
            say(f"  {when:<7} claim 1000 due: {w['claim_ms']} ms   changelist {w['changelist']} ms   "
                f"dashboard {w['dashboard']} ms   sizes MB {w['mb']}")
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
