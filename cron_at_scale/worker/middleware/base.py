"""The middleware base: hooks, the per-message run, and the exception that skips a message."""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore

if TYPE_CHECKING:
    from cron_at_scale.worker.middleware.context import JobContext



class SkipJob(Ignore):
    """This message is not to run (a duplicate, a superseded attempt, a cancelled job): Celery
    acknowledges it and records no failure (it is Celery's ``Ignore``)."""


@dataclass
class Run:
    """One scheduled message in a worker, as the middleware sees it."""

    task: Any  # the JobTask
    meta: dict  # the message's cron_at_scale header: job_id, attempt, fire_at, occurrence
    worker: str  # this process's name (host:pid), written on the attempt
    job_id: str = ""
    attempt: int = 0  # the attempt this message runs (a reaped message may run a later one)
    row: Any = None  # start_attempt's row, by column name
    ctx: JobContext | None = None  # what current_job() returns
    outcome: str = ""  # 'succeeded', 'retried' or 'failed' once known
    error: str = ""  # the recorded error of a failure
    state: dict = field(default_factory=dict)  # a middleware's own per-run values


class Middleware:
    """A concern of a scheduled run. Every hook does nothing unless overridden."""

    def before_run(self, run: Run) -> None:
        """Before the task; raise :class:`SkipJob` to not run it."""

    def after_failure(self, run: Run, exc: Exception) -> None:
        """The task raised ``exc``."""

    def after_success(self, run: Run, result: Any) -> None:
        """The task returned ``result``."""

    def after_run(self, run: Run) -> None:
        """Always, after the task (or after a later middleware skipped it)."""


