"""The RabbitMQ fast publish path: Celery's messages field by field, run by a real worker, and
publisher confirms (a message the broker did not take is not sent: the run stays for the reaper).

RabbitMQ: ``CELERY_RABBITMQ_URL`` (``.ci/run`` sets it when it has a RabbitMQ), else the local
default vhost; the tests are skipped only when no RabbitMQ answers there.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import replace
from urllib.parse import urlsplit

import pytest
from celery import Celery
from demo.models import Execution
from demo.runner import Processes, child_env, database_url, wait_for_workers
from helpers import RABBIT_URL, rabbit_unreachable, sql, wait_until
from kombu import Exchange, Queue

import cron_at_scale
from cron_at_scale.broker.amqp import NotConfirmed
from cron_at_scale.broker.publish import Publisher
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt

pytestmark = pytest.mark.acceptance

QUEUES = ("celery", "reports", "cas_topical", "cas_bound", "cas_capped")
BIG = "b" * 60_000  # near MAX_PAYLOAD_BYTES (a body longer than a frame: tests/unit/test_broker_amqp_frames.py)
TOPIC = Exchange("cas_topic", type="topic")
DIRECT = Exchange("cas_direct", type="direct")


def rabbit_app(url: str = RABBIT_URL) -> Celery:
    """The test settings' Celery configuration with RabbitMQ as its broker, and routes through
    custom exchanges: a topic exchange, an explicit exchange + routing key, a capped queue."""
    app = Celery("cas_rabbit_tests", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    # the CELERY_BROKER_URL variable (the suite's Redis) beats broker_url, not these
    app.conf.broker_write_url = app.conf.broker_read_url = url
    app.conf.task_queues = [
        Queue("celery"), Queue("reports"),
        Queue("cas_topical", TOPIC, routing_key="cas.#"),
        Queue("cas_bound", DIRECT, routing_key="bound"),
        Queue("cas_capped", queue_arguments={"x-max-length": 2, "x-overflow": "reject-publish"}),
    ]
    app.conf.task_routes = {
        "demo.tasks.noop": {"queue": "cas_topical", "routing_key": "cas.noop"},
        "demo.tasks.sleep": {"exchange": "cas_direct", "routing_key": "bound"},
        "demo.tasks.flaky": {"exchange": "cas_direct", "routing_key": "nowhere"},  # bound to no queue
        "demo.tasks.fail": {"exchange": "cas_missing", "routing_key": "x"},  # an exchange nobody declared
    }
    return app


def purge(app: Celery) -> None:
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for q in app.conf.task_queues:
            q(channel).declare()
            channel.queue_purge(q.name)




@pytest.fixture
def rabbit():
    """A Celery app whose broker is RabbitMQ, its queues declared and empty."""
    if rabbit_unreachable():
        pytest.skip(rabbit_unreachable())
    app = rabbit_app()
    purge(app)
    yield app
    purge(app)
    with app.connection_for_write() as conn:  # the capped queue is re-declared per test
        conn.default_channel.queue_delete("cas_capped")


def get(app: Celery, queue: str):
    """The next message on ``queue`` as a worker receives it (None when empty)."""
    with app.connection_for_write() as conn:
        return conn.default_channel.basic_get(queue, no_ack=True)


def wait_for_message(app: Celery, queue: str, timeout: float = 10.0):
    """The next message on ``queue``, waited for up to ``timeout`` seconds (None if none came)."""
    deadline = time.monotonic() + timeout
    while (message := get(app, queue)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return message


def fields(message) -> dict:
    props = dict(message.properties)
    headers = props.pop("application_headers")
    info = {k: message.delivery_info[k] for k in ("exchange", "routing_key", "redelivered")}
    return {"body": message.body, "headers": headers, "properties": props, "delivery_info": info}


@pytest.mark.parametrize(("spec", "queue"), [
    ({}, "celery"),
    ({"args": [1, "two", None], "kwargs": {"x": [1.5, {"y": True}]}}, "celery"),
    ({"priority": 7}, "celery"),
    ({"queue": "reports"}, "reports"),
    ({"task": "demo.tasks.noop"}, "cas_topical"),  # task_routes: a topic exchange and routing key
    ({"task": "demo.tasks.sleep", "args": [0.1]}, "cas_bound"),  # task_routes: exchange + routing key
    ({"args": [BIG], "kwargs": {"k": "ü"}}, "celery"),  # saferepr cuts a long argsrepr its own way
    ({"args": ["it's", 'a "b"', "c\\d"], "kwargs": {"deep": [[[[[1]]]]]}}, "celery"),  # and quotes, nests
    ({"countdown": 5, "eta": True}, "celery"),  # published ETA_LEAD ahead: send_task(..., eta=fire_at)'s message
    ({"task": "demo.tasks.noop", "countdown": 5, "eta": True}, "cas_topical"),
])
def test_amqp_fast_path_messages_equal_send_task_messages(rabbit, transactional_db, spec, queue):
    spec = dict(spec)
    eta = spec.pop("eta", False)
    job = cron_at_scale.schedule(spec.pop("task", "demo.tasks.record"), **spec)
    batch = Dispatcher(name="t", app=rabbit, lookahead=10).claim()
    if eta:
        batch = [replace(c, eta=c.fire_at) for c in batch]
    publisher = Publisher(rabbit)
    assert publisher.kind == "amqp"
    publisher.publish(batch)
    fast = get(rabbit, queue)
    publisher._send_tasks(batch)  # send_task does not wait for a confirm: wait for the message
    slow = wait_for_message(rabbit, queue)
    publisher.close()
    assert fast is not None and slow is not None
    assert get(rabbit, queue) is None
    fast, slow = fields(fast), fields(slow)
    for part in ("headers", "properties", "delivery_info"):
        keys = set(fast[part]) | set(slow[part])
        assert {k: (fast[part].get(k), slow[part].get(k)) for k in keys if fast[part].get(k) != slow[part].get(k)} == {}
    assert fast == slow
    assert fast["headers"]["id"] == f"{job.id}:1"
    assert fast["headers"]["cron_at_scale"]["job_id"] == str(job.id)
    assert fast["properties"]["priority"] == spec.get("priority", 0)
    assert fast["properties"]["delivery_mode"] == 2
    assert fast["headers"]["eta"] == (job.fire_at.isoformat() if eta else None)


def test_amqp_fast_path_messages_to_a_quorum_queue_equal_send_task_messages(rabbit, transactional_db):
    app = rabbit_app()
    app.conf.task_queues = [Queue("cas_quorum", queue_arguments={"x-queue-type": "quorum"})]
    purge(app)
    cron_at_scale.schedule_many([{"task": "demo.tasks.record", "args": [i], "queue": "cas_quorum"} for i in range(3)])
    batch = Dispatcher(name="t", app=app).claim()
    publisher = Publisher(app)
    assert publisher.publish(batch) == 3
    fast = [fields(get(app, "cas_quorum")) for _ in batch]
    publisher._send_tasks(batch)
    slow = [fields(wait_for_message(app, "cas_quorum")) for _ in batch]
    publisher.close()
    assert fast == slow
    assert [m["headers"]["cron_at_scale"]["job_id"] for m in fast] == [str(c.job_id) for c in batch]


@pytest.mark.parametrize("where", ["task_default_delivery_mode", "task_routes"])
def test_amqp_fast_path_keeps_celerys_transient_delivery_mode(rabbit, transactional_db, where):
    app = rabbit_app()
    if where == "task_default_delivery_mode":
        app.conf.task_default_delivery_mode = "transient"
    else:
        app.conf.task_routes = {"demo.tasks.record": {"queue": "reports", "delivery_mode": "transient"}}
    queue = "celery" if where == "task_default_delivery_mode" else "reports"
    cron_at_scale.schedule("demo.tasks.record", args=[1])
    batch = Dispatcher(name="t", app=app).claim()
    publisher = Publisher(app)
    assert publisher.publish(batch) == 1
    fast = get(app, queue)
    publisher._send_tasks(batch)
    slow = wait_for_message(app, queue)
    publisher.close()
    assert fast is not None and slow is not None
    fast, slow = fields(fast), fields(slow)
    assert fast == slow
    assert fast["properties"]["delivery_mode"] == 1


@pytest.fixture
def rabbit_system(rabbit, transactional_db, tmp_path):
    """Worker processes whose broker is RabbitMQ (the test database), stopped at the end."""
    from django.db import connection

    procs = Processes(child_env(database_url(connection.settings_dict), RABBIT_URL), log_dir=tmp_path / "logs")
    procs.app = rabbit
    yield procs
    procs.stop()


def test_amqp_fast_path_messages_run_on_a_real_worker(rabbit_system):
    app = rabbit_system.app
    cron_at_scale.schedule_many([{"task": "demo.tasks.record", "args": [i], "priority": i % 10} for i in range(50)])
    cron_at_scale.schedule_many([{"task": "demo.tasks.record", "queue": "reports"} for _ in range(10)])
    cron_at_scale.schedule_many([{"task": "demo.tasks.record", "args": [BIG, i]} for i in range(2)])
    d = Dispatcher(name="t", app=app, shards="all")
    assert d.publisher.kind == "amqp"
    while d.step():
        pass
    d.close()
    assert d.published_total == 62
    rabbit_system.worker("w1", concurrency=2, extra=["-Q", "celery,reports"])
    wait_for_workers(app, ["w1"])
    wait_until(lambda: Job.objects.filter(status="completed").count() == 62, timeout=120,
               what="62 jobs run from RabbitMQ fast-path messages")
    assert Execution.objects.count() == 62
    assert set(Execution.objects.values_list("attempt", flat=True)) == {1}


def test_a_message_routed_to_no_queue_is_not_sent(rabbit, transactional_db):
    with rabbit.connection_for_write() as conn:  # the exchange exists; nothing is bound to "nowhere"
        DIRECT(conn.default_channel).declare()
    cron_at_scale.schedule("demo.tasks.record")
    cron_at_scale.schedule("demo.tasks.flaky")
    batch = Dispatcher(name="t", app=rabbit).claim()
    publisher = Publisher(rabbit)
    with pytest.raises(NotConfirmed, match=r"1 returned .*NO_ROUTE"):
        publisher.publish(batch)
    publisher.close()


def test_a_message_to_an_exchange_that_does_not_exist_is_not_sent(rabbit, transactional_db):
    cron_at_scale.schedule("demo.tasks.fail")
    batch = Dispatcher(name="t", app=rabbit).claim()
    publisher = Publisher(rabbit)
    with pytest.raises(Exception, match="NOT_FOUND - no exchange 'cas_missing'"):
        publisher.publish(batch)
    publisher.close()


def test_a_message_the_broker_nacks_is_not_sent_and_the_reaper_fires_it_again(rabbit, transactional_db):
    d = Dispatcher(name="t", app=rabbit, shards="all")
    d.sender.retry_for = 0.0  # no retries: the failed batch goes straight to the reaper
    for i in range(2):
        cron_at_scale.schedule("demo.tasks.record", args=[i], queue="cas_capped")
    assert d.step() == 2
    assert d.published_total == 2  # the capped queue (x-max-length 2, reject-publish) is full now
    third = cron_at_scale.schedule("demo.tasks.record", args=[2], queue="cas_capped")
    assert d.step() == 1
    assert d.published_total == 2  # nacked: not counted as sent
    assert JobAttempt.objects.get(job_id=third.id).outcome == "dispatched"  # still claimed, leased
    assert Job.objects.get(id=third.id).status == "in_progress"

    with rabbit.connection_for_write() as conn:  # a worker drains the queue; the third run's lease expires
        conn.default_channel.queue_purge("cas_capped")
    sql("UPDATE cron_at_scale_jobattempt SET locked_until = statement_timestamp() - interval '1 second' "
        "WHERE job_id = %s", [third.id])
    assert d.reap() == 1
    assert d.step() == 1
    d.close()
    assert d.published_total == 3
    message = get(rabbit, "cas_capped")
    assert message is not None and message.headers["id"] == f"{third.id}:2"
    assert get(rabbit, "cas_capped") is None


class Pair:
    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.client, self.upstream = client, upstream
        self.port = client.getpeername()[1]
        self.forward: int | None = None  # armed: bytes still to pass
        self.cut = False


class BrokerLostMidBatch:
    """A TCP proxy to RabbitMQ. One connection given to :meth:`arm` passes only the first ``forward``
    bytes its client writes next, swallows the rest and every reply (no confirm comes back), and is
    closed once its client has been silent for ``quiet`` seconds: a broker that died in the middle of
    a batch, after the client had written all of it. Other connections pass everything."""

    def __init__(self, url: str, quiet: float = 0.5):
        u = urlsplit(url)
        self.target = (u.hostname, u.port or 5672)
        self.quiet = quiet
        self.sock = socket.create_server(("127.0.0.1", 0))
        port = self.sock.getsockname()[1]
        self.proxied = u._replace(netloc=f"{u.username}:{u.password}@127.0.0.1:{port}").geturl()
        self.pairs: list[Pair] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, client_port: int, forward: int) -> None:
        """Cut the connection whose client's local port is ``client_port`` after ``forward`` more bytes."""
        (pair,) = [p for p in self.pairs if p.port == client_port]
        pair.forward = forward

    @property
    def cuts(self) -> int:
        return sum(p.cut for p in self.pairs)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            pair = Pair(client, socket.create_connection(self.target))
            self.pairs.append(pair)
            threading.Thread(target=self._up, args=(pair,), daemon=True).start()
            threading.Thread(target=self._down, args=(pair,), daemon=True).start()

    def _up(self, pair: Pair) -> None:
        try:
            while True:
                if pair.forward is not None:
                    pair.client.settimeout(self.quiet)
                try:
                    data = pair.client.recv(65536)
                except TimeoutError:  # armed, and the client wrote its batch: the broker dies now
                    pair.cut = True
                    break
                if not data:
                    break
                if pair.forward is not None:
                    data, pair.forward = data[:pair.forward], max(0, pair.forward - len(data))
                if data:
                    pair.upstream.sendall(data)
        except OSError:
            pass
        self._close(pair)

    def _down(self, pair: Pair) -> None:
        try:
            while data := pair.upstream.recv(65536):
                if pair.forward is None:  # armed: the broker's replies (its confirms) never arrive
                    pair.client.sendall(data)
        except OSError:
            pass
        self._close(pair)

    @staticmethod
    def _close(pair: Pair) -> None:
        for s in (pair.client, pair.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.sock.close()
        for pair in self.pairs:
            self._close(pair)


def on_queue(app: Celery, queue: str) -> list[str]:
    """The task ids of every message on ``queue``, taken off it."""
    ids = []
    while (message := get(app, queue)) is not None:
        ids.append(message.headers["id"])
    return ids


def test_a_broker_lost_mid_batch_counts_nothing_unconfirmed_and_the_batch_is_sent_again(rabbit, transactional_db):
    link = BrokerLostMidBatch(RABBIT_URL)
    app = rabbit_app(link.proxied)
    d = Dispatcher(name="t", app=app, shards="all")
    try:
        cron_at_scale.schedule("demo.tasks.record")
        assert d.step() == 1 and d.published_total == 1  # connected: channel in confirm mode, queue declared
        assert len(on_queue(rabbit, "celery")) == 1
        jobs = cron_at_scale.schedule_many([{"task": "demo.tasks.record", "args": [i]} for i in range(200)])
        sock = d.publisher.conn.connection.sock  # the publisher's connection (py-amqp's socket)
        link.arm(sock.getsockname()[1], forward=40_000)  # the broker takes ~25 of the 200, confirms none, goes
        assert d.step() == 200
        assert link.cuts == 1
        # Counted only once confirmed: the publisher reconnected and sent the whole batch again.
        assert d.published_total == 201
    finally:
        d.close()
        link.close()
    ids = on_queue(rabbit, "celery")
    assert {f"{j.id}:1" for j in jobs} <= set(ids)  # every run is on the broker, none lost
    assert 200 < len(ids) < 400  # the part the broker took before it went, and the batch sent again
