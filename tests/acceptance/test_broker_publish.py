"""The Redis fast publish path: byte-for-byte Celery's messages, executed by a real worker."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from demo.models import Execution
from demo.runner import wait_for_workers
from helpers import wait_until

import cron_at_scale
from cron_at_scale.broker.publish import Publisher
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job

pytestmark = pytest.mark.acceptance


def redis_client(app):
    conn = app.connection_for_write()
    if conn.transport.driver_type != "redis":
        pytest.skip("the fast path is for a Redis broker")
    return conn, conn.default_channel.client


def drain(client, key):
    raw = client.lrange(key, 0, -1)
    client.delete(key)
    return [json.loads(m) for m in reversed(raw)]  # LPUSH: oldest last


@pytest.mark.parametrize("spec", [
    {},
    {"args": [1, "two", None], "kwargs": {"x": [1.5, {"y": True}]}},
    {"priority": 7},
    {"queue": "reports"},
    {"countdown": 5, "eta": True},  # published ETA_LEAD ahead: send_task(..., eta=fire_at)'s message
    {"countdown": 5, "eta": True, "priority": 3, "queue": "reports"},
])
def test_fast_path_messages_equal_send_task_messages(broker, transactional_db, spec):
    conn, client = redis_client(broker)
    spec = dict(spec)
    eta = spec.pop("eta", False)
    job = cron_at_scale.schedule("demo.tasks.record", **spec)
    batch = Dispatcher(name="t", lookahead=10).claim()
    if eta:
        batch = [replace(c, eta=c.fire_at) for c in batch]
    publisher = Publisher(broker)
    queue = spec.get("queue", "celery")
    publisher._send_tasks(batch)  # kombu's own path first: the list it chose (a priority has its own)
    (key,) = [k for k in client.scan_iter(match=f"{queue}*") if client.type(k) == b"list" and client.llen(k)]
    slow = drain(client, key)
    publisher.publish(batch)
    fast = drain(client, key)
    publisher.close()
    conn.release()
    assert len(fast) == len(slow) == 1
    fast, slow = fast[0], slow[0]
    for message in (fast, slow):
        message["properties"].pop("delivery_tag")
    for part in ("headers", "properties"):
        keys = set(fast[part]) | set(slow[part])
        assert {k: (fast[part].get(k), slow[part].get(k)) for k in keys if fast[part].get(k) != slow[part].get(k)} == {}
    assert fast == slow
    assert fast["headers"]["id"] == f"{job.id}:1"
    assert fast["headers"]["cron_at_scale"]["job_id"] == str(job.id)
    assert fast["headers"]["eta"] == (job.fire_at.isoformat() if eta else None)


def test_fast_path_messages_run_on_a_real_worker(system):
    jobs = [cron_at_scale.schedule("demo.tasks.record", args=[i], priority=i % 10) for i in range(50)]
    jobs += [cron_at_scale.schedule("demo.tasks.record", queue="reports") for _ in range(10)]
    batch = Dispatcher(name="t").claim()
    assert len(batch) == 60
    assert Publisher(system.app).fast
    Publisher(system.app).publish(batch)
    system.worker("w1", concurrency=2, extra=["-Q", "celery,reports"])
    wait_for_workers(system.app, ["w1"])
    wait_until(lambda: Job.objects.filter(status="completed").count() == 60, what="60 jobs run from fast-path messages")
    assert Execution.objects.count() == 60
    assert set(Execution.objects.values_list("attempt", flat=True)) == {1}
