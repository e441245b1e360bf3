"""Retry policy: when a failed attempt is retried, and after how long.

The delay before retry ``n`` (``n`` = 0 for the first retry) is::

    delay = min(retry_backoff_max, retry_backoff * 4 ** n)

then, with ``retry_jitter`` (default on), drawn uniformly from
``[delay / 2, delay]`` so that jobs failing together do not retry together
(the "equal jitter" of AWS's backoff note; Celery's ``retry_jitter`` draws
from ``[0, delay]``, which can retry at once). Defaults give 30 s, 2 min,
8 min, then 10 min per retry (before jitter). Each of ``retry_backoff``
(seconds), ``retry_backoff_max`` (seconds) and ``retry_jitter`` (bool) comes
from the job (``schedule(..., retry_backoff=5)``), else the task's attribute
of that name (as on a Celery task), else the default.

What retries: ``RetryableError``, the task's ``autoretry_for`` exceptions
(handled here with this formula, not by Celery's own wrapper, which would send
an ETA message) and ``self.retry()``; any exception if the job or task sets
``retry_all_exceptions`` or the setting ``RETRY_ALL_EXCEPTIONS`` is true. ``max_retries`` keeps Celery's
meaning: retries after the first attempt, so ``max_retries=3`` allows at most
4 attempts; then the job fails and goes to the dead-letter queue.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .exceptions import RetryableError

DEFAULT_BACKOFF = 30.0  # seconds before the first retry
DEFAULT_BACKOFF_MAX = 600.0  # cap of one delay, seconds
BACKOFF_FACTOR = 4


@dataclass(frozen=True)
class Decision:
    retry: bool
    delay: float = 0.0


def backoff(n: int, base: float = DEFAULT_BACKOFF, cap: float = DEFAULT_BACKOFF_MAX, jitter: bool = True) -> float:
    """Seconds to wait before retry ``n`` (0-based), per the module's formula."""
    delay = min(cap, base * BACKOFF_FACTOR ** min(n, 32))
    return random.uniform(delay / 2, delay) if jitter else delay


def _setting(name: str, job_options: dict, task, default):
    if name in job_options:
        return job_options[name]
    value = getattr(task, name, None)
    return default if value is None else value


def decide(task, exc: BaseException, retries: int, max_retries: int, countdown: float | None = None,
           job_options: dict | None = None, retry_all: bool = False) -> Decision:
    """Retry ``exc`` raised by ``task`` after ``retries`` retries, or not; and after how many seconds.

    ``countdown`` (seconds, from ``self.retry(countdown=...)``) overrides the backoff.
    """
    opts = job_options or {}
    retryable = (RetryableError, *tuple(getattr(task, "autoretry_for", ()) or ()))
    retry_all = retry_all or bool(_setting("retry_all_exceptions", opts, task, False))
    if retries >= max_retries or not (retry_all or isinstance(exc, retryable)):
        return Decision(False)
    if countdown is not None:
        return Decision(True, max(0.0, float(countdown)))
    base = _setting("retry_backoff", opts, task, DEFAULT_BACKOFF)
    base = DEFAULT_BACKOFF if isinstance(base, bool) else float(base)  # Celery's retry_backoff=True
    cap = float(_setting("retry_backoff_max", opts, task, DEFAULT_BACKOFF_MAX))
    jitter = bool(_setting("retry_jitter", opts, task, True))
    return Decision(True, backoff(retries, base, cap, jitter))
