"""The RabbitMQ fast path: a batch of Celery task messages on one channel, confirmed once per batch.

Every message of a batch is written (``basic_publish``, ``mandatory``) before
any confirm is awaited; then the broker's ``basic.ack``/``basic.nack`` frames
(several messages per frame) are read until each message is settled. One
round trip per batch instead of one per message: Celery's ``send_task`` with
``confirm_publish`` waits for each. A message the broker nacks (a full queue
with ``x-overflow: reject-publish``), returns (routed to no queue) or does not
confirm within ``confirm_timeout`` seconds fails the whole batch with
:class:`NotConfirmed`: the caller treats it as a failed publish, so the runs
stay claimed and are sent again (sending one twice is harmless).

The messages are those ``send_task`` publishes (``tests`` compare them field
by field as a worker receives them): the same headers, properties, exchange
and routing key (Celery's router: ``task_routes``, ``task_queues``, a job's
``queue``), and the queue declared once per connection as Celery does. Only
the per-run values are computed per message. The py-amqp client is kombu's
own RabbitMQ transport; its public API (``confirm_select``, the channel's
``events`` callbacks, ``drain_events``) is all this uses.
"""

from __future__ import annotations

import json
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery import Celery
from kombu import Exchange, Queue
from kombu.common import Broadcast
from kombu.entity import maybe_delivery_mode

from cron_at_scale.broker.message import EMBED, HEADER, REPR_MAX, header
from cron_at_scale.models import task_id_for

CONFIRM_TIMEOUT = 10.0  # seconds to wait for a batch's confirms (RabbitMQ gives them in milliseconds)


class NotConfirmed(Exception):
    """The broker did not accept every message of a batch (nacked, returned, or no confirm in time)."""


@dataclass(frozen=True)
class Route:
    """Where ``send_task`` publishes a task: exchange name, routing key, delivery mode, queue to declare."""

    exchange: str
    routing_key: str
    delivery_mode: int
    declare: Queue | None


_ROUTE_KEYS = {"queue", "exchange", "routing_key", "exchange_type", "delivery_mode"}


def route(app: Celery, task: str, queue: str | None) -> Route | None:
    """Celery's route for ``task`` (with a job's ``queue``), resolved as ``send_task_message`` does;
    None when the route carries other options (a priority, a serializer ...) or a broadcast queue:
    then only ``send_task`` can say what the message is."""
    amqp = app.amqp
    options = amqp.router.route({"queue": queue} if queue else {}, task, (), {})
    if set(options) - _ROUTE_KEYS:
        return None
    q = options.get("queue")
    exchange = options.get("exchange")
    routing_key = options.get("routing_key")
    exchange_type = options.get("exchange_type")
    delivery_mode = options.get("delivery_mode")
    qname = q
    if q is None and exchange is None:
        q = amqp.default_queue
    if q is not None:
        if isinstance(q, str):
            qname, q = q, amqp.queues[q]
        else:
            qname = q.name
    if isinstance(q, Broadcast):
        return None
    if delivery_mode is None:
        delivery_mode = getattr(getattr(q, "exchange", None), "delivery_mode", None) or \
            app.conf.task_default_delivery_mode
    if exchange_type is None:
        exchange_type = q.exchange.type if q is not None and q.exchange is not None else "direct"
    if (not exchange or not routing_key) and exchange_type == "direct":
        exchange, routing_key = "", qname
    elif exchange is None:
        assert q is not None
        exchange = q.exchange.name or amqp.default_exchange
        routing_key = routing_key or q.routing_key or app.conf.task_default_routing_key
    if isinstance(exchange, Exchange):
        exchange = exchange.name
    return Route(exchange or "", routing_key or "", maybe_delivery_mode(delivery_mode), q)


class Confirms:
    """The publisher confirms of one channel in confirm mode. Delivery tags count the channel's
    publishes from 1; every tag below ``low`` is settled (acked, nacked or returned and acked)."""

    def __init__(self, channel):
        self.next_tag = 1
        self.low = 1
        self.singles: set[int] = set()
        self.nacked = 0
        self.returned: list[str] = []
        channel.events["basic_ack"].add(self._ack)
        channel.events["basic_nack"].add(self._nack)
        channel.events["basic_return"].add(self._return)

    def _settle(self, tag: int, multiple: bool) -> int:
        """Settle ``tag`` (and every tag below it if ``multiple``); return how many were newly settled."""
        if tag < self.low:
            return 0
        if multiple:
            done = tag + 1 - self.low - sum(1 for t in self.singles if t <= tag)
            self.singles = {t for t in self.singles if t > tag}
            self.low = tag + 1
        elif tag in self.singles:
            return 0
        else:
            done = 1
            self.singles.add(tag)
        while self.low in self.singles:
            self.singles.remove(self.low)
            self.low += 1
        return done

    def _ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple)

    def _nack(self, tag: int, multiple: bool) -> None:
        self.nacked += self._settle(tag, multiple)

    def _return(self, exc, exchange, routing_key, message) -> None:
        # RabbitMQ sends a message's basic.return before its basic.ack.
        self.returned.append(f"{exc} (exchange {exchange!r}, routing key {routing_key!r})")

    def wait(self, connection, timeout: float) -> None:
        """Read the connection until every publish so far is settled; raise :class:`NotConfirmed`
        if one was nacked or returned, or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while self.low < self.next_tag:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                connection.drain_events(timeout=left)
            except TimeoutError:
                break
        missing = self.next_tag - self.low - len(self.singles)
        nacked, returned = self.nacked, self.returned
        self.nacked, self.returned = 0, []
        if missing or nacked or returned:
            raise NotConfirmed(f"{nacked} messages nacked, {len(returned)} returned"
                               f"{' (' + returned[0] + ')' if returned else ''}, "
                               f"{missing} not confirmed within {timeout:g}s")


@contextmanager
def corked(connection):
    """Hold the connection's small writes (one per message) in the kernel until the block ends or
    a full TCP segment is ready (Linux ``TCP_CORK``): a batch goes out in ~1/50 of the packets,
    which costs the broker about a third less CPU per message, and the client a quarter less."""
    option = getattr(socket, "TCP_CORK", None)
    sock = getattr(connection.connection, "sock", None)
    if option is None or sock is None:
        yield
        return
    sock.setsockopt(socket.IPPROTO_TCP, option, 1)
    try:
        yield
    finally:
        if connection.connection.sock is sock:  # not if the socket closed meanwhile
            sock.setsockopt(socket.IPPROTO_TCP, option, 0)


class AmqpPublisher:
    """Publishes runs to RabbitMQ (kombu's ``amqp``/``pyamqp`` transport) with publisher confirms.

    One confirmed channel on the connection given to :meth:`publish`; forget it with :meth:`close`
    when that connection goes (the next publish opens a new one and declares the queues again).
    """

    def __init__(self, app: Celery, origin: str, confirm_timeout: float = CONFIRM_TIMEOUT):
        self.app = app
        self.origin = origin
        self.confirm_timeout = confirm_timeout
        self.channel: Any = None  # a py-amqp channel (untyped), opened by the first publish()
        self.confirms: Confirms | None = None
        self._routes: dict[tuple[str, str], Route | None] = {}
        self._declared: set[str] = set()
        self._headers: dict[str, dict] = {}
        self.confirm_seconds = 0.0  # total time spent waiting for confirms (what they cost the sender)

    def close(self) -> None:
        """Forget the channel (its connection is closed by the caller) and what it declared."""
        self.channel = None
        self.confirms = None
        self._declared.clear()

    def publish(self, connection, batch: list) -> list:
        """Publish every run of ``batch`` that has a fast route and wait for their confirms;
        return the runs left for ``send_task`` (routes only it can express).

        ``connection``: a connected ``kombu.Connection`` to RabbitMQ. Raises :class:`NotConfirmed`
        or the broker's error; the caller closes the connection then (the channel's tags are spent).
        """
        if self.channel is None:
            self.channel = connection.channel()
            self.channel.confirm_select()
            self.confirms = Confirms(self.channel)
        channel, confirms = self.channel, self.confirms
        assert confirms is not None
        reply_to = self.app.thread_oid
        general = []
        # Routes first: a queue declared now waits for its reply, which must not sit in a corked socket.
        routed = []
        for c in batch:
            r = self._route(channel, c.task, c.queue)
            if r is None:
                general.append(c)
            else:
                routed.append((c, r))
        publish, prepare, dumps = channel.basic_publish, channel.prepare_message, json.dumps
        with corked(connection):
            for c, r in routed:
                args = c.payload.get("args", [])
                kwargs = c.payload.get("kwargs", {})
                task_id = task_id_for(c.job_id, c.attempt)
                headers = dict(self._template(c.task))
                headers["id"] = headers["root_id"] = task_id
                headers["argsrepr"] = repr(args or ())[:REPR_MAX]
                headers["kwargsrepr"] = repr(kwargs)[:REPR_MAX]
                headers[HEADER] = header(c)
                if c.eta is not None:
                    headers["eta"] = c.eta.isoformat()
                message = prepare(dumps([args, kwargs, EMBED]).encode(), (c.options or {}).get("priority") or 0,
                                  "application/json", "utf-8", headers,
                                  {"correlation_id": task_id, "reply_to": reply_to, "delivery_mode": r.delivery_mode})
                publish(message, exchange=r.exchange, routing_key=r.routing_key, mandatory=True)
                confirms.next_tag += 1
        t0 = time.perf_counter()
        try:
            confirms.wait(connection, self.confirm_timeout)
        finally:
            self.confirm_seconds += time.perf_counter() - t0
        return general

    def _route(self, channel, task: str, queue: str) -> Route | None:
        key = (task, queue)
        if key not in self._routes:
            self._routes[key] = route(self.app, task, queue or None)
        r = self._routes[key]
        if r is not None and r.declare is not None and r.declare.name not in self._declared:
            r.declare(channel).declare()  # as send_task would: the queue, its exchange and binding exist
            self._declared.add(r.declare.name)
        return r

    def _template(self, task: str) -> dict[str, Any]:
        """Celery's protocol 2 headers of ``task``; the per-run ones are set per message."""
        headers = self._headers.get(task)
        if headers is None:
            headers = self._headers[task] = {
                "lang": "py", "task": task, "id": None, "shadow": None, "eta": None, "expires": None,
                "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
                "root_id": None, "parent_id": None, "argsrepr": None, "kwargsrepr": None,
                "origin": self.origin, "ignore_result": None, "replaced_task_nesting": 0,
                "stamped_headers": None, "stamps": {},
            }
        return headers
