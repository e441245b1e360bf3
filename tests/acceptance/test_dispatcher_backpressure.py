"""One stuck queue delays no other: real ``celery worker`` and ``cron_dispatcher`` processes, two
queues, one consumed and one not, on Redis and on RabbitMQ (``CELERY_RABBITMQ_URL``, else the local
default vhost; skipped when no RabbitMQ answers). The consumed queue's jobs run on time; the other's
stay pending with no attempt (not re-fired into the dead queue every dispatch lease) and all run
once a worker for it starts."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from demo.runner import PROJECT_DIR, Processes, child_env, database_url
from helpers import RABBIT_URL, rabbit_unreachable, sql, wait_until
from kombu import Connection

import cron_at_scale

pytestmark = pytest.mark.acceptance

LEASE = 4.0  # a short dispatch lease: a re-fire into the dead queue would show within the test
SETTINGS = {"DISPATCH_LEASE": LEASE, "LOOKAHEAD": 0.5, "WORKER_HEARTBEAT_INTERVAL": 1.0,
            "HOLD_UNCONSUMED_QUEUES": True}
N = 20




def drop_queues(url: str, names: list[str]) -> None:
    with Connection(url) as conn:
        for name in names:
            for verb in ("queue_purge", "queue_delete"):  # Redis: purge drops the list; RabbitMQ: delete
                try:
                    getattr(conn.channel(), verb)(name)
                except Exception:  # noqa: BLE001 (absent: fine)
                    pass


def counts(queue: str) -> dict[str, int]:
    return dict(sql("SELECT status, count(*) FROM cron_at_scale_job WHERE queue = %s GROUP BY 1", [queue]))


def cron_status(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "manage.py", "cron_status", "--json"], cwd=PROJECT_DIR, env=env,
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["redis", "rabbitmq"])
def test_a_queue_without_consumers_holds_its_jobs_and_delays_no_other(kind, transactional_db, tmp_path):
    from django.conf import settings
    from django.db import connection

    if kind == "rabbitmq" and rabbit_unreachable():
        pytest.skip(rabbit_unreachable())
    url = settings.CELERY_BROKER_URL if kind == "redis" else RABBIT_URL
    live, dead = f"cas_live_{kind}", f"cas_dead_{kind}"
    drop_queues(url, [live, dead])
    env = child_env(database_url(connection.settings_dict), url, CRON_AT_SCALE_SETTINGS=json.dumps(SETTINGS))
    procs = Processes(env, log_dir=tmp_path / "logs")
    try:
        procs.worker("live", concurrency=2, extra=["-Q", live])
        wait_until(lambda: sql("SELECT count(*) FROM cron_at_scale_workerhealth WHERE queues ? %s", [live])[0][0],
                   timeout=60, what="the worker's health row")
        procs.dispatcher("d1")
        t0 = time.monotonic()
        for _ in range(N):
            cron_at_scale.schedule("demo.tasks.record", queue=live, countdown=2)
            cron_at_scale.schedule("demo.tasks.record", queue=dead, countdown=2)
        cron_at_scale.schedule("demo.tasks.record", queue=dead, every=1)  # a beat-like schedule

        # The consumed queue's jobs all run, on time.
        wait_until(lambda: counts(live).get("completed") == N, timeout=60, what="the live queue's jobs")
        lags = [r[0] for r in sql(
            "SELECT extract(epoch FROM a.started_at - a.scheduled_at) FROM cron_at_scale_jobattempt a "
            "JOIN cron_at_scale_job j ON j.id = a.job_id WHERE j.queue = %s", [live])]
        print(f"[{kind}] live queue: {N} jobs done {time.monotonic() - t0:.1f} s after scheduling; "
              f"lag max {max(lags):.2f} s")
        assert max(lags) < 10.0, lags

        # The dead queue's jobs wait in the database, without attempts, over several leases.
        time.sleep(3 * LEASE)
        dead_attempts = sql("SELECT count(*) FROM cron_at_scale_jobattempt a JOIN cron_at_scale_job j "
                            "ON j.id = a.job_id WHERE j.queue = %s", [dead])[0][0]
        print(f"[{kind}] dead queue after {3 * LEASE:.0f} s: {counts(dead)}, {dead_attempts} attempts")
        assert counts(dead) == {"pending": N + 1}
        assert dead_attempts == 0, "jobs were fired into a queue nobody consumes"
        shown = {q["queue"]: q for q in cron_status(env)["queues"]}
        assert shown[dead]["state"] == "no consumer" and shown[dead]["held"], shown
        assert shown[live]["state"] == "ok" and not shown[live]["held"] and shown[live]["consumers"] >= 1, shown
        assert shown[dead]["depth"] == 0, shown

        # A worker for it comes: everything waiting runs.
        procs.worker("dead", concurrency=2, extra=["-Q", dead])
        wait_until(lambda: counts(dead).get("completed") == N, timeout=60, what="the dead queue's jobs")
        wait_until(lambda: sql("SELECT count(*) FROM cron_at_scale_jobattempt a JOIN cron_at_scale_job j "
                               "ON j.id = a.job_id WHERE j.queue = %s AND j.schedule_type <> 'once' "
                               "AND a.outcome = 'succeeded'", [dead])[0][0] >= 1,
                   timeout=30, what="the recurring job's runs")
        lost = sql("SELECT count(*) FROM cron_at_scale_jobattempt WHERE outcome = 'lost'")[0][0]
        assert lost == 0, f"{lost} attempts lost"
    finally:
        procs.stop()
        drop_queues(url, [live, dead])
