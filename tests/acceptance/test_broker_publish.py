"""The Redis fast publish path: byte-for-byte Celery's messages, executed by a real worker."""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from celery import Celery
from demo.models import Execution
from demo.runner import Processes, child_env, database_url, wait_for_workers
from django.db import connection
from helpers import sql, wait_until

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
    # argsrepr/kwargsrepr as Celery's saferepr writes them: long, quoted, deeply nested
    {"args": ["x" * 3000], "kwargs": {"note": "it's \\ \"quoted\""}},
    {"args": [[[[[[[1]]]]]]], "kwargs": {"deep": {"a": {"b": {"c": {"d": [1, 2]}}}}}},
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
    publisher = Publisher(system.app)
    assert publisher.fast
    try:
        publisher.publish(batch)
    finally:
        publisher.close()  # its broker connection, else a socket left to the garbage collector
    system.worker("w1", concurrency=2, extra=["-Q", "celery,reports"])
    wait_for_workers(system.app, ["w1"])
    wait_until(lambda: Job.objects.filter(status="completed").count() == 60, what="60 jobs run from fast-path messages")
    assert Execution.objects.count() == 60
    assert set(Execution.objects.values_list("attempt", flat=True)) == {1}


# Kombu's general publish path on brokers other than Redis and RabbitMQ, run by a real worker.
#
# The dispatcher's fast paths are for Redis and RabbitMQ; every other kombu transport takes
# Celery's own ``send_task`` (in ``Producer.batch()``), runs held before their fire_at with
# Celery's ``eta`` (``ETA_LEAD``). Two transports that run on this machine:
#
# * ``filesystem://``: kombu's folder-based transport, shared by processes of one machine;
# * ``sqs://``: Amazon SQS's protocol, served by ``moto_server`` (the ``dev`` extra: moto[server],
#   boto3, and pycurl, which kombu's SQS consumer needs). Skipped, with the reason, when those
#   are not installed.


def app_for(url: str, options: dict) -> Celery:
    """The test settings' Celery configuration with ``url`` as its broker."""
    app = Celery("cas_transport_tests", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    # the CELERY_BROKER_URL variable (the suite's Redis) beats broker_url, not these
    app.conf.broker_write_url = app.conf.broker_read_url = url
    app.conf.broker_transport_options = options
    return app


def fire_and_run(app: Celery, url: str, options: dict, logs: Path) -> None:
    """Ten runs due now and ten within the look-ahead (published a second early, with their eta),
    fired by an in-process dispatcher through kombu's general path; one real worker runs them
    all once, none before its fire_at."""
    cron_at_scale.schedule_many([{"task": "demo.tasks.record", "args": [i]} for i in range(10)])
    procs = Processes(child_env(database_url(connection.settings_dict), url,
                                CELERY_BROKER_TRANSPORT_OPTIONS=json.dumps(options)), log_dir=logs)
    try:
        procs.worker("w", concurrency=2)
        wait_until(lambda: sql("SELECT count(*) FROM cron_at_scale_workerhealth")[0][0] > 0, timeout=60,
                   what="the worker to start")
        cron_at_scale.schedule_many([{"task": "demo.tasks.record", "args": [i], "countdown": 2 + (i - 10) * 0.1}
                                     for i in range(10, 20)])
        d = Dispatcher(name="t", app=app, shards="all", lookahead=3.0, eta_lead=1.0)
        assert d.publisher.kind is None  # kombu's general path
        d.run(max_seconds=5)  # claims and publishes all twenty (the last is due ~3 s from now)
        assert d.published_total == 20
        wait_until(lambda: Execution.objects.count() >= 20, timeout=120, what="20 runs")
    finally:
        procs.stop()
    rows = sql("""SELECT a.attempt, a.started_at >= a.scheduled_at, a.dispatched_at < a.scheduled_at
                  FROM cron_at_scale_jobattempt a JOIN demo_execution x ON x.job_id = a.job_id AND x.attempt = a.attempt""")
    assert len(rows) == 20 and {r[0] for r in rows} == {1}  # each ran once
    assert all(r[1] for r in rows)  # none before its fire_at (database clock)
    assert sum(r[2] for r in rows) == 10  # the ten within the look-ahead went out early, with their eta


def test_the_general_path_fires_through_kombus_filesystem_transport(transactional_db, tmp_path):
    folder = tmp_path / "broker"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
    app = app_for("filesystem://", options)
    fire_and_run(app, "filesystem://", options, tmp_path / "logs")


def sqs_missing() -> str | None:
    """Why the SQS test cannot run here, or None."""
    missing = [m for m in ("moto", "boto3", "pycurl") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{', '.join(missing)} not installed (pip install -e '.[dev]'): kombu's SQS transport needs them"
    if shutil.which("moto_server", path=str(Path(sys.executable).parent)) is None:
        return "moto_server not found beside this Python"
    return None


@pytest.fixture
def sqs_server(tmp_path):
    """A local SQS-protocol server (moto_server) on a free port; its URL."""
    if sqs_missing():
        pytest.skip(sqs_missing())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(tmp_path / "moto.log", "wb") as out:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError as e:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto_server did not start: " + (tmp_path / "moto.log").read_text()[-2000:]) from e
                time.sleep(0.1)
        yield f"sqs://testing:testing@127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_general_path_fires_through_kombus_sqs_transport(transactional_db, sqs_server, tmp_path, monkeypatch):
    options = {"region": "us-east-1", "wait_time_seconds": 1, "polling_interval": 0.2}
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    app = app_for(sqs_server, options)
    fire_and_run(app, sqs_server, options, tmp_path / "logs")
