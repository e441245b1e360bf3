"""The RabbitMQ fast path: a batch of Celery task messages on one channel, confirmed once per batch.

Every message of a batch is encoded here (:mod:`cron_at_scale.broker.amqp_frames`:
``basic.publish`` with ``mandatory``, its content header and body frames) and
the batch written to the socket in one write before any confirm is awaited; then the broker's ``basic.ack``/``basic.nack`` frames
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
``events`` callbacks and ``channel_id``, the connection's ``frame_max``,
``transport.write``/``having_timeout`` and ``drain_events``) is all this uses.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from struct import pack
from typing import Any

from celery import Celery
from celery.utils.quorum_queues import detect_quorum_queues
from kombu import Exchange, Queue
from kombu.common import Broadcast
from kombu.entity import maybe_delivery_mode

from cron_at_scale.broker.amqp_frames import BASIC, FLAGS, FRAME_END, HeadersTemplate, body_frames, key, method_frame
from cron_at_scale.broker.message import EMBED, HEADER, argrepr, header
from cron_at_scale.models import task_id_for

EMBED_JSON = (", " + json.dumps(EMBED) + "]").encode()  # the body's end: json.dumps([args, kwargs, EMBED])
# The properties every message starts with (flags, content type and encoding), before its headers table.
PROPS_HEAD = pack(">H", FLAGS) + key("application/json") + key("utf-8")
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
    exchange_type: str = "direct"


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
    return Route(exchange or "", routing_key or "", maybe_delivery_mode(delivery_mode), q, exchange_type)


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
        self._headers: dict[str, HeadersTemplate] = {}
        self._methods: dict[tuple[int, str, str], bytes] = {}
        self._reply_tos: dict[str, bytes] = {}
        self._props_head = PROPS_HEAD
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
        # Routes first: a queue declared now waits for its reply.
        routed = []
        # With a quorum queue among the app's queues, send_task sends a message with an eta through
        # Celery's native delayed delivery (its celery_delayed_* exchanges) unless the route's exchange
        # is direct: only send_task can say what that message is.
        delayed = any(c.eta is not None for c in batch) and detect_quorum_queues(self.app, "amqp")[0]
        for c in batch:
            r = self._route(channel, c.task, c.queue)
            if r is None or delayed and c.eta is not None and r.exchange_type != "direct":
                general.append(c)
            else:
                routed.append((c, r))
        transport = connection.connection.transport
        frame_max = connection.connection.frame_max
        ch = channel.channel_id
        frames: list[bytes] = []
        dumps = json.dumps
        levels = self.app.conf.task_repr_maxlevels
        for c, r in routed:
            args = c.payload.get("args", [])
            kwargs = c.payload.get("kwargs", {})
            task_id = task_id_for(c.job_id, c.attempt)
            template = self._template(c.task)
            headers = template.encode((
                task_id, None if c.eta is None else c.eta.isoformat(), task_id,
                argrepr(args or (), levels), argrepr(kwargs, levels), header(c)))
            body = b"".join((b"[", dumps(args).encode(), b", ", dumps(kwargs).encode(), EMBED_JSON))
            props = b"".join((self._props_head, headers,
                              pack("BB", r.delivery_mode, (c.options or {}).get("priority") or 0),
                              key(task_id), self._reply_to(reply_to)))
            if len(props) + 12 > frame_max - 8:  # a content header is one frame (py-amqp does not split it)
                raise ValueError(f"the properties of task {task_id} are {len(props)} bytes, more than a frame")
            frames.append(self._method(ch, r))
            frames.append(pack(">BHIHHQ", 2, ch, len(props) + 12, BASIC, 0, len(body)) + props + FRAME_END)
            frames.extend(body_frames(ch, body, frame_max))
        if frames:
            # One write per batch (py-amqp's basic_publish: one sendall per message); a write that
            # times out leaves the connection unusable: the caller closes it.
            with transport.having_timeout(self.confirm_timeout):
                transport.write(b"".join(frames))
            confirms.next_tag += len(routed)
        t0 = time.perf_counter()
        try:
            confirms.wait(connection, self.confirm_timeout)
        finally:
            self.confirm_seconds += time.perf_counter() - t0
        return general

    def _route(self, channel, task: str, queue: str) -> Route | None:
        k = (task, queue)
        if k not in self._routes:
            self._routes[k] = route(self.app, task, queue or None)
        r = self._routes[k]
        if r is not None and r.declare is not None and r.declare.name not in self._declared:
            r.declare(channel).declare()  # as send_task would: the queue, its exchange and binding exist
            self._declared.add(r.declare.name)
        return r

    def _method(self, channel_id: int, r: Route) -> bytes:
        k = (channel_id, r.exchange, r.routing_key)
        frame = self._methods.get(k)
        if frame is None:
            frame = self._methods[k] = method_frame(channel_id, r.exchange, r.routing_key, mandatory=True)
        return frame

    def _reply_to(self, reply_to: str) -> bytes:
        encoded = self._reply_tos.get(reply_to)
        if encoded is None:
            encoded = self._reply_tos[reply_to] = key(reply_to)
        return encoded

    def _template(self, task: str) -> HeadersTemplate:
        """Celery's protocol 2 headers of ``task``, encoded but for the per-run values (in this order:
        ``id``, ``eta``, ``root_id``, ``argsrepr``, ``kwargsrepr``, then the ``cron_at_scale`` header)."""
        template = self._headers.get(task)
        if template is None:
            template = self._headers[task] = HeadersTemplate({
                "lang": "py", "task": task, "id": None, "shadow": None, "eta": None, "expires": None,
                "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
                "root_id": None, "parent_id": None, "argsrepr": None, "kwargsrepr": None,
                "origin": self.origin, "ignore_result": None, "replaced_task_nesting": 0,
                "stamped_headers": None, "stamps": {},
            }, varying=("id", "eta", "root_id", "argsrepr", "kwargsrepr"), extra=(HEADER,))
        return template
