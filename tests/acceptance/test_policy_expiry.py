"""``expires`` with real processes: a per-second job whose workers stop for 10 s builds no backlog of
stale runs. Executions are counted in a ledger file, outside the jobs' database."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta

import pytest
from demo.runner import wait_for_workers
from helpers import wait_until

import cron_at_scale
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.acceptance


def ledger(path) -> list[tuple[str, int]]:
    if not path.exists():
        return []
    return [(job, int(attempt)) for job, attempt, _pid, _t in (line.split() for line in path.read_text().splitlines())]


def test_runs_queued_past_their_expiry_while_workers_are_down_are_skipped_not_run(system, tmp_path):
    # Without holding the unconsumed queue, the dispatcher keeps publishing into the broker while no
    # worker runs (as celery beat does; as a queue whose workers are alive but stalled gets).
    system.env = {**system.env, "CRON_AT_SCALE_SETTINGS": json.dumps({"HOLD_UNCONSUMED_QUEUES": False})}
    path = tmp_path / "ledger.txt"
    w1 = system.worker("w1", concurrency=2)
    system.dispatcher("d1")
    wait_for_workers(system.app, ["w1"])
    job = cron_at_scale.schedule("demo.tasks.ledger", args=[str(path)], every=1, overlap="allow", expires=1)
    wait_until(lambda: len(ledger(path)) >= 3, timeout=30, what="three runs")

    # warm shutdown (to the main process only: it lets the running task end); its unacknowledged
    # messages go back to the queue
    os.kill(w1.pid, signal.SIGTERM)
    w1.wait(timeout=30)
    ran_before = len(ledger(path))
    time.sleep(10)
    queued = JobAttempt.objects.filter(job_id=job.id, outcome="dispatched").count()
    assert queued >= 8, "the runs of the 10 s outage wait in the broker"
    system.worker("w2", concurrency=2)
    wait_for_workers(system.app, ["w2"])
    wait_until(lambda: len(ledger(path)) >= ran_before + 3, timeout=30, what="three runs after the restart")
    assert cron_at_scale.cancel(job.id)
    time.sleep(1.5)  # the last runs' completions are written a few ms after them
    system.stop()

    ran = ledger(path)
    assert len(ran) == len(set(ran)), "no attempt ran twice"
    attempts = {a.attempt: a for a in JobAttempt.objects.filter(job_id=job.id)}
    for _job, n in ran:
        a = attempts[n]
        assert a.outcome in ("succeeded", "cancelled") and a.started_at is not None
        assert a.started_at - a.scheduled_at <= timedelta(seconds=1), f"attempt {n} ran past its expiry"
    expired = [a for a in attempts.values() if a.error.startswith("expired: not started within 1 s")]
    assert all(a.outcome == "skipped" for a in expired)
    assert len(expired) >= queued - 2  # the outage's runs (the last one or two may still have been fresh)
    assert Job.objects.get(id=job.id).expired_runs == len(expired)
    assert not {n for _j, n in ran} & {a.attempt for a in expired}, "an expired run executed"


def test_the_broker_message_carries_no_celery_expires(broker, transactional_db):
    """Expiry is judged by the start statement on the database clock. With Celery's own ``expires``
    in the message a worker would drop it by its own clock before the attempt log heard of it: the
    attempt would be reaped as lost and fired again, instead of recorded skipped."""
    from cron_at_scale.broker.publish import Publisher
    from cron_at_scale.dispatcher import Dispatcher

    conn = broker.connection_for_write()
    if conn.transport.driver_type != "redis":
        conn.release()
        pytest.skip("reads the message from a Redis list")
    client = conn.default_channel.client
    job = cron_at_scale.schedule("demo.tasks.record", expires=30)
    batch = Dispatcher(name="t").claim()
    publisher = Publisher(broker)
    try:
        publisher._send_tasks(batch)  # kombu's own path
        publisher.publish(batch)  # the fast path
        messages = [json.loads(m) for m in client.lrange("celery", 0, -1)]
    finally:
        client.delete("celery")
        publisher.close()
        conn.release()
    assert len(messages) == 2
    for m in messages:
        assert m["headers"]["id"] == f"{job.id}:1"
        assert m["headers"]["expires"] is None
