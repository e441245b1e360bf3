"""What a small claim costs PostgreSQL: ``--claims`` times, ``schedule_many`` of ``--jobs`` jobs due now,
then one ``Dispatcher.claim()`` (the dispatcher's own transaction and statements, no broker), beside
``--pending`` future jobs (made once, kept between runs). It deletes the jobs due within the hour from
the database of ``DATABASE_URL``: a database of its own, never yours.

Prints the backend's CPU per claim (from ``/proc``: this host's PostgreSQL only), the claim's wall
time p50/p90, and how the claim was planned on this connection (``pg_prepared_statements``: generic
and custom plans of ``cas_claim``; none when ``PREPARED_STATEMENTS`` is off). Run it from two
checkouts in turns to compare them (``docs/benchmarks.md``, "The claim's generic plan").

    DATABASE_URL=postgres://… CELERY_BROKER_URL=redis://… python bench/claim_cost.py --pending 1000000
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
sys.path[:0] = [str(ROOT), str(ROOT / "example_project"), str(ROOT / "tests")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--claims", type=int, default=600, help="claims measured (600)")
    p.add_argument("--jobs", type=int, default=5, help="jobs due now per claim (5)")
    p.add_argument("--pending", type=int, default=0, help="future jobs beside them (0; made once, kept)")
    a = p.parse_args(argv)

    import django

    django.setup()
    from django.core.management import call_command
    from helpers import RecordingPublisher, sql

    import cron_at_scale
    from cron_at_scale.dispatcher import Dispatcher
    from cron_at_scale.sql import db_now

    call_command("migrate", verbosity=0)

    sql("DELETE FROM cron_at_scale_job WHERE fire_at < now() + interval '1 hour'")  # an earlier run's due jobs
    (have,), = sql("SELECT count(*) FROM cron_at_scale_job WHERE status = 'pending'")
    if have < a.pending:
        base = db_now() + timedelta(days=1)
        for start in range(have, a.pending, 50_000):
            cron_at_scale.schedule_many([{"task": "demo.tasks.noop", "args": [i], "at": base + timedelta(milliseconds=i)}
                                         for i in range(start, min(a.pending, start + 50_000))])
        sql("VACUUM ANALYZE cron_at_scale_job")
    d = Dispatcher(name="bench", shards="all", publisher=RecordingPublisher(), hold_unconsumed=False)
    d.claim()  # shards taken, statements prepared
    (backend,), = sql("SELECT pg_backend_pid()")
    walls: list[float] = []
    cpu = 0.0
    claimed = 0
    for _ in range(a.claims):
        cron_at_scale.schedule_many([{"task": "demo.tasks.noop", "args": [j]} for j in range(a.jobs)])
        c0, t0 = backend_cpu(backend), time.perf_counter()
        claimed += len(d.claim())
        walls.append((time.perf_counter() - t0) * 1000)
        cpu += backend_cpu(backend) - c0
    plans = sql("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'cas_claim'")
    d.close()
    walls.sort()
    print(f"{a.claims} claims of {a.jobs} due jobs beside {max(have, a.pending):,} pending: {claimed} claimed")
    print(f"PostgreSQL CPU per claim {cpu * 1000 / a.claims:.3f} ms; wall p50 {statistics.median(walls):.2f} ms, "
          f"p90 {walls[int(len(walls) * 0.9)]:.2f} ms")
    print("claim plans on this connection: " + (f"{plans[0][0]} generic, {plans[0][1]} custom" if plans
                                                else "not a prepared statement"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
