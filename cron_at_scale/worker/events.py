"""Celery's task events for the attempts Celery itself sees as ignored: what a monitor (Flower,
``celery events``, anything built on ``celery.events.state.State``) needs to end each attempt
in its real final state.

A scheduled run that the middleware ends as a database state (retried with backoff) or does
not run (cancelled, expired, skipped) ends, for Celery, in :class:`~cron_at_scale.worker.middleware.SkipJob`,
Celery's ``Ignore``; Celery sends no event for an ignored task, so its ``task-started`` would
be the attempt's last word. :class:`AnnouncingRequest`, the base of the task class's request
class (:class:`cron_at_scale.worker.clock.JobRequest`), sends in the worker's main process,
after Celery's own handling of the ignored task, the event Celery sends for that end
(https://docs.celeryq.dev/en/stable/userguide/monitoring.html#event-reference):

============ ==================================================================================
outcome      event (fields as Celery sends them)
============ ==================================================================================
retried      ``task-retried`` (``exception``: the error's repr, ``traceback``), as
             ``Request.on_retry`` sends it; the next attempt is another task id. An attempt
             whose pool process died (``worker.lost``) and which the parent retried gets it
             after Celery's own ``task-failed``
cancelled    ``task-revoked`` (``terminated=False, signum=None, expired=False``): the job was
             cancelled before the attempt started, or while it ran and the task returned
expired      ``task-revoked`` (``expired=True``): not started within the job's ``expires``, as
             Celery announces a task it drops as expired
skipped      ``task-revoked`` (``expired=False``): a duplicate or superseded message, or a job
             that an earlier attempt completed
============ ==================================================================================

The events go through ``Request.send_event``, the worker's own dispatcher: sent only when the
worker sends task events (``worker_send_task_events``, ``celery worker -E``, or the
``enable_events`` control command), exactly as Celery's own; nothing is done when it does not.
They come from the main process after its ``task-started`` for the same task, so a monitor
receives them in order.
"""

from __future__ import annotations

from typing import Any

from billiard.einfo import ExceptionWithTraceback
from celery.worker.request import Request

from cron_at_scale.worker.middleware.base import SkipJob


def event_for(skip: SkipJob) -> tuple[str, dict[str, Any]]:
    """The Celery event type and fields that end an attempt ended by ``skip``."""
    if skip.outcome == "retried":
        return "task-retried", {"exception": skip.error, "traceback": skip.trace}
    return "task-revoked", {"terminated": False, "signum": None, "expired": skip.outcome == "expired"}


class AnnouncingRequest(Request):
    """Celery's request, which after an attempt ended by :class:`SkipJob` sends its event
    (:func:`event_for`), and after the death of the pool process running it, when the parent
    recorded the attempt retried (:mod:`cron_at_scale.worker.lost` sets :attr:`retried_in_parent`
    from Celery's ``task_failure`` signal, sent before Celery's ``task-failed``), follows that
    ``task-failed`` with ``task-retried``; every other end is Celery's own."""

    # (exception repr, traceback text) of a dead pool process's attempt the parent retried
    retried_in_parent: tuple[str, str] | None = None

    def on_failure(self, exc_info, send_failed_event=True, return_ok=False):
        done = super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):  # as Celery unwraps it
            exc = exc.exc
        if isinstance(exc, SkipJob):
            event, fields = event_for(exc)
            self.send_event(event, **fields)
        self.announce_parent_retry()
        return done

    def on_timeout(self, soft, timeout):
        done = super().on_timeout(soft, timeout)
        if not soft:  # a hard time limit: Celery sends task-failed from here too (5.7)
            self.announce_parent_retry()
        return done

    def announce_parent_retry(self) -> None:
        """``task-retried`` for an attempt whose dead pool process the parent recorded retried: the
        last event of its task, after each ``task-failed`` Celery sends for that death."""
        if self.retried_in_parent is not None:
            exception, trace = self.retried_in_parent
            self.send_event("task-retried", exception=exception, traceback=trace)
