"""Completion: a run that returned is recorded as succeeded by the process's completer
(:mod:`cron_at_scale.worker.attempts`): batched onto the next start, or written at once for an
eager run or a run inside the caller's transaction, whose caller reads it next. When a pool
process (or a solo/threads worker) shuts down, the completions it still holds are written."""

from __future__ import annotations

import logging
import os
from typing import Any

from django.db import connections

from cron_at_scale.worker.middleware.base import Middleware, Run

log = logging.getLogger(__name__)


class Completion(Middleware):
    def __init__(self, batched, inline) -> None:
        self.batched, self.inline = batched, inline

    def after_success(self, run: Run, result: Any) -> None:
        eager = run.task.request.is_eager or any(c.in_atomic_block for c in connections.all(initialized_only=True))
        (self.inline if eager else self.batched).complete(run.job_id, run.attempt)
        run.outcome = "succeeded"

    def before_process_shutdown(self) -> None:
        self.flush()

    def after_worker_shutdown(self, worker: Any) -> None:
        self.flush()

    def flush(self) -> None:
        """Write the completions this process holds and stop the writer's thread (if it is this process's)."""
        writer = self.batched
        if writer.pid == os.getpid():
            try:
                writer.stop()
            except Exception:  # the leases expire and the jobs run again: at-least-once
                log.exception("could not write %d completed attempts at shutdown", len(writer.done))
