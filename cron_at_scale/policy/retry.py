"""Retry policy: whether a failed attempt of a one-off job is retried, and after how long.

A scheduled run never retries through Celery's ETA messages: the job goes back
to ``pending`` after the delay decided here (``decide``). Celery's retry options
mean what Celery's docs say ("Automatic retry for known exceptions",
https://docs.celeryq.dev/en/stable/userguide/tasks.html), whether the task sets
them or the job does (``schedule(..., max_retries=, retry_backoff=,
retry_backoff_max=, retry_jitter=, autoretry_for=, dont_autoretry_for=,
retry_kwargs=)``): the job's value replaces the task's, then Celery's rule applies.
A job names its exceptions by import path (``"requests.ConnectionError"``;
``schedule()`` also takes the classes), since a job is stored as JSON. docs/settings.md ("Retries") puts each beside Celery's code.

What retries: ``RetryableError`` (treated as if it were in every task's
``autoretry_for``), the ``autoretry_for`` exceptions (the job's, else the task's) except the
``dont_autoretry_for`` ones (the job's, else the task's), and ``self.retry()``; any exception (but
``dont_autoretry_for``) if the job or task sets ``retry_all_exceptions`` or the
setting ``RETRY_ALL_EXCEPTIONS`` is true. All but ``self.retry()`` are autoretries.

How many: retries after the first attempt, Celery's meaning (``max_retries=3``
allows 4 attempts). The first of these that is set wins: ``self.retry(max_retries=)``;
for an autoretried error, the job's ``retry_kwargs["max_retries"]``; the job's
``max_retries`` (``None``: not set); for an autoretried error, the task's
``retry_kwargs["max_retries"]``; the task's ``max_retries`` (Celery's default 3;
``None`` retries without end, as in Celery). The job's options come before the
task's, and within each Celery's order: an autoretry passes ``retry_kwargs`` to
``self.retry()``, whose ``max_retries`` beats the task's attribute.

After how long (seconds), the first that applies:

1. ``self.retry(countdown=)``, else ``self.retry(eta=)`` (minus now);
2. for an autoretry, ``retry_backoff`` (the job's, else the task's; ``True`` is 1,
   ``False`` or 0 is off): Celery's ``celery.utils.time.get_exponential_backoff_interval``
   as ``celery/app/autoretry.py`` calls it, ``min(int(retry_backoff_max),
   int(max(1, retry_backoff)) * 2**n)`` for retry ``n`` (0-based), with ``retry_jitter``
   a whole number drawn uniformly from ``0..delay`` (Celery's full jitter);
3. for an autoretry, the task's ``retry_kwargs["countdown"]`` or ``["eta"]``;
4. the task's own ``default_retry_delay`` (``None``: at once);
5. the default schedule (``DEFAULT_SCHEDULE``): 30 s, 2 min, 10 min, then 10 min
   for any further retry, each capped by ``retry_backoff_max`` and with
   ``retry_jitter`` drawn uniformly from ``[delay/2, delay]``. It is our own, not a
   Celery factor: Celery's default for a task that sets nothing is a fixed 180 s
   (``default_retry_delay``), which a scheduled run replaces by this schedule.

``retry_backoff_max`` (default 600 s, Celery's) and ``retry_jitter`` (default on,
Celery's) are the job's, else the task's.
"""

from __future__ import annotations

import functools
import logging
import random
from dataclasses import dataclass
from datetime import datetime, timezone

from celery import Task
from celery.utils.time import maybe_make_aware
from django.utils.module_loading import import_string

from cron_at_scale.exceptions import RetryableError

log = logging.getLogger(__name__)

# Seconds before retries 0, 1, 2 when nothing sets a delay; later retries wait the last one.
DEFAULT_SCHEDULE = (30.0, 120.0, 600.0)
DEFAULT_BACKOFF_MAX = 600.0  # cap of one delay, seconds (Celery's default retry_backoff_max)
CELERY_MAX_RETRIES = 3  # Celery's Task.max_retries, for a task object that has none

# Keys of a task's retry_kwargs honoured in a scheduled run; any other is refused (checks.E005).
RETRY_KWARGS = frozenset({"max_retries", "countdown", "eta"})
# A job's own retry_kwargs: JSON, so no eta (a datetime); schedule() refuses any other key.
JOB_RETRY_KWARGS = frozenset({"max_retries", "countdown"})
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


def default_backoff(n: int, cap: float = DEFAULT_BACKOFF_MAX, jitter: bool = True) -> float:
    """Seconds to wait before retry ``n`` (0-based) when nothing sets a delay: ``DEFAULT_SCHEDULE[n]``
    (its last value past its end), at most ``cap``, then drawn uniformly from ``[delay/2, delay]``
    with ``jitter`` (never at once)."""
    delay = min(cap, DEFAULT_SCHEDULE[min(n, len(DEFAULT_SCHEDULE) - 1)])
    return random.uniform(delay / 2, delay) if jitter else delay


def celery_backoff(n: int, factor: float | bool, cap: float = DEFAULT_BACKOFF_MAX, jitter: bool = True) -> int:
    """Seconds before retry ``n`` (0-based) for ``retry_backoff=factor`` (``True`` is 1), as Celery's
    autoretry (``celery/app/autoretry.py``) computes it with
    ``celery.utils.time.get_exponential_backoff_interval(int(max(1, factor)), n, int(cap), jitter)``:
    ``min(int(cap), int(max(1, factor)) * 2**n)``; with ``jitter`` (Celery's "full jitter") a whole
    number drawn by ``random.randrange(delay + 1)``, uniformly from ``0..delay``. Whole seconds, as Celery's."""
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


def _retry_kwargs(task, opts: dict | None = None) -> dict:
    """The job's ``retry_kwargs`` if it sets them, else the task's."""
    value = opts["retry_kwargs"] if opts and "retry_kwargs" in opts else getattr(task, "retry_kwargs", None)
    return value if isinstance(value, dict) else {}


def _exceptions(task, name: str, opts: dict | None = None) -> tuple:
    """``autoretry_for`` or ``dont_autoretry_for``: the job's (import paths) if it sets them, else the task's."""
    if opts and name in opts:
        return tuple(cls for path in opts[name] or () if (cls := exception_class(path)) is not None)
    return tuple(getattr(task, name, None) or ())


def exception_path(cls: type) -> str:
    """The import path a job stores for exception class ``cls`` (``module.QualifiedName``)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def import_exception(path: str) -> type:
    """The exception class at import path ``path``; ``ValueError`` saying why when there is none."""
    try:
        cls = import_string(path)
    except ImportError as e:
        raise ValueError(f"{path!r} does not import: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise ValueError(f"{path!r} is not an exception class")
    return cls


@functools.lru_cache(maxsize=256)
def exception_class(path: str) -> type | None:
    """The exception class at import path ``path`` (a job's ``autoretry_for``), or None (logged) if it
    does not import in this worker or is not an exception: such a name matches nothing."""
    try:
        return import_exception(path)
    except ValueError as e:
        log.warning("a job's retry option: %s; it matches nothing in this worker", e)
        return None


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
                    call: RetryCall | None = None, job_options: dict | None = None) -> int | None:
    """Retries allowed (``None``: no limit) for a failure of ``task`` with ``exc``; see the module."""
    if call is not None and call.max_retries is not None:
        return call.max_retries
    # The job's options before the task's; within each, Celery's order (autoretry passes
    # retry_kwargs to self.retry(), whose max_retries beats the task's attribute).
    job_kwargs = (job_options or {}).get("retry_kwargs")
    if call is None and isinstance(job_kwargs, dict) and "max_retries" in job_kwargs:
        return job_kwargs["max_retries"]
    if job_max_retries is not None:
        return job_max_retries
    task_kwargs = _retry_kwargs(task, job_options)  # the job's retry_kwargs, if set, replace the task's
    if call is None and "max_retries" in task_kwargs:
        return task_kwargs["max_retries"]
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
        if isinstance(exc, _exceptions(task, "dont_autoretry_for", opts)):
            return Decision(False)
        retry_all = retry_all or bool(_job_or_task("retry_all_exceptions", opts, task, False))
        if not (retry_all or isinstance(exc, (RetryableError, *_exceptions(task, "autoretry_for", opts)))):
            return Decision(False)
    limit = max_retries_for(task, exc, max_retries, call, opts)
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
    if call is None:  # an autoretry: Celery applies retry_backoff here only, never to self.retry()
        factor = opts["retry_backoff"] if "retry_backoff" in opts else task_option(task, "retry_backoff", False)
        if factor:
            return celery_backoff(n, factor, cap, jitter)
        kwargs = _retry_kwargs(task, opts)
        if kwargs.get("countdown") is not None:
            return float(kwargs["countdown"])
        if isinstance(kwargs.get("eta"), datetime):
            return _seconds_until(kwargs["eta"], task, now)
    own = task_option(task, "default_retry_delay", _UNSET)
    if own is not _UNSET:
        return float(own or 0)
    return default_backoff(n, cap, jitter)


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
