"""Publishing claimed runs to the Celery broker.

Each run becomes an ordinary Celery task message (protocol 2) with task id
``"<job id>:<attempt>"`` and a ``cron_at_scale`` header naming the job, the
attempt and the occurrence, which the worker middleware reads.

Two paths, chosen per broker:

* **Redis fast path**: the messages of a whole batch are built here, in the
  exact shape Celery's ``send_task`` gives them (``tests`` compare the two
  field by field), and sent in one pipeline with one ``LPUSH`` per
  destination list. Celery's per-message publishing costs ~0.2-0.6 ms;
  this costs a few microseconds per message.
* **RabbitMQ fast path** (:mod:`cron_at_scale.broker.amqp`): the same
  messages, every one of a batch written before the broker's publisher
  confirms are awaited once for the batch; a nacked, returned or unconfirmed
  message fails the batch. The frames are encoded there (each task's constant
  headers once) and the batch written in one write: ~30 us of publisher CPU
  per message (py-amqp's ``basic_publish``: ~120) against ~250 us for
  ``send_task``.
* **Any other broker** (SQS ...): Celery's ``send_task`` on one
  producer, inside kombu's ``Producer.batch()`` where the transport has it.

Routes a fast path cannot express exactly take the general path, so a fast
path never changes where a message goes: on Redis, a task routed to a
non-direct exchange, an explicit exchange or routing key; on RabbitMQ, a
route with options beyond its queue, exchange and routing key, or a broadcast
queue. The fast paths do not send Celery's
``before_task_publish``/``after_task_publish`` signals.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import queue
import re
import socket
import threading
import time
import uuid
from collections import defaultdict
from datetime import datetime
from typing import TYPE_CHECKING

from celery import Celery

from cron_at_scale.broker.message import EMBED, HEADER, argrepr, header
from cron_at_scale.dispatcher.claimed import Claimed
from cron_at_scale.models import task_id_for

if TYPE_CHECKING:
    from cron_at_scale.broker.amqp import AmqpPublisher

log = logging.getLogger(__name__)

class Publisher:
    """Sends claimed runs to the broker of ``app``; keeps one broker connection between batches."""

    def __init__(self, app: Celery):
        self.app = app
        self.conn = None
        self._routes: dict[tuple[str, str], str | None] = {}
        self._declared: set[str] = set()
        self._templates: dict[tuple, list[str]] = {}
        self._times: dict[datetime, str] = {}  # a time as JSON text, for the runs of a burst
        self._repr_levels = app.conf.task_repr_maxlevels  # argsrepr/kwargsrepr as send_task writes them
        self.origin = f"gen{os.getpid()}@{socket.gethostname()}"
        self._amqp: AmqpPublisher | None = None  # the RabbitMQ fast path (amqp.AmqpPublisher), made on first use

    # -- connection ----------------------------------------------------------------------

    def _connection(self):
        if self.conn is None:
            conn = self.app.connection_for_write()
            conn.ensure_connection(max_retries=3)
            self.conn = conn
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.release()
            finally:
                self.conn = None
                self._declared.clear()
                if self._amqp is not None:
                    self._amqp.close()

    @property
    def kind(self) -> str | None:
        """Which fast path the broker has: ``"redis"``, ``"amqp"`` (RabbitMQ) or None (``send_task``)."""
        driver = self._connection().transport.driver_type
        return driver if driver in ("redis", "amqp") else None

    @property
    def fast(self) -> bool:
        return self.kind is not None

    # -- publishing ----------------------------------------------------------------------

    def publish(self, batch: list[Claimed]) -> int:
        """Send every run in ``batch``; return how many were sent.

        Raises the broker's error if it is down (after one reconnect), or
        :class:`~cron_at_scale.broker.amqp.NotConfirmed` if RabbitMQ did not
        confirm every message: the runs stay claimed, their dispatch lease
        expires and the reaper fires them again. The database, not the broker,
        is the source of truth.
        """
        if not batch:
            return 0
        try:
            return self._publish(batch)
        except Exception:
            log.warning("publishing failed; reconnecting to the broker once", exc_info=True)
            self.close()
            return self._publish(batch)

    def _publish(self, batch: list[Claimed]) -> int:
        general: list[Claimed] = []
        lists: dict[str, list[str]] = defaultdict(list)
        kind = self.kind
        if kind == "amqp":
            if self._amqp is None:
                from cron_at_scale.broker.amqp import AmqpPublisher

                self._amqp = AmqpPublisher(self.app, self.origin)
            general = self._amqp.publish(self._connection(), batch)
        elif kind == "redis":
            channel = self._connection().default_channel
            for c in batch:
                target = self._redis_list(channel, c)
                if target is None:
                    general.append(c)
                elif c.envelope is not None and c.envelope[0] == target:
                    lists[target].append(c.envelope[1])
                else:
                    lists[target].append(self._envelope(c, target))
            if lists:
                with channel.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
                    for key, messages in lists.items():
                        pipe.lpush(key, *messages)
                    pipe.execute()
        else:
            general = batch
        if general:
            self._send_tasks(general)
        return len(batch)

    def prepare(self, runs: list[Claimed]) -> list[Claimed]:
        """``runs`` with their Redis messages built now (``Claimed.envelope``), for runs held until
        their time: a pre-loaded burst then only has to be sent when it comes due (building a
        message is most of the publisher's ~20 µs a run). Other brokers: ``runs`` as they are.
        The route is looked up again when sent: a run whose list changed meanwhile is built again."""
        if self.kind != "redis":
            return runs
        channel = self._connection().default_channel
        out = []
        for c in runs:
            target = self._redis_list(channel, c)
            out.append(c if target is None else c.prepared((target, self._envelope(c, target))))
        return out

    def _send_tasks(self, batch: list[Claimed]) -> None:
        with self.app.producer_or_acquire() as producer:
            batching = producer.batch() if hasattr(producer, "batch") else None
            if batching is not None:
                batching.__enter__()
            try:
                for c in batch:
                    options = {"priority": c.options["priority"]} if "priority" in (c.options or {}) else {}
                    if c.eta is not None:
                        options["eta"] = c.eta
                    self.app.send_task(
                        c.task, args=c.payload.get("args", ()), kwargs=c.payload.get("kwargs", {}),
                        task_id=task_id_for(c.job_id, c.attempt), queue=c.queue or None,
                        headers={HEADER: header(c)}, producer=producer, **options,
                    )
            finally:
                if batching is not None:
                    batching.__exit__(None, None, None)

    # -- the Redis fast path -------------------------------------------------------------

    def _redis_list(self, channel, c: Claimed) -> str | None:
        """The Redis list ``send_task`` would push this run to, or None if only it can say."""
        key = (c.task, c.queue)
        if key not in self._routes:
            self._routes[key] = self._route(channel, c)
        name = self._routes[key]
        if name is None:
            return None
        priority = (c.options or {}).get("priority")
        if priority:
            # kombu's Redis transport keeps a list per priority step: "<queue><sep><step>" (step 0: the queue
            # itself), the message's priority clamped to [min_priority, max_priority] first.
            try:
                pri = max(min(int(priority), channel.max_priority), channel.min_priority)
            except (TypeError, ValueError):
                pri = channel.default_priority
            step = channel.priority(pri)
            return f"{name}{channel.sep}{step}" if step else name
        return name

    def _route(self, channel, c: Claimed) -> str | None:
        amqp = self.app.amqp
        options = amqp.router.route({"queue": c.queue} if c.queue else {}, c.task, (), {})
        queue = options.get("queue")
        if queue is None or options.get("exchange") or options.get("routing_key"):
            return None
        if isinstance(queue, str):
            queue = amqp.queues[queue]
        if queue.exchange is not None and queue.exchange.type != "direct":
            return None
        if queue.name not in self._declared:  # as send_task would: the queue and its binding exist
            queue(channel).declare()
            self._declared.add(queue.name)
        return queue.name

    def _envelope(self, c: Claimed, target: str) -> str:
        """The Redis message of run ``c``: Celery's envelope, filled into a template made once
        per (task, list, priority), so only the per-run values are JSON-encoded here."""
        args = c.payload.get("args", [])
        kwargs = c.payload.get("kwargs", {})
        priority = (c.options or {}).get("priority") or 0
        key = (c.task, target, priority, c.eta is not None)
        template = self._templates.get(key)
        if template is None:
            template = self._templates[key] = self._template(c.task, target, priority, c.eta is not None)
        # JSON written by hand where json.dumps would give the same text: a UUID, an int, an
        # ISO 8601 time and base64 need no escaping (a burst's runs share their times: cached)
        job_id = str(c.job_id)
        task_id = f'"{job_id}:{c.attempt}"'
        times = self._times
        fire_at = times.get(c.fire_at) or times.setdefault(c.fire_at, f'"{c.fire_at.isoformat()}"')
        occurrence = c.occurrence or c.fire_at
        occ = times.get(occurrence) or times.setdefault(occurrence, f'"{occurrence.isoformat()}"')
        if len(times) > 4096:
            times.clear()
        values = {
            "body": '"' + base64.b64encode(json.dumps([args, kwargs, EMBED]).encode()).decode() + '"',
            "id": task_id,
            "argsrepr": json.dumps(argrepr(args or (), self._repr_levels)),
            "kwargsrepr": '"{}"' if not kwargs else json.dumps(argrepr(kwargs, self._repr_levels)),
            "header": f'{{"job_id": "{job_id}", "attempt": {int(c.attempt)}, "fire_at": {fire_at}, "occurrence": {occ}}}',
            "tag": f'"{uuid.uuid4()}"',
            "eta": (times.get(c.eta) or times.setdefault(c.eta, f'"{c.eta.isoformat()}"')) if c.eta is not None
            else "null",
        }
        out = [template[0]]
        for i in range(1, len(template), 2):
            out.append(values[template[i]])
            out.append(template[i + 1])
        return "".join(out)

    def _template(self, task: str, target: str, priority: int, eta: bool = False) -> list[str]:
        """Celery's envelope as JSON text split around the per-run values: [text, name, text, ...]."""
        slot = {name: f"@@cas:{name}@@" for name in ("body", "id", "argsrepr", "kwargsrepr", "header", "tag", "eta")}
        text = json.dumps({
            "body": slot["body"],
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py", "task": task, "id": slot["id"], "shadow": None, "eta": slot["eta"] if eta else None,
                "expires": None,
                "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
                "root_id": slot["id"], "parent_id": None,
                "argsrepr": slot["argsrepr"], "kwargsrepr": slot["kwargsrepr"],
                "origin": self.origin, "ignore_result": None, "replaced_task_nesting": 0,
                "stamped_headers": None, "stamps": {}, HEADER: slot["header"],
            },
            "properties": {
                "correlation_id": slot["id"], "reply_to": self.app.thread_oid, "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": target.split("\x06\x16", 1)[0]},
                "priority": priority, "body_encoding": "base64", "delivery_tag": slot["tag"],
            },
        })
        return re.split(r'"@@cas:(\w+)@@"', text)


def publish_batch(app: Celery, batch: list[Claimed]) -> int:
    """Send ``batch`` with a one-off :class:`Publisher` (tests, tools); the dispatcher keeps one."""
    publisher = Publisher(app)
    try:
        return publisher.publish(batch)
    finally:
        publisher.close()


class Sender:
    """Publishes claimed batches from a thread of its own.

    The dispatcher's next claim (PostgreSQL's work) then overlaps the publish
    of this batch (Python's work): two cores busy instead of one. At most
    ``depth`` batches wait; one more blocks the claimer (back-pressure). A
    batch that fails to publish (the broker restarting, a partition) is tried
    again with a backoff for up to ``retry_for`` seconds (sending a run twice is
    harmless: its attempt starts once); meanwhile the claimer blocks, so a
    dispatcher cut off from its broker claims nothing more and stops renewing
    its shard leases, which move to a dispatcher that can publish. After that
    the batch is logged and left to the reaper. ``lock`` guards the publisher
    against other uses of it.

    A batch of at most ``inline_max`` runs sent while nothing is queued or
    being published goes out on the caller's thread instead, by the same
    rules: there is nothing for a claim to overlap (a few jobs due now), and
    the hand-over to the thread cost ~0.3 ms of the pickup of a job due now
    (the thread waits for the caller to give up the GIL).
    """

    def __init__(self, publisher: Publisher, on_sent, depth: int = 2, retry_for: float = 0.0,
                 inline_max: int = 50):
        self.publisher = publisher
        self.on_sent = on_sent  # on_sent(count, seconds)
        self.retry_for = retry_for
        self.inline_max = inline_max
        self.lock = threading.Lock()
        self.queue: queue.Queue[list[Claimed] | None] = queue.Queue(maxsize=depth)
        self.thread: threading.Thread | None = None
        self._starting = threading.Lock()  # the dispatcher's loop and its timer thread both send
        self._pending = 0  # batches queued or being published by the thread (guarded by _starting)

    def send(self, runs: list[Claimed]) -> None:
        """Publish ``runs``: on this thread if the batch is small and the sender idle (returns once
        published or given up), else queued for the sender's thread (blocks while ``depth`` batches
        wait)."""
        with self._starting:
            inline = self._pending == 0 and len(runs) <= self.inline_max
            if not inline:
                self._pending += 1
                if self.thread is None or not self.thread.is_alive():
                    self.thread = threading.Thread(target=self._loop, name="cron_at_scale-sender", daemon=True)
                    self.thread.start()
        if inline:
            self._send(runs)
        else:
            self.queue.put(runs)

    def wait(self) -> None:
        """Return once every queued batch is published (or failed)."""
        if self.thread is not None:
            self.queue.join()

    def close(self) -> None:
        """Publish what is queued, then end the thread."""
        if self.thread is not None and self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()
        self.thread = None

    def _loop(self) -> None:
        while True:
            runs = self.queue.get()
            try:
                if runs is None:
                    return
                self._send(runs)
            finally:
                if runs is not None:
                    with self._starting:
                        self._pending -= 1
                self.queue.task_done()

    def _send(self, runs: list[Claimed]) -> None:
        try:
            t0 = time.monotonic()
            n = self._publish(runs, t0 + self.retry_for)
            self.on_sent(n, time.monotonic() - t0)
        except Exception:
            # Claimed but not sent: their leases expire and the reaper fires them again.
            log.exception("publishing %d claimed jobs failed; the reaper will re-fire them", len(runs))

    def _publish(self, runs: list[Claimed], deadline: float) -> int:
        pause = 0.1
        while True:
            try:
                with self.lock:
                    return self.publisher.publish(runs)
            except Exception as e:
                if time.monotonic() + pause > deadline:
                    raise
                log.warning("publishing %d claimed jobs failed (%s); trying again in %.1fs", len(runs), e, pause)
                time.sleep(pause)
                pause = min(2.0, pause * 2)
