"""Retry policy: whether a failed attempt of a one-off job is retried, and after how long.

A scheduled run never retries through Celery's ETA messages: the job goes back
to ``pending`` after the delay decided here (``decide``). Celery's retry options
on a task keep Celery's meaning unless the job overrides them
(``schedule(..., max_retries=, retry_backoff=, retry_backoff_max=, retry_jitter=)``);
docs/settings.md ("Retries") puts each beside Celery's own formula.

What retries: ``RetryableError`` (treated as if it were in every task's
``autoretry_for``), the task's ``autoretry_for`` exceptions except its
``dont_autoretry_for`` ones, and ``self.retry()``; any exception (but
``dont_autoretry_for``) if the job or task sets ``retry_all_exceptions`` or the
setting ``RETRY_ALL_EXCEPTIONS`` is true.

How many: retries after the first attempt, Celery's meaning (``max_retries=3``
allows 4 attempts). The first of these that is set wins: ``self.retry(max_retries=)``;
the job's ``max_retries`` (``None``: not set); for an autoretried error, the
task's ``retry_kwargs["max_retries"]``; the task's ``max_retries`` (Celery's
default 3; ``None`` retries without end, as in Celery).

After how long (seconds), the first that applies:

1. ``self.retry(countdown=)``, else ``self.retry(eta=)`` (minus now);
2. the job's ``retry_backoff``: ours, ``min(retry_backoff_max, retry_backoff * 4**n)``
   for retry ``n`` (0-based), drawn from ``[delay/2, delay]`` with jitter;
3. for an autoretried error, the task's ``retry_backoff`` (``True`` is 1):
   Celery's ``get_exponential_backoff_interval``, ``min(int(retry_backoff_max),
   int(max(1, retry_backoff)) * 2**n)``, drawn from the whole seconds ``0..delay``
   with jitter;
4. for an autoretried error, the task's ``retry_kwargs["countdown"]`` or ``["eta"]``;
5. the task's own ``default_retry_delay`` (``None``: at once);
6. ours with the defaults (``retry_backoff`` 30 s): 30 s, 2 min, 8 min, then 10 min.

``retry_backoff_max`` (default 600 s) and ``retry_jitter`` (default on) are the
job's, else the task's. Celery's ``default_retry_delay`` of 180 s for a task that
does not set its own is replaced by step 6.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timezone

from celery import Task
from celery.utils.time import maybe_make_aware

from cron_at_scale.exceptions import RetryableError

DEFAULT_BACKOFF = 30.0  # seconds before the first retry
DEFAULT_BACKOFF_MAX = 600.0  # cap of one delay, seconds (Celery's default retry_backoff_max too)
BACKOFF_FACTOR = 4
CELERY_MAX_RETRIES = 3  # Celery's Task.max_retries, for a task object that has none

# Keys of a task's retry_kwargs honoured in a scheduled run; any other is refused (checks.E005).
RETRY_KWARGS = frozenset({"max_retries", "countdown", "eta"})
_UNSET = object()


@dataclass(frozen=True)
class Decision:
    retry: bool
    delay: float = 0.0


@dataclass(frozen=True)
class RetryCall:
    """A ``self.retry()`` inside a scheduled run: ``countdown`` (seconds), ``eta`` (a datetime;
    naive is in the Celery app's timezone), ``max_retries`` (this call's limit), each ``None`` if not given."""

    countdown: float | None = None
    eta: datetime | None = None
    max_retries: int | None = None


def backoff(n: int, base: float = DEFAULT_BACKOFF, cap: float = DEFAULT_BACKOFF_MAX, jitter: bool = True) -> float:
    """Seconds to wait before retry ``n`` (0-based) by our formula: ``min(cap, base * 4**n)``, then
    drawn uniformly from ``[delay/2, delay]`` with ``jitter``."""
    delay = min(cap, base * BACKOFF_FACTOR ** min(n, 32))
    return random.uniform(delay / 2, delay) if jitter else delay


def celery_backoff(n: int, factor: float | bool, cap: float = DEFAULT_BACKOFF_MAX, jitter: bool = True) -> int:
    """Seconds before retry ``n`` (0-based) for a task's ``retry_backoff=factor``, as Celery's
    autoretry computes it: ``min(int(cap), int(max(1, factor)) * 2**n)``, then with ``jitter``
    a whole number drawn uniformly from ``0..delay``."""
    delay = min(int(cap), int(max(1.0, float(factor))) * 2 ** min(n, 64))
    return max(0, random.randrange(delay + 1) if jitter else delay)


def task_option(task, name: str, default=None):
    """The value of Celery option ``name`` that ``task`` sets itself (decorator argument, class or
    instance attribute); ``default`` when it is unset or only Celery's ``Task`` default."""
    if name in vars(task):
        return vars(task)[name]
    for klass in type(task).__mro__:
        if name in vars(klass):
            return default if klass is Task else vars(klass)[name]
    return default


def _retry_kwargs(task) -> dict:
    value = getattr(task, "retry_kwargs", None)
    return value if isinstance(value, dict) else {}


def _exceptions(task, name: str) -> tuple:
    return tuple(getattr(task, name, None) or ())


def _seconds_until(eta: datetime, task, now: datetime | None) -> float:
    app = getattr(task, "app", None)
    eta = maybe_make_aware(eta, app.timezone if app is not None else timezone.utc)
    return (eta - (now or datetime.now(timezone.utc))).total_seconds()


def _job_or_task(name: str, opts: dict, task, default):
    if name in opts:
        return opts[name]
    value = getattr(task, name, None)
    return default if value is None else value


def max_retries_for(task, exc: BaseException | None, job_max_retries: int | None,
                    call: RetryCall | None = None) -> int | None:
    """Retries allowed (``None``: no limit) for a failure of ``task`` with ``exc``; see the module."""
    if call is not None and call.max_retries is not None:
        return call.max_retries
    if job_max_retries is not None:
        return job_max_retries
    if call is None and "max_retries" in _retry_kwargs(task):
        return _retry_kwargs(task)["max_retries"]
    return getattr(task, "max_retries", CELERY_MAX_RETRIES)


def decide(task, exc: BaseException, retries: int, max_retries: int | None = None, *,
           call: RetryCall | None = None, job_options: dict | None = None, retry_all: bool = False,
           now: datetime | None = None) -> Decision:
    """Retry ``exc`` raised by ``task`` after ``retries`` retries, or not; and after how many seconds.

    ``max_retries``: the job's (``None``: the task's). ``call``: the ``self.retry()`` that raised
    ``exc``, if one did. ``job_options``: the job's ``schedule()`` options. ``now``: an aware
    datetime (default: the clock) against which ``self.retry(eta=)`` is counted.
    """
    opts = job_options or {}
    if call is None:
        if isinstance(exc, _exceptions(task, "dont_autoretry_for")):
            return Decision(False)
        retry_all = retry_all or bool(_job_or_task("retry_all_exceptions", opts, task, False))
        if not (retry_all or isinstance(exc, (RetryableError, *_exceptions(task, "autoretry_for")))):
            return Decision(False)
    limit = max_retries_for(task, exc, max_retries, call)
    if limit is not None and retries >= limit:
        return Decision(False)
    return Decision(True, max(0.0, float(_delay(task, retries, call, opts, now))))


def _delay(task, n: int, call: RetryCall | None, opts: dict, now: datetime | None) -> float:
    cap = float(_job_or_task("retry_backoff_max", opts, task, DEFAULT_BACKOFF_MAX))
    jitter = bool(_job_or_task("retry_jitter", opts, task, True))
    if call is not None and (call.countdown is not None or call.eta is not None):
        # As Celery sends it: a non-zero countdown wins over eta.
        if call.countdown or call.eta is None:
            return float(call.countdown or 0.0)
        return _seconds_until(call.eta, task, now)
    if "retry_backoff" in opts:
        return backoff(n, float(opts["retry_backoff"]), cap, jitter)
    if call is None:
        factor = task_option(task, "retry_backoff", False)
        if factor:
            return celery_backoff(n, factor, cap, jitter)
        kwargs = _retry_kwargs(task)
        if kwargs.get("countdown") is not None:
            return float(kwargs["countdown"])
        if isinstance(kwargs.get("eta"), datetime):
            return _seconds_until(kwargs["eta"], task, now)
    own = task_option(task, "default_retry_delay", _UNSET)
    if own is not _UNSET:
        return float(own or 0)
    return backoff(n, DEFAULT_BACKOFF, cap, jitter)


def contradictions(task) -> list[str]:
    """Retry options of ``task`` that contradict each other (each a sentence naming them); empty when none."""
    out = []
    factor = task_option(task, "retry_backoff", False)
    cap = task_option(task, "retry_backoff_max", DEFAULT_BACKOFF_MAX)
    if factor and cap is not None and int(max(1.0, float(factor))) > int(cap):
        out.append(f"retry_backoff={factor!r} is above retry_backoff_max={cap!r}: every retry waits the cap "
                   f"({int(cap)} s, less with jitter)")
    kwargs = _retry_kwargs(task)
    if factor and ("countdown" in kwargs or "eta" in kwargs):
        key = "countdown" if "countdown" in kwargs else "eta"
        out.append(f"retry_kwargs[{key!r}] is never used: retry_backoff={factor!r} decides every autoretry's delay")
    return out


def unsupported(task) -> list[str]:
    """Retry options of ``task`` a scheduled run cannot honour (each a sentence naming it); empty when none."""
    out = []
    for key in sorted(set(_retry_kwargs(task)) - RETRY_KWARGS):
        out.append(f"retry_kwargs[{key!r}]: a scheduled run's retry is a database state, which takes only "
                   f"{', '.join(sorted(RETRY_KWARGS))}")
    eta = _retry_kwargs(task).get("eta")
    if eta is not None and not isinstance(eta, datetime):
        out.append(f"retry_kwargs['eta'] is {type(eta).__name__}, not a datetime")
    return out
