"""The worker side: what runs inside ``celery worker``.

``task`` (:class:`JobTask`, the task class: ``task_cls="cron_at_scale.worker:JobTask"``),
``middleware/`` (one class per concern: a worker concern is a middleware; their order is
``task.MIDDLEWARE``'s), ``signals`` (Celery's signals, connected once, calling the middleware's
per-process hooks), ``attempts`` (the writer of started and finished attempts), ``clock`` (the
database clock, read once per process), ``health`` (a worker that stopped consuming), ``lost``
(a pool process that died in a run).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["JobTask", "current_job"]

_FROM_TASK = ("JobTask", "current_job", "JobContext", "AttemptWriter", "job_header", "MIDDLEWARE")


def __getattr__(name: str) -> Any:
    # Lazy, as Celery resolves "cron_at_scale.worker:JobTask": the submodules import alone.
    if name in _FROM_TASK:
        return getattr(importlib.import_module("cron_at_scale.worker.task"), name)
    raise AttributeError(f"module 'cron_at_scale.worker' has no attribute {name!r}")
