"""The RabbitMQ fast path's frames (cron_at_scale.broker.amqp_frames, AmqpPublisher.publish) are byte
for byte what py-amqp writes for the same message: ``basic_publish`` of the message kombu's
``prepare_message`` builds (an ``amqp.Message``), through py-amqp's own frame writer.

The broker is a stand-in here (what is written is captured; every publish is acked); the
acceptance tests (tests/acceptance/test_broker_amqp.py) send the same messages to a real RabbitMQ,
compare them field by field with ``send_task``'s and run them on a real worker.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import amqp
import pytest
from amqp import spec
from amqp.method_framing import frame_writer
from amqp.serialization import dumps
from celery import Celery
from celery.utils.saferepr import saferepr

from cron_at_scale.broker import amqp_frames
from cron_at_scale.broker.amqp import AmqpPublisher, NotConfirmed
from cron_at_scale.broker.message import EMBED, HEADER, REPR_MAX, header
from cron_at_scale.dispatcher.claimed import Claimed
from cron_at_scale.models import task_id_for

FIRE_AT = datetime(2026, 3, 29, 1, 30, 15, 123456, tzinfo=timezone.utc)


class Transport:
    def __init__(self):
        self.written: list[bytes] = []

    def write(self, s) -> None:
        self.written.append(bytes(s))  # py-amqp hands a view of a buffer it reuses

    @contextmanager
    def having_timeout(self, timeout):
        yield


class AmqpConnection:
    """What a py-amqp Connection offers the publisher (and py-amqp's frame writer)."""

    def __init__(self, frame_max: int):
        self.frame_max = frame_max
        self.bytes_sent = 0
        self.transport = Transport()


class Channel:
    def __init__(self, channel_id: int):
        self.channel_id = channel_id
        self.events: dict = defaultdict(set)

    def confirm_select(self) -> None:
        pass


class Connection:
    """A kombu Connection stand-in: the broker acks every publish (``nack``: nacks them instead)."""

    def __init__(self, frame_max: int = 131072, channel_id: int = 3, nack: bool = False):
        self.connection = AmqpConnection(frame_max)
        self.chan = Channel(channel_id)
        self.nack = nack
        self.publisher: AmqpPublisher | None = None

    def channel(self) -> Channel:
        return self.chan

    def drain_events(self, timeout=None) -> None:
        assert self.publisher is not None and self.publisher.confirms is not None
        tag = self.publisher.confirms.next_tag - 1
        for callback in self.chan.events["basic_nack" if self.nack else "basic_ack"]:
            callback(tag, True)


def app() -> Celery:
    a = Celery("frames", set_as_current=False)
    a.conf.broker_url = "amqp://guest:guest@127.0.0.1:5672//"  # never connected to
    a.conf.task_routes = {"demo.tasks.sleep": {"queue": "reports"}}
    return a


def run(i: int = 0, task: str = "demo.tasks.record", payload: dict | None = None, **kw) -> Claimed:
    return Claimed(kw.pop("job_id", uuid.UUID(int=i + 1)), kw.pop("attempt", 1), FIRE_AT, "once", "", "", task,
                   {"args": [i], "kwargs": {}} if payload is None else payload, kw.pop("queue", ""),
                   kw.pop("options", {}), **kw)


def publisher_for(application: Celery, connection: Connection) -> AmqpPublisher:
    p = AmqpPublisher(application, "gen42@host")
    p._declared.update({"celery", "reports"})  # the stand-in broker declares nothing
    connection.publisher = p
    return p


def py_amqp_frames(application: Celery, connection: Connection, batch: list[Claimed]) -> bytes:
    """What py-amqp writes for ``batch``: kombu's pyamqp ``prepare_message`` (an ``amqp.Message`` of
    these properties) and ``basic_publish`` (method ``Bssbb``, then the content) per message, with
    Celery's protocol 2 headers as a dict (``cron_at_scale.broker.amqp`` before it encoded them)."""
    conn = AmqpConnection(connection.connection.frame_max)
    write = frame_writer(conn, conn.transport)
    for c in batch:
        args, kwargs = c.payload.get("args", []), c.payload.get("kwargs", {})
        task_id = task_id_for(c.job_id, c.attempt)
        headers = {
            "lang": "py", "task": c.task, "id": task_id, "shadow": None,
            "eta": None if c.eta is None else c.eta.isoformat(), "expires": None,
            "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
            "root_id": task_id, "parent_id": None, "argsrepr": saferepr(args or (), REPR_MAX, maxlevels=3),
            "kwargsrepr": saferepr(kwargs, REPR_MAX, maxlevels=3), "origin": "gen42@host", "ignore_result": None,
            "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {}, HEADER: header(c),
        }
        queue = "reports" if c.task == "demo.tasks.sleep" else (c.queue or "celery")
        message = amqp.Message(json.dumps([args, kwargs, EMBED]).encode(),
                               priority=(c.options or {}).get("priority") or 0,
                               content_type="application/json", content_encoding="utf-8",
                               application_headers=headers,
                               correlation_id=task_id, reply_to=application.thread_oid, delivery_mode=2)
        write(1, connection.chan.channel_id, spec.Basic.Publish, dumps("Bssbb", (0, "", queue, True, False)),
              message)
    return b"".join(conn.transport.written)


BATCHES = {
    "plain": [run(i) for i in range(5)],
    "unicode, nested and rare types": [
        run(0, payload={"args": ["zß→😀", None, True, 1.5, [1, {"a": None}]],
                        "kwargs": {"k": {"n": 2**40, "neg": -(2**31)}}}),
        run(1, payload={}),
    ],
    "a priority, a queue, a routed task": [
        run(0, options={"priority": 9}), run(1, queue="reports"), run(2, task="demo.tasks.sleep"),
    ],
    "ETA_LEAD ahead and a recurring occurrence": [
        run(0, eta=FIRE_AT), run(1, occurrence=FIRE_AT - timedelta(seconds=3)),
    ],
    "attempts past 32 bits and long reprs": [
        run(0, attempt=2**31), run(1, attempt=2**31 - 1),
        run(2, payload={"args": ["x" * 3000], "kwargs": {"y": "z" * 3000}}),
    ],
    "reprs saferepr writes its own way": [
        run(0, payload={"args": ["it's", 'a "b"', "c\\d", "e\nf"], "kwargs": {"deep": [[[[[1]]]]]}}),
    ],
}


@pytest.mark.parametrize("name", list(BATCHES))
def test_a_batch_is_written_in_one_write_byte_for_byte_as_py_amqp_writes_it(name):
    application, connection = app(), Connection()
    batch = BATCHES[name]
    publisher = publisher_for(application, connection)
    assert publisher.publish(connection, batch) == []
    assert len(connection.connection.transport.written) == 1
    assert connection.connection.transport.written[0] == py_amqp_frames(application, connection, batch)
    assert publisher.confirms is not None and publisher.confirms.next_tag == len(batch) + 1


def test_a_body_larger_than_a_frame_is_split_as_py_amqp_splits_it():
    application, connection = app(), Connection(frame_max=4096)
    batch = [run(0, payload={"args": ["b" * 10_000], "kwargs": {}}), run(1)]
    publisher = publisher_for(application, connection)
    publisher.publish(connection, batch)
    written = connection.connection.transport.written[0]
    assert written == py_amqp_frames(application, connection, batch)
    assert written.count(b"\x03\x00\x03") >= 3  # the first message's body: three frames


def test_properties_larger_than_a_frame_fail_the_batch_before_anything_is_written():
    application, connection = app(), Connection(frame_max=2048)  # two 1,024-character reprs do not fit
    publisher = publisher_for(application, connection)
    batch = [run(0), run(1, payload={"args": ["x" * 3000], "kwargs": {"y": "z" * 3000}})]
    with pytest.raises(ValueError, match="properties of task .* more than a frame"):
        publisher.publish(connection, batch)
    assert connection.connection.transport.written == []


def test_a_batch_the_broker_nacks_fails_after_it_was_written():
    application, connection = app(), Connection(nack=True)
    publisher = publisher_for(application, connection)
    with pytest.raises(NotConfirmed, match="3 messages nacked"):
        publisher.publish(connection, [run(i) for i in range(3)])
    assert len(connection.connection.transport.written) == 1


@pytest.mark.parametrize("value", [
    "", "plain", "zß→😀", "\udcff", None, True, False, 0, 1, -1, 2147483647, -2147483647, -2147483648,
    2147483648, 2**62, 1.5, [], [None, [1, "a"]], (1, 2), {}, {"a": {"b": [None, {"c": 1}]}},
])
def test_each_value_is_encoded_as_py_amqp_encodes_it(value):
    assert amqp_frames.table({"k": value}) == dumps("F", [{"k": value}])


def test_a_headers_template_encodes_the_table_py_amqp_encodes():
    constant = {"a": 1, "id": None, "b": [None, None], "c": "x", "eta": None, "d": {}}
    template = amqp_frames.HeadersTemplate(constant, varying=("id", "eta"), extra=("extra",))
    assert template.keys == ["id", "eta", "extra"]
    values = ("an-id", "2026-01-01T00:00:00+00:00", {"job_id": "j", "attempt": 3})
    expected = {**constant, "id": values[0], "eta": values[1], "extra": values[2]}
    assert template.encode(values) == dumps("F", [expected])


@pytest.mark.parametrize(("exchange_type", "eta", "fast"), [
    ("topic", True, False),  # send_task routes it through Celery's native delayed delivery
    ("topic", False, True),
    ("direct", True, True),  # send_task sends it as it is (and warns)
])
def test_with_quorum_queues_a_run_with_an_eta_to_a_non_direct_exchange_goes_to_send_task(exchange_type, eta, fast):
    from kombu import Exchange, Queue

    application, connection = app(), Connection()
    application.conf.task_queues = [Queue("cas_q", Exchange("cas_x", type=exchange_type), routing_key="cas.q",
                                          queue_arguments={"x-queue-type": "quorum"})]
    application.conf.task_default_queue = "cas_q"
    publisher = publisher_for(application, connection)
    publisher._declared.add("cas_q")
    batch = [run(0, eta=FIRE_AT if eta else None)]
    assert publisher.publish(connection, batch) == ([] if fast else batch)
    assert bool(connection.connection.transport.written) == fast
