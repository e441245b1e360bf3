"""Retry policy: when a failed attempt is retried, and after how long.

The delay before retry ``n`` (``n`` = 0 for the first retry) is::

    delay = min(retry_backoff_max, retry_backoff * 4 ** n)

then, with ``retry_jitter`` (default on), drawn uniformly from
``[delay / 2, delay]`` so that jobs failing together do not retry together
(the "equal jitter" of AWS's backoff note; Celery's ``retry_jitter`` draws
from ``[0, delay]``, which can retry at once). Defaults give 30 s, 2 min,
8 min, then 10 min per retry (before jitter). ``max_retries`` keeps Celery's
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


def decide(task, exc: BaseException, retries: int, max_retries: int, countdown: float | None = None) -> Decision:
    """Retry ``exc`` raised by ``task`` after ``retries`` retries, or not.

    Retried: ``RetryableError`` and the task's ``autoretry_for`` exceptions,
    while ``retries < max_retries``. ``countdown`` (seconds) overrides the backoff.
    """
    retryable = (RetryableError, *tuple(getattr(task, "autoretry_for", ()) or ()))
    if not isinstance(exc, retryable) or retries >= max_retries:
        return Decision(False)
    if countdown is not None:
        return Decision(True, max(0.0, float(countdown)))
    base = getattr(task, "retry_backoff", None)
    base = DEFAULT_BACKOFF if base in (None, False, True) else float(base)
    cap = float(getattr(task, "retry_backoff_max", None) or DEFAULT_BACKOFF_MAX)
    jitter = bool(getattr(task, "retry_jitter", True))
    return Decision(True, backoff(retries, base, cap, jitter))
