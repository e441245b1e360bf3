"""Drop-in for ``celery beat``: ``celery -A proj beat -S cron_at_scale.beat:Scheduler``.

With this scheduler, ``celery beat`` stops being a clock: at start it copies
``app.conf.beat_schedule`` into recurring jobs (:func:`sync_beat_schedule`),
then every ``tick()`` is one dispatcher step (claim due jobs from PostgreSQL,
publish them; reap expired leases every ``REAPER_INTERVAL``). Any number of
beats may run at once, like dispatchers. Beat's own schedule file is never
opened: the jobs table is the state.

The mapping of entries to jobs is :mod:`cron_at_scale.beat.mapping`'s, the sync
:mod:`cron_at_scale.beat.sync`'s.
"""

from __future__ import annotations

import logging
import signal
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from celery import beat as celery_beat
from celery import schedules
from django.db import InterfaceError, OperationalError

from cron_at_scale.beat.sync import SyncReport, sync_beat_schedule

if TYPE_CHECKING:
    from cron_at_scale.dispatcher.loop import Dispatcher

log = logging.getLogger(__name__)


@contextmanager
def _signals_held():
    """Hold SIGTERM/SIGINT for one dispatcher step, so a claimed batch is always published first.

    (Beat's handler raises ``SystemExit``; it runs as soon as the step ends.)
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Scheduler(celery_beat.Scheduler):
    """A ``celery beat`` scheduler that is a cron_at_scale dispatcher (``-S cron_at_scale.beat:Scheduler``).

    ``setup_schedule()`` syncs ``beat_schedule`` (plus beat's default
    ``celery.backend_cleanup`` entry when the result backend needs it) into
    jobs; ``tick()`` runs one dispatcher step and returns the seconds to
    sleep: 0 after a full batch, else ``POLL_INTERVAL`` (after a database
    error, a backoff up to 5 s). ``sync()`` is a no-op (the state is in
    PostgreSQL); ``close()`` (idempotent) stops the dispatcher and closes its
    broker and database connections.
    """

    def __init__(self, app, *args, **kwargs):
        self.dispatcher: Dispatcher | None = None  # made by setup_schedule()
        self.report: SyncReport | None = None
        self._backoff = 0.0
        super().__init__(app, *args, **kwargs)  # calls setup_schedule() unless lazy

    def _default_entries(self) -> dict[str, Any]:
        """Beat's own default entry (see ``celery.beat.Scheduler.install_default_entries``)."""
        if self.app.conf.result_expires and not self.app.backend.supports_autoexpire:
            return {"celery.backend_cleanup": {"task": "celery.backend_cleanup", "schedule": schedules.crontab("0", "4", "*")}}
        return {}

    def setup_schedule(self) -> None:
        from cron_at_scale.dispatcher.loop import Dispatcher

        entries = {**self._default_entries(), **(self.app.conf.beat_schedule or {})}
        self.report = sync_beat_schedule(entries, app=self.app)
        # entries not mapped do not run: said at ERROR, where operators look
        log.log(logging.ERROR if self.report.unsupported else logging.INFO, "beat_schedule synced to jobs: %s",
                self.report.summary())
        self.dispatcher = Dispatcher(app=self.app)

    def tick(self, *args, **kwargs) -> float:
        from cron_at_scale import sql as db

        d = self.dispatcher
        if d is None:
            raise RuntimeError("tick() before setup_schedule(), or after close()")
        try:
            with _signals_held():
                claimed = d.step()
        except (OperationalError, InterfaceError) as e:
            self._backoff = min(5.0, (self._backoff or 0.1) * 2)
            log.warning("database unavailable (%s); retrying in %.1fs", str(e).strip()[:200], self._backoff)
            db.reset_connection()
            return self._backoff
        self._backoff = 0.0
        return 0.0 if claimed >= d.batch_size else d.next_wait()

    def sync(self) -> None:
        """Nothing to save: every job and its next fire time is in PostgreSQL."""

    def close(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.stop()
            self.dispatcher.close()  # held runs published at their time, shards released, broker connection closed
            log.info("dispatcher %s stopped: %d claimed, %d published", self.dispatcher.name,
                     self.dispatcher.claimed_total, self.dispatcher.published_total)
            self.dispatcher = None
            from cron_at_scale import sql as db

            db.get_connection().close()
        super().close()

    @property
    def info(self) -> str:
        return "    . scheduler -> cron_at_scale dispatcher (jobs in PostgreSQL)"


__all__ = ["Scheduler"]
