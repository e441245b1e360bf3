"""What the job table's indexes cost ``schedule_many``: the index sets before and after migration 0021
(or 0018, or 0013), in turns, on one database of its own.

Usage (PostgreSQL from ``BENCH_DATABASE_URL``, default a local server; the database ``--db`` is
created here and emptied at each turn, never your own)::

    python bench/index_cost.py                       # 100,000 jobs into an empty table, 3 turns (0020 | 0021)
    python bench/index_cost.py --sides 0018          # before and after 0018
    python bench/index_cost.py --sides both          # before and after 0013
    python bench/index_cost.py --beside 1000000      # ... beside 1M pending jobs
    python bench/index_cost.py --sides after --beside 10000000   # today's indexes only, beside 10M
    python bench/index_cost.py --sides after --batch-sizes 10000,50000   # schedule_many's batch_size, in turns

Each turn sets the indexes of one side (drops and builds the ones that differ), then times
``schedule_many`` of ``--jobs`` one-off jobs of the default queue (50,000 per call) and reads
the CPU seconds of this process and of its PostgreSQL backend from ``/proc`` (jobs/s moves with
the machine's load; CPU per job moves less). The clock and the CPU count the calls; the list of
specs each call is given is built before it (the caller's work: 1.7–3.0 µs a job of dicts and
``timedelta`` arithmetic on this box), timed apart, and also shown added back ("with the specs' building",
the figure this script printed before). Prints one line per turn and the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "example_project")]

BASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
BEFORE_0013 = {  # the two indexes 0013 dropped (the third, its named-queue index, is absent before)
    "cron_job_pending_fire_at": "CREATE INDEX cron_job_pending_fire_at ON cron_at_scale_job (fire_at) "
                                "WHERE status = 'pending'",
    "cron_job_queue_fire_at": "CREATE INDEX cron_job_queue_fire_at ON cron_at_scale_job (queue, fire_at, id)",
}
BEFORE_0018 = {"cron_job_fire_at_id": "CREATE INDEX cron_job_fire_at_id ON cron_at_scale_job (fire_at, id)"}
# before 0021 the status index held every row; 0021 left pending rows out (same name, the partial one)
BEFORE_0021 = {"cron_job_status_fire_at_all": "CREATE INDEX cron_job_status_fire_at_all ON cron_at_scale_job "
                                              "(status, fire_at, id)"}
PARTIAL_STATUS = "cron_job_status_fire_at"
SIDES = {  # the indexes each side lacks
    "before 0013": ["cron_job_named_queue_fire_at", PARTIAL_STATUS],
    "0013 to 0017": [*BEFORE_0013, PARTIAL_STATUS],
    "0018 to 0020": [*BEFORE_0013, *BEFORE_0018, PARTIAL_STATUS],
    "after 0021": [*BEFORE_0013, *BEFORE_0018, *BEFORE_0021],
}
CHOICES = {"both": ["before 0013", "0013 to 0017"], "0018": ["0013 to 0017", "0018 to 0020"],
           "0021": ["0018 to 0020", "after 0021"], "all": list(SIDES), "after": ["after 0021"]}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--beside", type=int, default=0, help="pending jobs already in the table (0)")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--batch-sizes", default="10000",
                   help="schedule_many's batch_size (rows per COPY), several in turns: 10000,50000 (10000)")
    p.add_argument("--db", default="cron_index_cost")
    p.add_argument("--sides", choices=tuple(CHOICES), default="0021",
                   help="0021: the index sets before and after migration 0021 (the default); 0018: before and "
                        "after 0018; both: before and after 0013; all: the four; after: only today's index set "
                        "(no index rebuilt between turns: for --beside 10000000)")
    args = p.parse_args(argv)

    import psycopg2

    admin = psycopg2.connect(BASE_URL)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [args.db])
        if cur.fetchone() is None:
            cur.execute(f'CREATE DATABASE "{args.db}"')
    admin.close()
    os.environ["DATABASE_URL"] = BASE_URL.rsplit("/", 1)[0] + "/" + args.db
    os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/13")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    import cron_at_scale

    call_command("migrate", verbosity=0)

    def q(sql: str, params=()):
        with connection.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else None

    defs = {**dict(q("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'cron_at_scale_job'")),
            **BEFORE_0013, **BEFORE_0018, **BEFORE_0021}

    def set_side(dropped: list[str]) -> None:
        have = {r[0] for r in q("SELECT indexname FROM pg_indexes WHERE tablename = 'cron_at_scale_job'")}
        for name, definition in defs.items():
            if name in dropped and name in have:
                q(f'DROP INDEX "{name}"')
            elif name not in dropped and name not in have:
                q(definition)

    q("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_job")
    if args.beside:
        q("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options)
             SELECT gen_random_uuid(), now() + interval '1 day' + g * interval '1 second', 'demo.tasks.noop',
                    '{"args": [1], "kwargs": {}}', '{}'
             FROM generate_series(1, %s) AS g""", [args.beside])
        q("VACUUM ANALYZE cron_at_scale_job")
    (backend,), = q("SELECT pg_backend_pid()")
    sides = {side: SIDES[side] for side in CHOICES[args.sides]}
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    runs_of = [(side, b) for side in sides for b in batch_sizes]
    results: dict[str, list[tuple[float, float, float]]] = {}
    for turn in range(args.turns):
        for side, batch_size in runs_of:
            dropped = sides[side]
            label = side if len(batch_sizes) == 1 else f"{side}, batch_size {batch_size}"
            set_side(dropped)
            q("DELETE FROM cron_at_scale_job WHERE fire_at >= now() + interval '40 days'")  # the previous turn's
            q("VACUUM cron_at_scale_job")
            base = q("SELECT statement_timestamp()")[0][0] + timedelta(days=41)
            seconds = building = cpu = 0.0
            for start in range(0, args.jobs, 50_000):
                t0 = time.perf_counter()  # the caller's list of specs, timed apart from the call
                specs = [{"task": "demo.tasks.noop", "args": [i], "at": base + timedelta(milliseconds=i)}
                         for i in range(start, min(args.jobs, start + 50_000))]
                c0, b0, t1 = time.process_time(), cpu_seconds(backend), time.perf_counter()
                cron_at_scale.schedule_many(specs, batch_size=batch_size)
                seconds += time.perf_counter() - t1
                building += t1 - t0
                cpu += (time.process_time() - c0) + (cpu_seconds(backend) - b0)
            cpu_us = cpu * 1e6 / args.jobs
            results.setdefault(label, []).append((args.jobs / seconds, cpu_us, args.jobs / (seconds + building)))
            print(f"turn {turn + 1} {label:12} {args.jobs / seconds:10,.0f} jobs/s  {cpu_us:5.1f} µs CPU per job "
                  f"(this process + its backend)  {args.jobs / (seconds + building):10,.0f} jobs/s with the "
                  f"specs' building ({building * 1e6 / args.jobs:.1f} µs a job)", flush=True)
    set_side(SIDES["after 0021"])
    q("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_job")
    beside = f" beside {args.beside:,} pending" if args.beside else " into an empty table"
    print(f"schedule_many of {args.jobs:,} jobs{beside}, medians of {args.turns} turns:")
    for side, runs in results.items():
        print(f"  {side:12} {statistics.median(r[0] for r in runs):10,.0f} jobs/s  "
              f"{statistics.median(r[1] for r in runs):5.1f} µs CPU per job  "
              f"{statistics.median(r[2] for r in runs):10,.0f} jobs/s with the specs' building")
    return 0


if __name__ == "__main__":
    sys.exit(main())
