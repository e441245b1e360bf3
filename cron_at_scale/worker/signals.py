"""Celery's signals, connected once: each calls the matching hook of every middleware of
:data:`cron_at_scale.worker.task.MIDDLEWARE` that overrides it, in that list's order.

This is the only module of the worker that connects a Celery signal. A worker concern is a
middleware (:class:`~cron_at_scale.worker.middleware.base.Middleware`, which lists the hooks and
the signal behind each); the Celery mechanisms a concern needs are wired here (a signal) or on
the task class (``JobTask.Request``, the request class of :mod:`cron_at_scale.worker.clock`).

A hook's exception is logged and the next middleware's hook still runs, as Celery does for its
own receivers. The hook lists are read again when a worker or pool process starts
(``worker_init``, ``worker_process_init``) and whenever ``MIDDLEWARE`` changes.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from celery import signals

if TYPE_CHECKING:
    from cron_at_scale.worker.middleware.base import Hooks

log = logging.getLogger(__name__)


class _Served:
    """The hooks the receivers call: those of ``MIDDLEWARE``, handed in by :func:`serve` (the task
    module, which defines the list, imports this one: never the other way round)."""

    hooks: Hooks | None = None


def serve(hooks: Hooks) -> None:
    """Make the receivers call ``hooks`` (:data:`cron_at_scale.worker.task.hooks`)."""
    _Served.hooks = hooks


def call(hook: str, *args: Any) -> None:
    """Call ``hook`` of every middleware overriding it, in order; log (and pass) a hook's error."""
    hooks = _Served.hooks
    if hooks is None:  # the task module not imported: no middleware in this process
        return
    for m in hooks[hook]:
        try:
            getattr(m, hook)(*args)
        except Exception:  # noqa: BLE001 (one concern's bug must not silence the others)
            log.exception("%s.%s failed", type(m).__qualname__, hook)


def _connect(signal, name: str):
    def decorator(fn):
        signal.connect(fn, weak=False, dispatch_uid=f"cron_at_scale.worker.signals.{name}")
        return fn
    return decorator


_main_pid: int | None = None  # the worker's main process, set at worker_init


def release_connections() -> None:
    """Close this thread's Django database connections, before a pool process's hooks start threads.

    Celery's Django fixup (``celery.fixups.django``), a ``worker_process_init`` receiver too, closes
    each open connection's descriptor with ``os.close`` and then closes the connection, which closes
    that number a second time. A thread started meanwhile (a hook's writer thread) may have been given
    the number for its own socket, or the main thread for a file it reads: either loses it. With
    the connections closed here first, the fixup finds nothing to close, in either order.

    A connection a forked pool process inherited shares its socket with the main process: its
    descriptor is pointed at ``/dev/null`` first, so closing it sends nothing on the main process's
    connection (the solo pool runs in the main process: its connections are its own)."""
    from django.db import connections

    forked = _main_pid is not None and os.getpid() != _main_pid
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        try:
            if forked:
                fd = conn.connection.fileno()
                null = os.open(os.devnull, os.O_RDWR)
                try:
                    os.dup2(null, fd)
                finally:
                    os.close(null)
        except Exception as e:  # noqa: BLE001 (no descriptor left: closing it sends nothing)
            log.debug("database connection %r has no descriptor at pool process start: %s", conn.alias, e)
        try:
            conn.close()
        except Exception as e:  # noqa: BLE001 (a broken connection: the next use reconnects)
            log.debug("closing database connection %r at pool process start: %s", conn.alias, e)


@_connect(signals.worker_init, "worker_init")
def _worker_init(sender=None, **kwargs) -> None:
    global _main_pid
    _main_pid = os.getpid()
    if _Served.hooks is not None:
        _Served.hooks.refresh()  # the hooks of MIDDLEWARE as the worker starts, not as it was imported
    call("before_worker_boot", sender)


@_connect(signals.worker_ready, "worker_ready")
def _worker_ready(sender=None, **kwargs) -> None:
    call("after_worker_boot", sender)


@_connect(signals.worker_process_init, "worker_process_init")
def _worker_process_init(**kwargs) -> None:
    release_connections()
    if _Served.hooks is not None:
        _Served.hooks.refresh()
    call("after_process_boot")


@_connect(signals.worker_process_shutdown, "worker_process_shutdown")
def _worker_process_shutdown(**kwargs) -> None:
    call("before_process_shutdown")


@_connect(signals.worker_shutting_down, "worker_shutting_down")
def _worker_shutting_down(**kwargs) -> None:
    call("before_worker_shutdown")


@_connect(signals.worker_shutdown, "worker_shutdown")
def _worker_shutdown(sender=None, **kwargs) -> None:
    call("after_worker_shutdown", sender)


@_connect(signals.task_received, "task_received")
def _task_received(sender=None, request=None, **kwargs) -> None:
    call("after_message_received", request)


@_connect(signals.task_prerun, "task_prerun")
def _task_prerun(sender=None, task=None, **kwargs) -> None:
    call("before_process_message", task if task is not None else sender)


@_connect(signals.task_postrun, "task_postrun")
def _task_postrun(sender=None, task=None, **kwargs) -> None:
    call("after_process_message", task if task is not None else sender)


@_connect(signals.task_failure, "task_failure")
def _task_failure(sender=None, task_id=None, exception=None, **kwargs) -> None:
    call("after_task_failure", sender, task_id, exception)
