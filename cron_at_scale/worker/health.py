"""A Celery worker that stops consuming is seen, and recovers or exits so its supervisor restarts it.

After a broker restart a Celery worker can stay alive and consume nothing (seen with Celery 5.7 /
kombu 5.7 on Redis): nothing in Celery notices. :class:`WorkerHealth`, a middleware of
``cron_at_scale.worker.task.MIDDLEWARE``, runs in the worker's main process through its
per-process hooks:

* ``before_worker_boot`` (before the pool forks): a counter shared with the pool processes;
  ``after_worker_boot`` (consuming): the watchdog thread starts; ``after_worker_shutdown``:
  it stops and writes the final row.
* ``after_message_received`` (main process, per message): notes the time in memory. No I/O per task.
* ``before_process_message`` / ``after_process_message`` (pool processes): count the tasks
  executing in that shared counter, so the watchdog knows whether a pool slot is free.
* A watchdog thread wakes every ``WORKER_HEARTBEAT_INTERVAL`` seconds. If nothing was received
  since its last look, it asks the broker how many messages wait in the queues this worker
  started with (one ``queue_declare(passive=True)`` per queue; none while messages keep
  arriving). Messages seen waiting at every look for ``WORKER_STUCK_AFTER`` seconds, with a
  free pool slot and nothing received, make the worker **stuck**. It then (once per process)
  adds back the queue consumers it lost (Celery's ``add_task_queue``, what the ``add_consumer``
  control command does); if it has lost none, or is stuck again, it **exits**: Celery's warm
  shutdown (SIGTERM to itself) with exit status 70, or ``os._exit(70)`` if that shutdown has
  not ended ``WORKER_STUCK_AFTER`` seconds later.
* The same thread upserts the worker's row in ``cron_at_scale_workerhealth`` (one statement
  per interval, database clock): name, queues, pool size and use, messages received and the
  latest one's time, state, when it got stuck. ``cron_status`` and the metrics read it.

Why the broker's queue depth and not the database's unstarted attempts: after a broker restart
the database holds attempts whose messages are gone (until the reaper fires them again), so an
idle healthy worker would look stuck. A message waiting in a queue this worker consumes, while
it has room and takes nothing, is the symptom itself.

Bounds (S = ``WORKER_STUCK_AFTER``, I = ``WORKER_HEARTBEAT_INTERVAL``): stuck is reported
within S + 2I of the consumer stopping (given messages wait); a worker with nothing to re-add
starts its shutdown then; one that re-added consumers and still takes nothing starts it
S + I later; the process is gone at most S after its shutdown began.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

from cron_at_scale.worker.middleware.base import Middleware

log = logging.getLogger(__name__)

EXIT_STATUS = 70  # EX_SOFTWARE: "restart me" for a supervisor (systemd Restart=on-failure, Kubernetes)
KEEP_ROWS = 86400.0  # seconds a row of a worker not seen any more is kept (then deleted by any heartbeat)


class Watchdog:
    """The main process's view of its own consumption (one per worker process; see the module doc)."""

    def __init__(self):
        self.name = ""
        self.pid = os.getpid()
        self.queues: list[str] = []
        self.concurrency = 1
        # Celery's Consumer and WorkController, set when the worker is ready (Celery is untyped here)
        self.consumer: Any = None
        self.worker: Any = None
        self.running = None  # multiprocessing.Value shared with the pool processes
        self.started = time.monotonic()
        self.received = 0
        self.last_received: float | None = None  # monotonic
        self.seen = 0  # self.received at the previous look
        self.waiting: int | None = None
        self.waiting_since: float | None = None  # monotonic: first look of the current run of waiting messages
        self.state = "ok"
        self.stuck_at: float | None = None  # monotonic
        self.stuck_count = 0
        self.recovered = False  # queue consumers re-added once in this process
        self.recovery_deadline = 0.0
        self.exit_requested = False
        self.note = ""
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self._connection = None

    # -- settings -------------------------------------------------------------------------------

    @staticmethod
    def interval() -> float:
        from cron_at_scale import conf

        return float(conf.get("WORKER_HEARTBEAT_INTERVAL"))

    @staticmethod
    def stuck_after() -> float | None:
        from cron_at_scale import conf

        value = conf.get("WORKER_STUCK_AFTER")
        return None if value is None else float(value)

    # -- the look -------------------------------------------------------------------------------

    def busy(self) -> int:
        return max(0, self.running.value) if self.running is not None else 0

    def depth(self) -> int | None:
        """Messages waiting in this worker's queues (None when the broker does not answer)."""
        from kombu.exceptions import ChannelError

        try:
            if self._connection is None:
                self._connection = self.consumer.app.connection_for_read()
            total = 0
            with self._connection.channel() as channel:
                for name in self.queues:
                    try:
                        total += channel.queue_declare(queue=name, passive=True).message_count
                    except ChannelError:  # Redis: an empty queue does not exist
                        pass
            return total
        except Exception as e:  # noqa: BLE001 (a broker down: no verdict this time)
            log.debug("worker health: broker depth unknown: %s", e)
            if self._connection is not None:
                try:
                    self._connection.release()
                finally:
                    self._connection = None
            return None

    def look(self, now: float) -> None:
        """Update ``state`` from what was received since the previous look (called every interval)."""
        stuck_after = self.stuck_after()
        received = self.received
        if received != self.seen:  # consuming: whatever was wrong is over
            self.seen = received
            self.waiting, self.waiting_since = None, None
            if self.state in ("stuck", "recovering"):
                log.warning("worker %s consumes again (%s)", self.name, self.state)
                self.note = f"consuming again ({self.note})" if self.state == "recovering" else ""
                self.state, self.stuck_at = "ok", None
            return
        self.waiting = self.depth()
        if not self.waiting or self.busy() >= self.concurrency:
            self.waiting_since = None  # nothing waits, or no room: not receiving is normal
            if self.state == "stuck" and not self.waiting:
                self.state, self.stuck_at = "ok", None
            return
        if self.waiting_since is None:
            self.waiting_since = now
        if stuck_after is None or now - self.waiting_since < stuck_after:
            return
        if self.state == "ok":
            self.state, self.stuck_at = "stuck", now
            self.stuck_count += 1
            self.note = (f"{self.waiting} messages waited {now - self.waiting_since:.0f} s in {', '.join(self.queues)}"
                         f" with {self.concurrency - self.busy()} free pool slots; nothing received")
            log.error("worker %s stopped consuming: %s", self.name, self.note)

    def act(self, now: float) -> None:
        """Recover or exit a stuck worker (see the module doc)."""
        stuck_after = self.stuck_after()
        if stuck_after is None or self.exit_requested:
            return
        if self.state == "stuck" and not self.recovered:
            lost = self.lost_queues()
            if lost:
                self.recovered = True
                for name in lost:
                    self.consumer.call_soon(self.consumer.add_task_queue, name)
                self.state, self.recovery_deadline = "recovering", now + stuck_after + self.interval()
                self.note = f"re-added consumers of {', '.join(lost)}"
                log.error("worker %s: %s", self.name, self.note)
                return
        if self.state == "stuck" or (self.state == "recovering" and now >= self.recovery_deadline):
            self.exit(f"stuck: {self.note}")

    def lost_queues(self) -> list[str]:
        """Queues this worker started with and no longer consumes."""
        try:
            consuming = {q.name for q in self.consumer.task_consumer.queues}
        except Exception:  # noqa: BLE001 (no task consumer at all: every queue is lost)
            consuming = set()
        return [q for q in self.queues if q not in consuming]

    def exit(self, why: str) -> None:
        """Warm shutdown with exit status 70 now; ``os._exit(70)`` if still running S seconds later."""
        self.exit_requested = True
        self.state, self.note = "exiting", why[:1000]
        log.critical("worker %s exits (status %d) so that its supervisor restarts it: %s", self.name,
                     EXIT_STATUS, why)
        try:
            self.write()
        except Exception:  # noqa: BLE001 (exiting anyway)
            log.exception("worker health: could not record the exit")
        grace = self.stuck_after() or 60.0
        timer = threading.Timer(grace, self._hard_exit, args=(grace,))
        timer.daemon = True  # a finished warm shutdown must not wait for it
        timer.start()
        os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown; worker_shutdown sets the status

    def _hard_exit(self, grace: float) -> None:
        log.critical("worker %s: warm shutdown did not end within %.0f s; exiting now", self.name, grace)
        logging.shutdown()
        os._exit(EXIT_STATUS)

    # -- the row ----------------------------------------------------------------------------------

    def write(self) -> None:
        import json

        from cron_at_scale import sql as db
        from cron_at_scale.worker import clock as worker_clock

        worker_clock.measure()  # with each heartbeat: when to start messages published ahead of their fire_at
        now = time.monotonic()
        db.run("worker_health", {
            "name": self.name, "pid": os.getpid(), "queues": json.dumps(self.queues),
            "concurrency": self.concurrency, "running": self.busy(), "received": self.received,
            "age": now - self.started,
            "received_ago": None if self.last_received is None else now - self.last_received,
            "waiting": self.waiting, "state": self.state,
            "stuck_for": None if self.stuck_at is None else now - self.stuck_at,
            "stuck_count": self.stuck_count, "note": self.note, "keep": KEEP_ROWS,
        }, fetch="count", retries=0)

    # -- the thread -------------------------------------------------------------------------------

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="cron_at_scale-watchdog", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        from django.db import connections

        from cron_at_scale import sql as db

        try:  # at once: the dispatchers hold a queue's jobs (Redis) until a live worker lists it
            self.write()
        except Exception as e:  # noqa: BLE001 (a database blip: next time)
            log.warning("worker health: first heartbeat failed: %s", str(e).strip()[:200])
            db.reset_connection()
        while not self.stopping.wait(self.interval()):
            now = time.monotonic()
            try:
                self.look(now)
                self.act(now)
            except Exception:  # noqa: BLE001 (the watchdog must outlive a bug of one look)
                log.exception("worker health: check failed")
            if self.stopping.is_set():
                break
            try:
                self.write()
            except Exception as e:  # noqa: BLE001 (a database blip: next time)
                log.warning("worker health: heartbeat failed: %s", str(e).strip()[:200])
                db.reset_connection()
        connections.close_all()  # this thread's own

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(5.0)
        if self._connection is not None:
            try:
                self._connection.release()
            except Exception:  # noqa: BLE001
                pass


watchdog = Watchdog()


class WorkerHealth(Middleware):
    """The process's :data:`watchdog`, driven by the worker's per-process hooks (see the module doc)."""

    def before_worker_boot(self, worker: Any) -> None:
        # Main process, before the pool forks: the counter the pool processes share with it.
        watchdog.pid = os.getpid()
        watchdog.worker = worker
        watchdog.running = multiprocessing.Value("i", 0)
        concurrency = getattr(worker, "concurrency", None)
        watchdog.concurrency = max(1, int(concurrency)) if isinstance(concurrency, int) else 1

    def after_worker_boot(self, consumer: Any) -> None:
        if consumer is None or watchdog.thread is not None:
            return
        watchdog.consumer = consumer
        watchdog.name = consumer.hostname
        watchdog.queues = sorted({q.name for q in consumer.task_consumer.queues})
        watchdog.started = time.monotonic()
        watchdog.start()

    def after_message_received(self, request: Any) -> None:
        # Per message, main process: memory only (the heartbeat writes it).
        watchdog.received += 1
        watchdog.last_received = time.monotonic()

    def before_process_message(self, task: Any) -> None:
        counter = watchdog.running
        if counter is not None:
            with counter.get_lock():
                counter.value += 1

    def after_process_message(self, task: Any) -> None:
        counter = watchdog.running
        if counter is not None:
            with counter.get_lock():
                counter.value -= 1

    def after_worker_shutdown(self, worker: Any) -> None:
        if watchdog.thread is None or watchdog.pid != os.getpid():
            return
        watchdog.stop()
        if watchdog.exit_requested:
            if worker is not None:
                worker.exitcode = EXIT_STATUS  # what `celery worker` exits with
            return
        watchdog.state, watchdog.note = "stopped", ""
        try:
            watchdog.write()
        except Exception:  # noqa: BLE001 (the row ages out; cron_status shows it not alive)
            log.warning("worker health: could not record the shutdown")
