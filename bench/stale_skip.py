"""What a stale message costs a worker: messages of attempts that already finished, skipped.

Usage (PostgreSQL from ``BENCH_DATABASE_URL``, Redis from ``BENCH_BROKER_URL``; a database
``cas_stale_skip`` is created here and the broker's database is flushed)::

    python bench/stale_skip.py --messages 1500
    python bench/stale_skip.py --messages 1500 --max-tasks-per-child 200

Starts one ``celery worker -c 2`` (the fault suite's way, ``tests/faults/faultkit.py``), puts
``--messages`` messages on its queue whose attempts are already ``succeeded`` (what a re-fire
leaves behind once the other message ran: the start statement finds nothing to start and the
worker skips it, Celery's ``Ignore``), waits until the queue is empty and prints one JSON line:
the worker's resident memory (its process group, and its main process alone) before and after,
CPU ms per skipped message (``/proc``), and that no attempt row was added.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "faults"), str(ROOT), str(ROOT / "example_project")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1500)
    p.add_argument("--max-tasks-per-child", type=int, help="Celery's option: a pool process replaced after this many")
    args = p.parse_args()
    import faultkit
    import redis

    base = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    broker = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/13")
    server = faultkit.SharedPostgres(base)
    logs = Path("/tmp") / "cas-stale-skip-logs"
    faultkit.migrate_template(server, "cas_stale_skip_template", logs)
    url = faultkit.create_database(server, "cas_stale_skip_template", "cas_stale_skip")
    db = faultkit.DB(url)
    redis.Redis.from_url(broker).flushdb()
    system = faultkit.System(url, broker, logs, {"HOLD_UNCONSUMED_QUEUES": False})
    extra = ["--max-tasks-per-child", str(args.max_tasks_per_child)] if args.max_tasks_per_child else []
    system.worker("wa", concurrency=2, extra=extra)
    try:
        system.wait_workers(["wa"])
        ids = [str(uuid.uuid4()) for _ in range(args.messages)]
        db.q("""INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, task, payload, options, status, attempts)
                SELECT i::uuid, 'once', now(), 'demo.tasks.record', '{"args": [], "kwargs": {}}', '{}', 'completed', 1
                FROM unnest(%s::text[]) AS i""", (ids,))
        db.q("""INSERT INTO cron_at_scale_jobattempt (job_id, attempt, scheduled_at, dispatched_at, started_at,
                                                      finished_at, outcome)
                SELECT i::uuid, 1, now(), now(), now(), now(), 'succeeded' FROM unnest(%s::text[]) AS i""", (ids,))
        os.environ.update(DATABASE_URL=url, CELERY_BROKER_URL=broker, DJANGO_SETTINGS_MODULE="example_project.settings")
        import django

        django.setup()
        from cron_at_scale.broker.publish import publish_batch
        from cron_at_scale.celery_app import get_app
        from cron_at_scale.dispatcher.claimed import Claimed

        now = datetime.now(timezone.utc)
        runs = [Claimed(job_id=uuid.UUID(i), attempt=1, fire_at=now, schedule_type="once", cron_expr="",
                        timezone="UTC", task="demo.tasks.record", payload={"args": [], "kwargs": {}}, queue="",
                        options={}) for i in ids]
        pgid = system.procs["wa"].pid
        time.sleep(3)
        rss0, main0, cpu0 = faultkit.group_rss_mb(pgid), faultkit.group_rss_mb(pgid, pgid), faultkit.group_cpu_s(pgid)
        t = time.monotonic()
        publish_batch(get_app(), runs)
        client = redis.Redis.from_url(broker)
        while faultkit.broker_depth(client) > 0:
            time.sleep(0.2)
        time.sleep(2)
        print(json.dumps({
            "stale_messages": args.messages, "max_tasks_per_child": args.max_tasks_per_child,
            "worker_rss_mb": f"{rss0:.0f}->{faultkit.group_rss_mb(pgid):.0f}",
            "main_process_mb": f"{main0:.0f}->{faultkit.group_rss_mb(pgid, pgid):.0f}",
            "cpu_ms_per_skip": round(1000 * (faultkit.group_cpu_s(pgid) - cpu0) / args.messages, 2),
            "seconds": round(time.monotonic() - t, 1),
            "attempt_rows": db.one("SELECT count(*) FROM cron_at_scale_jobattempt"),
        }))
    finally:
        system.stop_all()
        db.close()


if __name__ == "__main__":
    main()
