"""Completion: a run that returned is recorded as succeeded by the process's completer
(:mod:`cron_at_scale.worker.attempts`): batched onto the next start, or written at once for an
eager run or a run inside the caller's transaction, whose caller reads it next."""

from __future__ import annotations

from typing import Any

from django.db import connections

from cron_at_scale.worker.middleware.base import Middleware, Run


class Completion(Middleware):
    def __init__(self, batched, inline) -> None:
        self.batched, self.inline = batched, inline

    def after_success(self, run: Run, result: Any) -> None:
        eager = run.task.request.is_eager or any(c.in_atomic_block for c in connections.all(initialized_only=True))
        (self.inline if eager else self.batched).complete(run.job_id, run.attempt)
        run.outcome = "succeeded"
