"""Back-pressure per destination queue: a queue that is full or that nobody consumes holds its jobs.

The rule: a broker queue holding more than ``MAX_BROKER_DEPTH`` messages is **full**; a broker queue
with no consumer (RabbitMQ: its consumer count; Redis, which has no such count: no live worker's
health row in ``cron_at_scale_workerhealth`` lists it) has **no consumer**. The dispatcher does not
claim the jobs bound for such a queue: they stay ``pending`` in the database, with no attempt, while
every other queue keeps firing. Once the queue drains or a consumer comes, they are claimed as usual
(a recurring job's missed occurrences then follow its catch-up policy).

Which broker queue a job goes to is resolved exactly as the publisher does (Celery's router, with the
job's ``queue`` column, ``''`` meaning "the task's route, else the default queue"). Because a route
can depend on the task name, the claim excludes (see ``claim`` in sql/dispatcher.sql):

* jobs whose ``queue`` column names a held queue;
* jobs with an empty ``queue`` column whose *task* routes to a held queue. The dispatcher knows the
  route of every task registered with its Celery app and of every (task, queue) it has claimed; a
  task it has never seen is assumed to go to the default queue.

A (task, queue) seen for the first time in a claimed batch is resolved, and its queue checked, before
that batch is committed: if the queue is held, the claim is rolled back and taken again without it,
so even the first job for a dead queue gets no attempt.

**Paced** (``MAX_QUEUE_WAIT``, by default half the dispatch lease): a queue is also held while
its messages would wait longer than that for its consumers, so that a message waiting its turn is
never mistaken for a lost one and fired again (which would add a second message for the workers to
skip, lengthening the queue that caused it: overload amplifying itself). The workers' pace is
measured, not configured: while a queue has a backlog, what its consumers took between two checks
(its depth then, plus the runs claimed for it since, minus its depth now) over the time between
them. A queue may hold what they drain in ``MAX_QUEUE_WAIT`` seconds: runs claimed for it count
against that at once, a queue reaching it is held before the next check, and while a queue has a
backlog a claim takes no more rows than the room left in it. Until its pace was measured (a queue
never backlogged yet), and for a queue with no consumer (``HOLD_UNCONSUMED_QUEUES``' business),
only ``MAX_BROKER_DEPTH`` holds it: the first batch into an idle queue may
overshoot by up to ``BATCH_SIZE``. Several dispatchers each count their own claims only: the
depth may overshoot by one allowance per dispatcher.

A check that gets no answer (the broker does not answer, or on Redis the worker health rows cannot
be read: a database restart) is no news: a held queue stays held until a check says it may fire,
and a queue never held is not held for it.

Cost: each queue is checked at most once a second (and once when first seen), never per job: one
``queue_declare(passive=True)`` per queue on a broker connection of this module's own, plus on Redis
one small query of the worker health rows per check round. In a running dispatcher
(:meth:`QueueGate.start`) a queue's first check is made on the loop, before any claim for it, and
its re-checks on a thread of the gate's own: a check takes 5-70 ms on a busy box, and a claim woken
by a job due now would otherwise wait behind it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from celery import Celery
from kombu.common import Broadcast

log = logging.getLogger(__name__)

OK, FULL, NO_CONSUMER, UNKNOWN, PACED = "ok", "full", "no consumer", "unknown", "paced"
CHECK_INTERVAL = 1.0  # seconds between two checks of one queue


@dataclass(frozen=True)
class QueueState:
    """One broker queue as last checked. ``depth``: messages waiting (None: unknown);
    ``consumers``: RabbitMQ's consumer count, or on Redis the live workers listing the queue
    (None: unknown); ``state``: ``ok``, ``full``, ``paced`` (its backlog is ``MAX_QUEUE_WAIT`` of
    its consumers' work), ``no consumer`` or ``unknown``; ``held``: the dispatchers hold its jobs in
    the database (full, paced, or no consumer while ``HOLD_UNCONSUMED_QUEUES``)."""

    queue: str
    depth: int | None
    consumers: int | None
    state: str
    held: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def destination(app: Celery, task: str, queue: str) -> str | None:
    """The broker queue a run of ``task`` with the job's ``queue`` (``''``: routed) is published to,
    resolved as ``send_task`` does; None when no single queue can be named (a broadcast queue, a
    route to an exchange without a queue): such runs are never held."""
    amqp = app.amqp
    options = amqp.router.route({"queue": queue} if queue else {}, task, (), {})
    q = options.get("queue")
    if q is None:
        return None
    if isinstance(q, str):
        q = amqp.queues[q]
    if isinstance(q, Broadcast):
        return None
    return q.name


def job_queue_names(limit: int) -> list[str]:
    """The distinct named queues of jobs (at most ``limit``, by name; ``queue_names``: one index
    probe per value), for :func:`survey` and the admin's queue filter."""
    from cron_at_scale import sql as db

    return [r.queue for r in db.run("queue_names", {"limit": limit}, retries=0)]


def live_worker_queues() -> set[str] | None:
    """Queues consumed by live workers per their health rows; None if the table is missing."""
    from django.db import DatabaseError, transaction

    from cron_at_scale import conf
    from cron_at_scale import sql as db

    try:  # the health rows live on DATABASE, also for a dispatcher of another database of SHARD_DATABASES
        with conf.using(conf.get("DATABASE")), transaction.atomic(using=conf.db_alias()):
            rows = db.run("live_worker_queues", {"window": 3 * float(conf.get("WORKER_HEARTBEAT_INTERVAL"))},
                          retries=0)
            return {r.queue for r in rows}
    except DatabaseError:
        with conf.using(conf.get("DATABASE")):
            if not transaction.get_connection(conf.db_alias()).in_atomic_block:
                db.reset_connection()  # maybe broken (a restart): the next check reconnects
        return None


class Probe:
    """Reads broker queues' depth and consumers on a connection of its own (not the publisher's,
    which the sender thread uses). Kombu's public API: ``queue_declare(passive=True)`` answers
    (name, messages, consumers) on RabbitMQ and on Redis (where the consumer count is always 0,
    hence the worker health rows); a queue that does not exist answers "not found"."""

    def __init__(self, app: Celery, max_depth: int, hold_unconsumed: bool):
        self.app = app
        self.max_depth = max_depth
        self.hold_unconsumed = hold_unconsumed
        self.conn: Any = None  # kombu connection, made on first use
        self.channel = None

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.release()
            except Exception:  # noqa: BLE001 (closing a broken connection)
                pass
        self.conn = self.channel = None

    def _channel(self):
        conn = self.conn
        if conn is None:
            conn = self.app.connection_for_read()
            conn.ensure_connection(max_retries=1)
            self.conn = conn
        if self.channel is None or not getattr(self.channel, "is_open", True):
            self.channel = conn.channel()
        return conn, self.channel

    def look(self, names: list[str]) -> dict[str, QueueState]:
        """The state of each queue in ``names`` (``unknown`` for all if the broker does not answer,
        or is neither Redis nor RabbitMQ)."""
        out = {n: QueueState(n, None, None, UNKNOWN, False) for n in names}
        if not names:
            return out
        try:
            conn, _ = self._channel()
            driver = conn.transport.driver_type
            if driver not in ("redis", "amqp"):
                return out
            workers = live_worker_queues() if driver == "redis" else None
            for name in names:
                depth, declared = self._declare(name)
                consumers: int | None = declared
                if driver == "redis":  # a Redis list has no consumers of its own: the workers' health rows say
                    consumers = None if workers is None else int(name in workers)
                out[name] = self._verdict(name, depth, consumers)
        except Exception:  # a broker blip: no verdict, nothing held on it
            log.debug("could not read the broker's queues", exc_info=True)
        finally:
            # Connected for each look (at most one a second): nothing stays open between them, so a
            # dispatcher (or a status command) that is never closed leaves no socket behind.
            self.close()
        return out

    def _declare(self, name: str) -> tuple[int, int]:
        from kombu.exceptions import ChannelError as KombuChannelError

        try:
            ok = self._channel()[1].queue_declare(queue=name, passive=True)
        except Exception as e:  # "not found": an empty queue nobody declared (its channel closes on RabbitMQ)
            from amqp.exceptions import NotFound

            if isinstance(e, (NotFound, KombuChannelError)):
                self.channel = None
                return 0, 0
            raise
        return int(ok.message_count), int(ok.consumer_count)

    def _verdict(self, name: str, depth: int | None, consumers: int | None) -> QueueState:
        if depth is not None and depth > self.max_depth:
            return QueueState(name, depth, consumers, FULL, True)
        if consumers == 0:
            return QueueState(name, depth, consumers, NO_CONSUMER, self.hold_unconsumed)
        # ok only when both are known: a Redis queue's consumers are unknown while the health rows cannot be read
        return QueueState(name, depth, consumers, OK if depth is not None and consumers is not None else UNKNOWN, False)


class QueueGate:
    """The dispatcher's view of its destination queues: which are held, as claim parameters.

    ``max_depth``: ``MAX_BROKER_DEPTH`` (messages per queue); ``hold_unconsumed``: hold queues that
    have no consumer; ``max_wait``: seconds of its consumers' work a queue may hold (0: no pacing).
    Not thread-safe: the dispatcher's loop thread only (:meth:`start` adds a thread of the gate's
    own that only reads the broker: what it reads is taken in by :meth:`refresh` on the loop thread).
    """

    def __init__(self, app: Celery, max_depth: int, hold_unconsumed: bool, interval: float = CHECK_INTERVAL,
                 max_wait: float = 0.0, on_pace: Callable[[str, bool, float | None], None] | None = None):
        self.app = app
        # told (queue, paced, measured drain in messages/s) at each verdict: the dispatcher's metrics
        self.on_pace = on_pace or (lambda queue, paced, drain: None)
        self.interval = interval
        self.max_wait = float(max_wait)
        self.drain: dict[str, float] = {}  # broker queue -> messages/s its consumers take (measured)
        self._seen: dict[str, tuple[float, int]] = {}  # broker queue -> (monotonic time, depth) at its last check
        self._sent: dict[str, int] = {}  # broker queue -> runs claimed for it since its last check
        self.probe = Probe(app, max_depth, hold_unconsumed)
        self.routes: dict[tuple[str, str], str | None] = {}  # (task, job's queue) -> broker queue
        self.states: dict[str, QueueState] = {}
        self._due: dict[str, float] = {}  # broker queue -> monotonic time of its next check
        self._params: dict[str, Any] | None = None
        self._tasks_seeded = False
        # the re-checks' thread (start()): the loop asks (names, monotonic time, runs claimed for each
        # by then), the thread answers (their states, that time, those counts); one question at a time
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._ask: tuple[list[str], float, dict[str, int]] | None = None
        self._answer: tuple[dict[str, QueueState], float, dict[str, int]] | None = None
        self._asked = False  # a question out, its answer not yet taken in
        self._stopping = False
        self.thread_probe = Probe(app, max_depth, hold_unconsumed)  # the thread's broker connection

    # -- routes ----------------------------------------------------------------------------

    def destination(self, task: str, queue: str) -> str | None:
        key = (task, queue)
        if key not in self.routes:
            try:
                self.routes[key] = destination(self.app, task, queue)
            except Exception:  # noqa: BLE001 (a route Celery cannot resolve: the publisher will say)
                self.routes[key] = None
            self._params = None
        return self.routes[key]

    def seed(self) -> None:
        """Routes of every task the app knows (an empty ``queue`` column follows them)."""
        self._tasks_seeded = True
        for name in list(self.app.tasks):
            if not name.startswith("celery."):
                self.destination(name, "")

    # -- checks ----------------------------------------------------------------------------

    def refresh(self, now: float | None = None) -> list[QueueState]:
        """Check the queues whose second is up (each at most once per ``interval``); return the
        queues whose verdict changed."""
        if not self._tasks_seeded:
            self.seed()
        now = time.monotonic() if now is None else now
        changed = []
        if self._thread is not None and not self._thread.is_alive():  # it failed (logged): check here again
            self._thread, self._asked = None, False
        if self._thread is not None:
            with self._cond:
                answer, self._answer = self._answer, None
            if answer is not None:
                self._asked = False
                changed += self._take(*answer)
        names = {n for n in self.routes.values() if n}
        due = [n for n in sorted(names) if self._due.get(n, 0.0) <= now]
        if self._thread is None:
            return changed + self._check(due, now)
        changed += self._check([n for n in due if n not in self.states], now)  # a first verdict before its claim
        again = [n for n in due if n in self.states and self._due.get(n, 0.0) <= now]
        if again and not self._asked:
            self._asked = True
            with self._cond:
                self._ask = (again, now, {n: self._sent.get(n, 0) for n in again})
                self._cond.notify()
        return changed

    def start(self) -> None:
        """Re-check the queues on a thread of this gate's own from now on (a running dispatcher)."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._rechecks, name="cron_at_scale-queues", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the re-checks' thread (refresh() checks on the calling thread again). A check stuck on
        an unanswering broker is not waited for beyond ``timeout`` seconds: the thread is a daemon."""
        if self._thread is not None:
            with self._cond:
                self._stopping = True
                self._cond.notify()
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the queue checks' thread is still waiting for the broker after %.0fs; left behind",
                            timeout)
            self._thread, self._ask, self._answer, self._asked = None, None, None, False

    def _rechecks(self) -> None:
        from django.db import connections

        try:
            while True:
                with self._cond:
                    while self._ask is None and not self._stopping:
                        self._cond.wait()
                    ask, self._ask = self._ask, None
                    if self._stopping or ask is None:
                        return
                names, at, sent = ask
                looked = self.thread_probe.look(names)
                with self._cond:
                    self._answer = (looked, at, sent)
        except Exception:  # noqa: BLE001 (never expected: look() answers "unknown" on errors)
            log.exception("the queue checks' thread failed; checks go back to the loop")
        finally:
            self.thread_probe.close()
            connections.close_all()  # this thread's own

    def _check(self, names: list[str], now: float) -> list[QueueState]:
        if not names:
            return []
        return self._take(self.probe.look(names), now, None)

    def _take(self, looked: dict[str, QueueState], now: float, sent: dict[str, int] | None) -> list[QueueState]:
        """Take in the states ``looked`` up at ``now`` (monotonic); ``sent``: the runs claimed for
        each queue by then (None: all claimed so far, the check was made now)."""
        changed = []
        for name, state in looked.items():
            self._due[name] = now + self.interval
            state = self._pace(name, state, now, None if sent is None else sent.get(name, 0))
            old = self.states.get(name)
            if state.state == UNKNOWN and old is not None and old.held:
                # no answer (a broker or database blip) is no news: a held queue stays held until a check says why not
                state = old
            self.states[name] = state
            if name in self.drain:
                self.on_pace(name, state.state == PACED, self.drain[name])
            if old is None or old.held != state.held:
                self._params = None
                if PACED in (state.state, old.state if old else None) and not (old and old.state == FULL):
                    log.info("queue %s: %s (%s messages, %.1f/s drained)", name, state.state, state.depth,
                             self.drain.get(name, 0.0))
                elif state.held:
                    log.warning("queue %s: %s (%s messages, %s consumers): its jobs wait in the database",
                                name, state.state, state.depth, state.consumers)
                elif old is not None:
                    log.warning("queue %s: %s again: firing its jobs", name, state.state)
            if old is None or old.state != state.state:
                changed.append(state)
        return changed

    # -- pacing (MAX_QUEUE_WAIT) -------------------------------------------------------------

    def _pace(self, name: str, state: QueueState, now: float, sent: int | None = None) -> QueueState:
        """Measure the queue's drain from this check and the last, and hold it if its backlog is more
        than ``max_wait`` seconds of it. ``sent``: the runs claimed for it up to the check (None: all
        counted so far); those claimed since stay counted for the next check."""
        if sent is None:
            sent = self._sent.pop(name, 0)
        elif (later := self._sent.get(name, 0) - sent) > 0:
            self._sent[name] = later
        else:
            self._sent.pop(name, None)
        depth = state.depth
        if depth is None or not self.max_wait:
            self._seen.pop(name, None)
            return state
        seen, self._seen[name] = self._seen.get(name), (now, depth)
        if seen is not None and now > seen[0] and seen[1] > 0:
            rate = max(0.0, (seen[1] + sent - depth) / (now - seen[0]))
            old = self.drain.get(name)
            if depth > 0:  # a backlog throughout: what the consumers take, smoothed over a few checks
                self.drain[name] = rate if old is None else (old + rate) / 2
            elif old is None or rate > old:  # emptied between the checks: they take at least this
                self.drain[name] = rate
        if not state.held and state.consumers != 0 and depth > self.allowance(name):
            return QueueState(name, depth, state.consumers, PACED, True)
        return state

    def _paced(self, name: str) -> bool:
        # A queue nobody consumes drains nothing: whether it is held is HOLD_UNCONSUMED_QUEUES' call
        # (tools and benchmarks that read the broker themselves fire into it anyway).
        state = self.states.get(name)
        return state is not None and state.consumers != 0 and self.allowance(name) != math.inf

    def allowance(self, name: str) -> float:
        """Messages queue ``name`` may hold: what its consumers drain in ``max_wait`` seconds
        (infinite while their pace is unmeasured, or without pacing)."""
        rate = self.drain.get(name)
        return math.inf if rate is None or not self.max_wait else rate * self.max_wait

    def note(self, runs) -> None:
        """Count claimed ``runs`` (``task``, ``queue`` each) against their queues' allowance: a queue
        whose depth at its last check plus what was claimed for it since reaches it is held now."""
        if not self.max_wait or not runs:
            return
        names = set()
        for r in runs:
            name = self.destination(r.task, r.queue)
            if name is not None:
                self._sent[name] = self._sent.get(name, 0) + 1
                names.add(name)
        for name in names:
            seen, state = self._seen.get(name), self.states.get(name)
            if seen is not None and state is not None and not state.held and self._paced(name) \
                    and seen[1] + self._sent[name] >= self.allowance(name):
                self.states[name] = QueueState(name, seen[1] + self._sent[name], state.consumers, PACED, True)
                self._params = None
                self.on_pace(name, True, self.drain.get(name))

    def claim_limit(self, batch: int) -> int:
        """At most ``batch`` rows, nor more than the room left in a paced queue that has a backlog
        (at least half its allowance): the claim does not know which queues its rows go to."""
        limit = batch
        for name, (_t, depth) in self._seen.items():
            state = self.states.get(name)
            if state is None or state.held or not self._paced(name):
                continue
            allowance = self.allowance(name)
            queued = depth + self._sent.get(name, 0)
            if queued >= allowance / 2:
                limit = min(limit, max(1, int(allowance - queued)))
        return limit

    def learn(self, rows) -> bool:
        """Resolve the (task, queue) of claimed ``rows`` not seen before and check their queues now;
        True if one of them goes to a held queue (then the claim is to be taken again)."""
        new = {(r.task, r.queue) for r in rows if (r.task, r.queue) not in self.routes}
        if not new:
            return False
        targets = {name for task, queue in new if (name := self.destination(task, queue)) is not None}
        self._check(sorted(n for n in targets if n not in self.states), time.monotonic())
        return any(self.held(name) for name in targets)

    def held(self, name: str | None) -> bool:
        state = self.states.get(name) if name else None
        return bool(state and state.held)

    def claim_params(self) -> dict[str, Any]:
        """The claim statement's exclusions: ``held_queues`` (values of the ``queue`` column),
        ``held_blank`` (the default queue is held) and ``blank_tasks`` (tasks, with an empty
        ``queue`` column, whose route differs from that: held if ``held_blank`` is false, not held
        if it is true)."""
        if self._params is None:
            held = {n for n, s in self.states.items() if s.held}
            default = self.destination("", "")
            held_blank = default in held
            queues = sorted(held | {q for (_t, q), n in self.routes.items() if q and n in held})
            tasks = sorted({t for (t, q), n in self.routes.items() if t and not q and (n in held) != held_blank})
            self._params = {"held_queues": queues, "held_blank": held_blank, "blank_tasks": tasks}
        return self._params

    def close(self) -> None:
        self.stop()
        self.probe.close()


def survey(app: Celery | None = None, extra: set[str] | None = None) -> list[QueueState]:
    """Every queue known here checked once, for ``cron_status`` and the metrics: the default queue,
    the configured ``task_queues``, the routes of the app's tasks, the queues named by jobs (at most
    50, from the index on ``queue``), those live workers consume and ``extra``. Empty on error."""
    from cron_at_scale import conf
    from cron_at_scale.celery_app import get_app

    app = app or get_app()
    gate = QueueGate(app, int(conf.get("MAX_BROKER_DEPTH")), bool(conf.get("HOLD_UNCONSUMED_QUEUES")))
    try:
        gate.seed()
        names = {n for n in gate.routes.values() if n} | set(app.amqp.queues) | set(extra or ())
        for queue in job_queue_names(50):
            if queue:
                names.add(gate.destination("", queue) or queue)
        names |= live_worker_queues() or set()
        return [s for _n, s in sorted(gate.probe.look(sorted(names)).items())]
    except Exception:  # noqa: BLE001 (status must render without the broker)
        log.warning("could not survey the broker's queues", exc_info=True)
        return []
    finally:
        gate.close()
