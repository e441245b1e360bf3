"""Batched starts (``CRON_AT_SCALE["BATCH_STARTS"]``): the worker's main process starts the
scheduled messages it received together, in one statement, before any reaches a pool process.

Without it, each pool process starts its message itself: one ``start_attempt`` per task, each
its own statement, plan, transaction and flush. Most of that statement's cost in PostgreSQL is
the same whatever the number of rows it touches (``docs/benchmarks.md``, "Batched starts"), so
the main process collects the messages Celery hands over in one pass of its event loop and starts
them with one ``start_attempts`` (synchronous commit: promise 1 of ``docs/guarantees.md`` holds,
no task reaches a pool process before its start is durable). Each message then goes to the pool
as Celery would send it, its started row in the request (``request_dict[STARTED]``, pickled to
the pool process with it), and :class:`~cron_at_scale.worker.middleware.start.IdempotentStart`
runs it without a statement.

The rules that keep a batch's start as safe as a pool process's own:

* **Fresh, or confirmed.** A pool process that begins a message more than :data:`FRESH` seconds
  after its batch was started (it waited in the pool behind other tasks) starts it again under
  the same token, as before: it runs only if the attempt is still this message's, and it sees a
  cancellation made meanwhile.
* **Leases of the waiting ones.** Until a pool process accepts it, a started message's lease is
  renewed by the main process (:class:`Waiting`, on a thread of its own, every
  ``HEARTBEAT_INTERVAL``), so a message held behind long tasks is not reaped as lost.
* **Handed back at shutdown.** Started messages no pool process accepted are put back to
  ``dispatched`` when the worker stops (``hand_back_attempts``); their messages go back to the
  broker unacknowledged and start again wherever they are delivered next.
* **A dead pool process** is recorded by :mod:`cron_at_scale.worker.lost`, which finds the
  attempt by its run token.

* **Set aside when waiting.** A started message still waiting for a pool process once its batch's
  start no longer stands (:data:`FRESH`, and as long again) is unmarked as started
  (:meth:`Waiting.set_aside`), so that if the whole worker dies the reaper counts it as lost before
  any worker began it, not toward ``MAX_LOST_ATTEMPTS``.

What it costs: if the whole worker is killed (``kill -9`` of its main process) the attempts of
its started batch that no pool process had begun are reaped after ``RUN_LEASE`` and fired again;
those started within the last ~2 s (not yet set aside) count as lost attempts toward
``MAX_LOST_ATTEMPTS``, as the one that was running does.

Wired as the task class's Celery strategy (``JobTask.Strategy``, Celery's documented
``Task.Strategy``): Celery's own ``default`` strategy, given a view of the consumer whose
``on_task_request`` (the call that hands a request to the pool) goes through :meth:`BatchStarter.receive`.
With ``BATCH_STARTS`` off it is Celery's strategy unchanged.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from datetime import datetime
from typing import Any
from uuid import uuid4

from celery.concurrency.solo import TaskPool as SoloPool
from celery.worker import state as worker_state
from celery.worker.strategy import default as celery_strategy
from kombu.asynchronous import get_event_loop

from cron_at_scale import conf
from cron_at_scale import sql as db
from cron_at_scale.broker.message import HEADER
from cron_at_scale.ops.identity import process_name
from cron_at_scale.worker import attempts
from cron_at_scale.worker.middleware.base import Middleware
from cron_at_scale.worker.middleware.lease import Heartbeat

log = logging.getLogger(__name__)

STARTED = "cron_at_scale_started"  # request_dict key: {"row": the started row or None, "token", "until"}
FRESH = 1.0  # seconds a batch's start stands for the pool process that begins the message
MAX_BATCH = 200  # messages per statement; more received within HOLD make several
# Seconds the first message of a batch waits at most for others while the pool is busy: Celery's
# Redis transport hands over one message per pass of the event loop (one BRPOP each), so a batch of
# one pass is mostly one. With a pool slot free nothing waits: the message would run at once.
HOLD = 0.003
# Seconds without a new message that close a batch before HOLD, when no request waits for a pool
# slot ahead of it: the batch would otherwise wait for others while the pool could take it (a lone
# message at 100 jobs/s waited the whole HOLD). With requests ahead of it, it waits for them anyway:
# then only HOLD closes it, and batches stay as large (a flood's messages come up to ~1 ms apart).
GAP = 0.0008


def started_of(request: Any) -> dict | None:
    """The batch start a Celery request (or task request context) carries, or None."""
    value = getattr(request, STARTED, None)
    if value is None and isinstance(getattr(request, "request_dict", None), dict):
        value = request.request_dict.get(STARTED)
    return value if isinstance(value, dict) else None


def fresh_row(started: dict):
    """The started row of ``started`` (:func:`started_of`) if it is still fresh (None: the message is
    not to run), or raise ``LookupError``: the pool process must start the message itself."""
    if time.monotonic() >= started["until"]:
        raise LookupError("stale")
    if started["row"] is None:
        return None
    dates = set(started.get("dates", ()))
    return db.as_row({k: datetime.fromisoformat(v) if k in dates and v is not None else v
                      for k, v in started["row"].items()})


def _portable(row) -> tuple[dict, list[str]]:
    """``row`` as a dict for the pool process, its datetimes as ISO 8601 text (and their names):
    pickle names a class by its module path, and a process whose ``datetime.datetime`` was replaced
    (a faked clock in tests, freezegun) cannot pickle the datetimes psycopg made."""
    values: dict = {}
    dates: list[str] = []
    for k, v in row._asdict().items():
        if k == "token":
            continue
        if isinstance(v, datetime):
            v = v.isoformat()
            dates.append(k)
        values[k] = v
    return values, dates


class _WaitingRun:
    """A started message no pool process accepted yet, as the heartbeat sees it."""

    __slots__ = ("job_id", "attempt", "token", "request", "cancel_requested", "lease_lost", "started_at", "stands_until")

    def __init__(self, job_id: str, attempt: int, token: str, request: Any, started_at: Any = None,
                 stands_until: float = float("inf")) -> None:
        self.job_id, self.attempt, self.token = job_id, attempt, token
        self.request = weakref.ref(request)
        self.cancel_requested = self.lease_lost = False
        # the batch's started_at (aware UTC), and until when (monotonic) the batch's start stands
        # for the pool process that begins it; after that it is set aside (Waiting.set_aside)
        self.started_at, self.stands_until = started_at, stands_until

    def state(self) -> str:
        """``accepted`` (a pool process took it: its own heartbeat has it), ``waiting``, or ``gone``
        (Celery let the request go and no pool process accepted it: revoked, shut down; an accepted
        one left at once, :meth:`Waiting.accepted`).

        Gone too: a request no longer among Celery's reserved ones once its batch's start stopped
        standing. A lost broker connection makes Celery drop every reserved request no pool process
        accepted (its consumer's ``on_close`` and the pool's ``flush``: "they will be redelivered by
        the broker"), while a reference may keep the object alive. Renewed as waiting, its attempt
        would stay started forever and the redelivered message find it taken; handed back, that
        message starts it. A pool process that still begins it confirms its start in the database."""
        request = self.request()
        if request is None:
            return "gone"
        if request.worker_pid is not None:
            return "accepted"
        if time.monotonic() >= self.stands_until and request not in worker_state.reserved_requests:
            return "gone"
        return "waiting"


class Waiting:
    """The started messages of this main process no pool process accepted yet: their leases renewed
    every ``HEARTBEAT_INTERVAL`` on a thread of their own, and handed back at shutdown."""

    def __init__(self) -> None:
        self.heartbeat = Heartbeat()
        self.thread_host = attempts.BatchCompleter()  # its thread and connection, not the pool's
        self.thread_host.every(lambda: float(conf.get("HEARTBEAT_INTERVAL")), self.beat)
        self.thread_host.every(FRESH, self._set_aside_due)

    def accepted(self, request: Any) -> None:
        """A pool process accepted ``request`` (Celery's ``Request.on_accepted``, main process): its
        run leaves the waiting ones, its pool process's heartbeat renews it from now."""
        started = started_of(request)
        if started is None or not started["row"]:
            return
        key = (str(request.request_dict[HEADER]["job_id"]), int(started["row"]["attempt"]))
        with self.heartbeat.lock:
            self.heartbeat.running.pop(key, None)

    def add(self, run: _WaitingRun) -> None:
        self.heartbeat.running[(run.job_id, run.attempt)] = run  # type: ignore[assignment]
        self.thread_host.ensure_thread()

    def prune(self) -> tuple[list[_WaitingRun], list[_WaitingRun]]:
        """Drop the runs a pool process accepted and those Celery let go; return ``(waiting, gone)``."""
        waiting: list[_WaitingRun] = []
        gone: list[_WaitingRun] = []
        with self.heartbeat.lock:
            for key, run in list(self.heartbeat.running.items()):
                state = run.state()  # type: ignore[attr-defined]
                if state != "waiting":
                    del self.heartbeat.running[key]
                    if state == "gone":
                        gone.append(run)  # type: ignore[arg-type]
                else:
                    waiting.append(run)  # type: ignore[arg-type]
        return waiting, gone

    def beat(self) -> None:
        """Renew the waiting runs' leases; hand back those Celery let go."""
        waiting, gone = self.prune()
        if gone:
            self.hand_back(gone)
        if waiting:
            self.heartbeat.beat()

    def set_aside(self, now: float | None = None) -> int:
        """Unmark as started (``set_aside_waiting_attempts``) the waiting runs whose batch start no
        longer stands for a pool process (:data:`FRESH` and a margin the same again, on the
        monotonic clock ``now``), each once: a ``kill -9`` of the whole worker then costs them no
        lost attempt. Return how many rows were unmarked."""
        now = time.monotonic() if now is None else now
        with self.heartbeat.lock:  # not pruned here: the gone ones are for beat and hand_back
            runs: list[Any] = list(self.heartbeat.running.values())
        due = [r for r in runs if r.started_at is not None and now >= r.stands_until + FRESH and r.state() == "waiting"]
        n = 0
        for alias, group in conf.by_job_alias(due, lambda r: r.job_id).items():
            with conf.using(alias):
                try:
                    n += db.run("set_aside_waiting_attempts", {
                        "job_ids": [r.job_id for r in group], "attempts": [r.attempt for r in group],
                        "tokens": [r.token for r in group], "started": [r.started_at for r in group],
                    }, fetch="count")
                except Exception as e:  # noqa: BLE001 (left marked: counted if the worker dies, as before)
                    log.warning("setting aside %d waiting runs on database %r failed: %s", len(group), alias,
                                str(e).strip()[:200])
                    db.reset_connection()
                    continue
            for r in group:
                r.started_at = None
        return n

    def _set_aside_due(self) -> None:
        self.set_aside()

    def hand_back(self, runs: list[_WaitingRun] | None = None) -> int:
        """Put ``runs`` (by default every run not accepted: the worker stops) back to ``dispatched``;
        return how many were."""
        if runs is None:
            waiting, gone = self.prune()
            runs = waiting + gone
            self.clear()
        n = 0
        for alias, group in conf.by_job_alias(runs, lambda r: r.job_id).items():
            with conf.using(alias):
                n += db.run("hand_back_attempts", {
                    "job_ids": [r.job_id for r in group], "attempts": [r.attempt for r in group],
                    "tokens": [r.token for r in group], "lease": float(conf.get("DISPATCH_LEASE")),
                }, fetch="count")
        if n:
            log.info("handed back %d started messages no pool process began", n)
        return n

    def clear(self) -> None:
        with self.heartbeat.lock:
            self.heartbeat.running.clear()


class BatchStarter:
    """Collects the scheduled requests Celery hands over within ``HOLD`` seconds (or ``GAP``:
    :meth:`receive`) and starts them in one statement per database
    (:func:`~cron_at_scale.worker.attempts.write_many`)."""

    def __init__(self) -> None:
        self.queue: list[tuple[Any, Any]] = []  # (Celery's handler, request)
        self.lock = threading.Lock()
        self.batch = 0  # which batch the queue holds: a linger timer of an earlier one does nothing
        self.first_at = self.last_at = 0.0  # monotonic: the batch's first and latest message
        self.queued_behind = False  # a message of the batch came while others waited for a pool slot
        self.waiting = Waiting()

    def receiver(self, handle, consumer=None):
        """The ``on_task_request`` of the consumer view: scheduled requests are batched, others go
        to ``handle`` (Celery's own) at once. ``consumer`` (Celery's) tells how many requests its
        pool can run at once."""
        def receive(request):
            self.receive(handle, request, slots=_pool_slots(consumer))
        return receive

    def receive(self, handle, request, slots: int | None = None) -> None:
        """Queue ``request`` for the next batch; start the batch now if it is full or if there is no
        event loop to wait on, else ``HOLD`` seconds after the batch's first; or sooner, once no
        other came for ``GAP`` seconds, if no request waits for a pool slot ahead of the batch.
        With a pool slot free (no more than ``slots`` requests reserved, this one included: it runs
        at once) nothing waits: a batch already held is started now with it, and a request alone
        goes to the pool unstarted, its pool process starting it (``start_attempt``, which also
        carries that process's completions: a batch of one would be a statement more, on the main
        process's event loop)."""
        header = (request.request_dict or {}).get(HEADER)
        if not isinstance(header, dict):
            handle(request)
            return
        reserved = len(worker_state.reserved_requests)  # this one included
        free = slots is not None and reserved <= slots
        now = time.monotonic()
        with self.lock:
            alone = free and not self.queue and conf.get("BATCH_STARTS") != "always"
            if not alone:
                self.queue.append((handle, request))
                self.last_at = now
            first, full, batch = len(self.queue) == 1, len(self.queue) >= MAX_BATCH, self.batch
            if first:
                self.first_at, self.queued_behind = now, False
            # more reserved than the pool runs and this batch holds: requests wait ahead of it
            self.queued_behind |= slots is None or reserved - len(self.queue) > slots
        if alone:
            handle(request)
            return
        hub = get_event_loop()
        if full or free or hub is None:
            self.flush()
        elif first:
            hub.call_later(GAP, self._linger, hub, batch)

    def _linger(self, hub, batch: int) -> None:
        """The held batch ``batch`` is started once its first has waited ``HOLD``, or once the
        messages stopped coming (``GAP``) with none waiting ahead of it; else this looks again when
        one of those would be true."""
        now = time.monotonic()
        with self.lock:
            if batch != self.batch or not self.queue:
                return
            quiet, held = now - self.last_at, now - self.first_at
            gap = HOLD if self.queued_behind else GAP
        if quiet >= gap or held >= HOLD:
            self.flush()
        else:
            hub.call_later(max(0.0001, min(gap - quiet, HOLD - held)), self._linger, hub, batch)

    def flush(self) -> None:
        """Start what was received, then hand each request to the pool."""
        with self.lock:
            batch, self.queue = self.queue, []
            self.batch += 1
        if not batch:
            return
        tokens = [str(uuid4()) for _ in batch]
        headers = [r.request_dict[HEADER] for _, r in batch]
        keys = [(str(h["job_id"]), int(h["attempt"])) for h in headers]
        fire_ats = [h.get("fire_at") for h in headers]
        began = time.monotonic()
        rows, failed = self._start(keys, tokens, fire_ats)
        until = began + min(FRESH, float(conf.get("RUN_LEASE")) - float(conf.get("HEARTBEAT_INTERVAL")))
        for (handle, request), (job_id, _), token in zip(batch, keys, tokens):
            if job_id not in failed:
                row = rows.get(token)
                values, dates = (None, []) if row is None else _portable(row)
                request.request_dict[STARTED] = {"row": values, "dates": dates, "token": token, "until": until}
                if row is not None and row.outcome == "running":
                    self.waiting.add(_WaitingRun(job_id, row.attempt, token, request, row.started_at, until))
            try:
                handle(request)
            except Exception:  # noqa: BLE001 (Celery's handler failing one request must not drop the rest)
                log.exception("handing scheduled message %s to the pool failed", request.id)

    def _start(self, keys: list[tuple[str, int]], tokens: list[str],
               fire_ats: list[str | None]) -> tuple[dict, set[str]]:
        by_alias = conf.by_job_alias(range(len(keys)), lambda i: keys[i][0])
        rows: dict[str, Any] = {}
        failed: set[str] = set()
        worker = process_name()
        for alias, idx in by_alias.items():
            with conf.using(alias):
                try:
                    for row in attempts.write_many([(*keys[i], tokens[i], fire_ats[i]) for i in idx], worker):
                        rows[str(row.token)] = row
                except Exception as e:  # noqa: BLE001 (the pool processes start these themselves, as without batches)
                    log.warning("starting a batch of %d messages on database %r failed (%s); their pool processes "
                                "start them", len(idx), alias, str(e).strip()[:200])
                    db.reset_connection()
                    failed.update(keys[i][0] for i in idx)
        return rows, failed


starter = BatchStarter()


def _pool_slots(consumer) -> int | None:
    """How many requests ``consumer``'s pool runs at once (its processes or threads), or None: the
    solo pool runs each request inside the hand-over, so a free slot there says nothing of what
    else is arriving, and its batches come from the hold alone."""
    if isinstance(getattr(consumer, "pool", None), SoloPool):
        return None
    try:
        return max(1, int(consumer.pool.num_processes))
    except (AttributeError, TypeError, ValueError):
        return None


class _ConsumerView:
    """Celery's consumer, but for ``on_task_request``: what the strategy hands to the pool goes
    through the batch starter first, at once or, for a message with an eta (``ETA_LEAD``: every run
    claimed ahead of its ``fire_at``), when its timer fires. A task with a Celery ``rate_limit`` goes
    through Celery's token bucket, which hands it to the pool itself: its pool process starts it."""

    def __init__(self, consumer, on_task_request) -> None:
        self._consumer = consumer
        self.on_task_request = on_task_request

    def apply_eta_task(self, request) -> None:
        """Celery's ``Consumer.apply_eta_task`` (its timer calls it at the eta), its request handed
        to the batch starter instead of straight to the pool: else a run published ahead would wait
        in the pool unstarted, its dispatch lease running out behind long tasks."""
        worker_state.task_reserved(request)
        self.on_task_request(request)
        self._consumer.qos.decrement_eventually()

    def __getattr__(self, name: str):
        return getattr(self._consumer, name)


def strategy(task, app, consumer, **kwargs):
    """``JobTask.Strategy``: Celery's default strategy, its requests batched when
    ``BATCH_STARTS`` is on."""
    if not conf.get("BATCH_STARTS"):
        return celery_strategy(task, app, consumer, **kwargs)
    return celery_strategy(task, app, _ConsumerView(consumer, starter.receiver(consumer.on_task_request, consumer)), **kwargs)


class BatchStarts(Middleware):
    """The batch starter's process hooks: a pool process drops its parent's state; the main
    process hands back, at the end of its shutdown, what no pool process began."""

    def after_process_boot(self) -> None:
        # New objects, not the parent's emptied: a lock one of the main process's threads (the
        # waiting runs' lease thread) held at the fork stays held in this copy for good, and
        # taking it here would hang the pool process before its first task.
        starter.lock = threading.Lock()
        starter.queue = []
        starter.waiting = Waiting()

    def after_worker_shutdown(self, worker: Any) -> None:
        if conf.get("BATCH_STARTS"):
            starter.waiting.thread_host.stop()
            starter.waiting.hand_back()
