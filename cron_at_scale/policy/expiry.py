"""Expiry of runs (Celery's ``expires``): a run not started within ``expires`` seconds of its
scheduled time is skipped and counted, never run.

A job carries it as ``options["expires"]`` (seconds, > 0). The rule is enforced on the database
clock in three places, so that no backlog of one job's stale runs builds up while its workers are
down: the dispatcher does not publish a run already past its expiry when it claims it
(``expire_runs``), the worker's start statement records a run that waited too long in the queue
as skipped (``start_attempt``), and the reaper does not fire a lost run again past its expiry
(``reap_once``, ``refire_cron``). Each such run is an attempt with outcome ``skipped`` and the
error :func:`error_text`, and adds one to the job's ``expired_runs``. A one-off job whose run
expired ends ``cancelled`` (Celery marks an expired task revoked: it never ran); a recurring job
stays pending for its next occurrence.

The message sent to the broker carries no ``expires`` of Celery's own: a worker would then judge
expiry by its own clock and drop the message before the attempt log hears of it (the attempt
would later be reaped as lost and fired again), see docs/api.md.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta
from typing import Any

from cron_at_scale.exceptions import ValidationError, show

log = logging.getLogger(__name__)

MAX_EXPIRES = 100 * 365 * 86400  # seconds, as validation.MAX_EXPIRES

FIELD = "expires"


def _show(value: Any) -> str:
    return show(value, 40)


def error_text(seconds: float) -> str:
    """The error recorded on an expired attempt (the start statement writes the same text)."""
    return f"expired: not started within {seconds:g} s of its occurrence"


def check(value: Any) -> float:
    """``value`` as seconds: a number (or ``timedelta``) above 0 and at most ``MAX_EXPIRES``.

    An integral value is returned as an ``int`` (``30.0`` is stored as ``30``). Raises
    ``ValidationError`` (field ``expires``). An aware datetime is handled by
    :func:`from_datetime` (one-off jobs only).
    """
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= MAX_EXPIRES:
        raise ValidationError(FIELD, f"must be a number of seconds above 0 and at most {MAX_EXPIRES} (or, for "
                                     f"a one-off job, an aware datetime), got {_show(value)}")
    return value


def from_datetime(value: datetime, fire_at: datetime, recurring: bool) -> float:
    """Celery's absolute ``expires`` (an aware datetime) as seconds after a one-off job's ``fire_at``.

    Raises ``ValidationError`` (field ``expires``) for a recurring job (every occurrence needs its
    own window: give seconds), a naive datetime, or one not after ``fire_at``.
    """
    if recurring:
        raise ValidationError(FIELD, "a datetime applies to one-off jobs only; a recurring job takes seconds "
                                     "(each occurrence expires that long after its own time)")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(FIELD, "must be an aware datetime (naive datetimes are ambiguous; use UTC)")
    try:
        window = (value - fire_at).total_seconds()
    except (OverflowError, ValueError):
        raise ValidationError(FIELD, f"{_show(value)} is out of range") from None
    if window <= 0:
        raise ValidationError(FIELD, f"{_show(value)} is not after the job's fire_at ({fire_at.isoformat()})")
    return check(window)


def seconds_of(options: dict | None) -> float | None:
    """The job's expiry window in seconds, or None when it has none (or, edited by hand, not a number:
    the start statement ignores it too)."""
    value = (options or {}).get(FIELD)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def is_expired(options: dict | None, scheduled_at: datetime, db_now: datetime) -> bool:
    """True when a run scheduled at ``scheduled_at`` is past its expiry at ``db_now`` (database clock)."""
    window = seconds_of(options)
    return window is not None and db_now > scheduled_at + timedelta(seconds=window)
