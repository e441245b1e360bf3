"""The middleware base: hooks, the per-message run, and the exception that skips a message."""


from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery.exceptions import Ignore

if TYPE_CHECKING:
    from cron_at_scale.worker.middleware.context import JobContext



class SkipJob(Ignore):
    """This message is not to run (a duplicate, a superseded attempt, a cancelled job), or its
    attempt ended as a database state (retried): Celery acknowledges it and records no failure
    (it is Celery's ``Ignore``).

    ``outcome`` says how the attempt ended, for the task event the worker's main process sends
    in its place (:mod:`cron_at_scale.worker.events`): ``"skipped"`` (the default: a duplicate,
    a superseded or early message, a job already completed), ``"cancelled"``, ``"expired"``
    (not started within the job's ``expires``), or ``"retried"`` with the error's ``error``
    (its repr) and ``trace`` (its formatted traceback). It crosses from the pool process to the
    main process pickled: every field is in ``args``."""

    def __init__(self, outcome: str = "skipped", error: str = "", trace: str = "") -> None:
        super().__init__(outcome, error, trace)
        self.outcome, self.error, self.trace = outcome, error, trace

    def __str__(self) -> str:  # Celery logs an ignored task with it: the outcome, not the traceback
        return self.outcome


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
    """A concern of the worker. Every hook does nothing unless overridden; a middleware overrides
    the hooks of its concern (dramatiq's shape). The hooks of every middleware in
    :data:`cron_at_scale.worker.task.MIDDLEWARE` run in that list's order, except ``after_run``
    (in reverse). A hook's lists are read when a worker (or pool process) starts, and again
    whenever ``MIDDLEWARE`` changes.

    **Per scheduled message**, in the pool process, around the task (called by ``JobTask``;
    a message without the ``cron_at_scale`` header runs none of them):
    :meth:`before_run`, :meth:`after_failure`, :meth:`after_success`, :meth:`after_run`.

    **Per process**, called from Celery's signals by :mod:`cron_at_scale.worker.signals`
    (any task class, any message):

    ========================== ======================================== ==========================
    hook                       when, where                              Celery signal
    ========================== ======================================== ==========================
    before_worker_boot(w)      worker main process, before the pool     ``worker_init``
                               forks (``w``: Celery's WorkController)
    after_worker_boot(c)       main process, consuming (``c``: its      ``worker_ready``
                               Consumer)
    after_process_boot()       each pool process, after its fork        ``worker_process_init``
    before_process_shutdown()  a pool process, as it exits              ``worker_process_shutdown``
    before_worker_shutdown()   main process, its shutdown begins        ``worker_shutting_down``
    after_worker_shutdown(w)   main process, the pool stopped           ``worker_shutdown``
    after_message_received(r)  main process, per message (``r``:        ``task_received``
                               Celery's Request); no I/O here
    before_process_message(t)  the process running task ``t``, before   ``task_prerun``
    after_process_message(t)   ... and after it, whatever its outcome   ``task_postrun``
    after_task_failure(t, id,  a task failed: in the pool process for   ``task_failure``
    exc)                       an exception, in the main process for
                               a pool process that died
    ========================== ======================================== ==========================

    A hook's exception is logged and the other middleware's hooks still run (Celery's own rule
    for signal receivers); per-message hooks' exceptions propagate as the task's.
    """

    # -- per scheduled message ------------------------------------------------------------------

    def before_run(self, run: Run) -> None:
        """Before the task; raise :class:`SkipJob` to not run it."""

    def after_failure(self, run: Run, exc: Exception) -> None:
        """The task raised ``exc``."""

    def after_success(self, run: Run, result: Any) -> None:
        """The task returned ``result``."""

    def after_run(self, run: Run) -> None:
        """Always, after the task (or after a later middleware skipped it)."""

    # -- per process ------------------------------------------------------------------------------

    def before_worker_boot(self, worker: Any) -> None:
        """Main process, before the pool forks: state the pool processes share is made here."""

    def after_worker_boot(self, consumer: Any) -> None:
        """Main process, the consumer is ready: threads that watch it start here."""

    def after_process_boot(self) -> None:
        """A pool process, after its fork: drop state copied from the parent."""

    def before_process_shutdown(self) -> None:
        """A pool process is exiting: write what it holds."""

    def before_worker_shutdown(self) -> None:
        """Main process, its (warm or cold) shutdown begins."""

    def after_worker_shutdown(self, worker: Any) -> None:
        """Main process, at the end of its shutdown: write what it holds, stop its threads."""

    def after_message_received(self, request: Any) -> None:
        """Main process, a message arrived (any task): memory only."""

    def before_process_message(self, task: Any) -> None:
        """A task (any) is about to run in this process."""

    def after_process_message(self, task: Any) -> None:
        """A task (any) ran in this process."""

    def after_task_failure(self, task: Any, task_id: str, exc: BaseException) -> None:
        """A task failed with ``exc``: in its pool process, or in the main process when the pool
        process running it died (``WorkerLostError``, ``TimeLimitExceeded``)."""


HOOK_NAMES = tuple(name for name, value in vars(Middleware).items() if callable(value) and not name.startswith("_"))


def overrides(middleware: Middleware, hook: str) -> bool:
    """Whether ``middleware``'s class overrides ``hook`` (the base's does nothing)."""
    return getattr(type(middleware), hook) is not getattr(Middleware, hook)


class HookLists(dict):
    """Hook name -> the middleware overriding it, in order; ``enter``: the middleware with a
    ``before_run`` or an ``after_run``, as ``(middleware, has before_run, has after_run)``."""

    enter: tuple[tuple[Middleware, bool, bool], ...] = ()


class Hooks:
    """Per hook, the middleware of a list that override it, in order: a message pays for the hooks
    that do something, not for empty calls.

    The lists are computed from ``source()`` (the current ``MIDDLEWARE``) when a worker or pool
    process starts (:meth:`refresh`), on first use otherwise (an eager ``task.apply()``), and again
    whenever that list's contents changed: a middleware added after import runs.
    """

    def __init__(self, source: Callable[[], Sequence[Middleware]]) -> None:
        self.source = source
        self._seen: tuple[Middleware, ...] | None = None
        self._lists = HookLists()

    def refresh(self) -> None:
        middleware = tuple(self.source())
        lists = HookLists({h: tuple(m for m in middleware if overrides(m, h)) for h in HOOK_NAMES})
        lists.enter = tuple((m, m in lists["before_run"], m in lists["after_run"]) for m in middleware
                            if m in lists["before_run"] or m in lists["after_run"])
        self._lists = lists
        self._seen = middleware

    def current(self) -> HookLists:
        """Hook name -> the middleware overriding it, for the list as it is now."""
        if self._seen is None or tuple(self.source()) != self._seen:
            self.refresh()
        return self._lists

    def __getitem__(self, hook: str) -> tuple[Middleware, ...]:
        return self.current()[hook]
