"""Input checks of the scheduling API, shared by ``schedule``, ``schedule_many`` and the job controls.

Each check raises :class:`cron_at_scale.ValidationError` naming the argument;
none touches the database (task names are looked up in the Celery app).
Internal to the package: the public functions are in ``cron_at_scale.api.schedule``.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from cron_at_scale import conf
from cron_at_scale import cron as cronlib
from cron_at_scale.celery_app import is_registered
from cron_at_scale.exceptions import ValidationError, show
from cron_at_scale.models import DEFAULT_CATCHUP_WINDOW, Catchup, Overlap

ARGUMENTS = ["args", "kwargs", "at", "countdown", "cron", "every", "tz", "queue", "max_retries", "key",
              "catchup", "catchup_window", "overlap", "jitter", "grace"]
_CATCHUPS = tuple(Catchup.values)
_OVERLAPS = tuple(Overlap.values)
# resume(missed=...): what to do with the occurrences that fell due while a job was paused
RESUME_CHOICES = ("skip", "latest", "all")
# What reschedule() may change (the key names the job, it cannot change).
RESCHEDULE_ARGUMENTS = ["task", *(a for a in ARGUMENTS if a != "key")]
MAX_COUNTDOWN = 100 * 365 * 86400  # seconds; a longer horizon is a bug, not a plan (at=, eta= and countdown= alike)
MAX_JSON_DEPTH = 64
MAX_INT_BITS = 1024  # far beyond any id or amount; Python refuses to print ints of ~4300+ digits
# Options a job may carry: Celery's message priority, the retry policy's overrides (Celery's names,
# Celery's meaning: cron_at_scale.policy.retry), and Celery's ``expires`` (seconds; see
# cron_at_scale.policy.expiry).
OPTIONS = {"priority", "retry_backoff", "retry_backoff_max", "retry_jitter", "retry_all_exceptions", "expires",
           "autoretry_for", "dont_autoretry_for", "retry_kwargs"}


def check_storable(field: str, text: str, subject: str = "") -> None:
    """Refuse what PostgreSQL cannot store in text or jsonb: NUL characters, and lone surrogates
    (UTF-8 cannot encode them). ``subject`` starts the message (``"strings "`` inside a payload)."""
    if "\x00" in text:
        raise ValidationError(field, f"{subject}must not contain NUL characters (PostgreSQL refuses them)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(field, f"{subject}must be valid Unicode (no lone surrogates)") from None


def check_text(field: str, value: Any, max_len: int, *, allow_none: bool = False) -> str | None:
    """``value`` if it is a non-empty storable string of at most ``max_len`` characters (or None, if allowed)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value:
        raise ValidationError(field, f"must be a non-empty string, got {show(value, 80)}")
    if len(value) > max_len:
        raise ValidationError(field, f"is {len(value)} characters long; the limit is {max_len}")
    check_storable(field, value)
    return value


def check_json(field: str, value: Any, depth: int = 0) -> None:
    """Accept exactly what JSON (and PostgreSQL's jsonb) round-trips unchanged."""
    if depth > MAX_JSON_DEPTH:
        raise ValidationError(field, f"is nested deeper than {MAX_JSON_DEPTH} levels")
    kind = type(value)  # the commonest cases first (schedule_many checks 100,000s a second)
    if kind is int and value.bit_length() <= MAX_INT_BITS or kind is str and value.isascii() and "\x00" not in value:
        return
    if kind is list:
        for item in value:
            check_json(field, item, depth + 1)
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise ValidationError(field, f"an integer of {value.bit_length()} bits is too large (the limit is "
                                         f"{MAX_INT_BITS} bits)")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(field, f"{show(value)} is not JSON (NaN and infinity are not allowed)")
        if abs(value) >= 2.0**53 and value.is_integer():
            # jsonb keeps it as an exact number and it would come back an int: say so now
            raise ValidationError(field, f"the float {show(value)} is beyond 2**53 and would arrive as an int; "
                                         "pass an int or a string")
        return
    if isinstance(value, str):
        check_storable(field, value, "strings ")
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            check_json(field, item, depth + 1)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValidationError(field, f"dict keys must be strings, got {show(k, 40)}")
            check_json(field, k, depth + 1)
            check_json(field, v, depth + 1)
        return
    raise ValidationError(field, f"{type(value).__name__} is not JSON-serializable (payloads are JSON only)")


def check_batch_size(batch_size: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 1_000_000:
        raise ValidationError("batch_size", f"must be an integer from 1 to 1000000, got {show(batch_size)}")


def refuse_private(spec: Mapping[str, Any]) -> None:
    for name in spec:
        if not isinstance(name, str):
            raise ValidationError("specs", f"argument names must be strings, got {show(name)}")
        if name.startswith("_"):
            raise ValidationError(name, "unknown argument")


def check_changes(schedule_type: str, changes: Mapping[str, Any]) -> None:
    """The argument names of ``reschedule()`` for a job of ``schedule_type``; their values are
    checked with the job they make (``build_job``)."""
    refuse_private(changes)
    for name in changes:
        if name not in RESCHEDULE_ARGUMENTS and name not in OPTIONS:
            raise ValidationError(name, f"unknown argument; reschedule() takes "
                                        f"{', '.join(RESCHEDULE_ARGUMENTS + sorted(OPTIONS))}")
    if schedule_type != "once":
        cron_after = changes.get("cron") is not None or (changes.get("every") is None and schedule_type == "cron")
        for name in ("countdown", "at") if cron_after else ("countdown",):
            if changes.get(name) is not None:
                raise ValidationError(name, f"does not apply to a {'cron' if cron_after else 'recurring'} job "
                                            "(an interval job takes at=, its first occurrence)")


def check_option(opt: str, value: Any) -> Any:
    """Raise :class:`ValidationError` naming ``opt`` if ``value`` is not a valid value of job option
    ``opt``; else return what the job stores (exception classes become their import paths)."""
    if opt in ("autoretry_for", "dont_autoretry_for"):
        return exception_paths(opt, value)
    if opt == "retry_kwargs":
        return check_retry_kwargs(value)
    if opt == "priority" and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255):
        raise ValidationError(opt, f"must be an integer from 0 to 255, got {show(value, 40)}")
    if opt == "retry_backoff" and not isinstance(value, bool) and (
        not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= MAX_COUNTDOWN
    ):  # Celery's meaning: True is a factor of 1 s, False or 0 is off, a number is the factor
        raise ValidationError(opt, f"must be True, False or a factor in seconds from 0 to {MAX_COUNTDOWN} "
                                   f"(Celery's: delay factor * 2**n), got {show(value, 40)}")
    if opt == "retry_backoff_max" and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        or not 0 <= value <= MAX_COUNTDOWN
    ):
        raise ValidationError(opt, f"must be a number of seconds from 0 to {MAX_COUNTDOWN}, got {show(value, 40)}")
    if opt in ("retry_jitter", "retry_all_exceptions") and not isinstance(value, bool):
        raise ValidationError(opt, f"must be True or False, got {show(value, 40)}")
    if opt == "expires":
        from cron_at_scale.policy.expiry import check

        if check(value) != value:  # a timedelta or an aware datetime: build_job converts them first
            raise ValidationError(opt, f"must be a number of seconds here, got {show(value, 40)}")
    return value


def exception_paths(opt: str, value: Any) -> list[str]:
    """``autoretry_for``/``dont_autoretry_for`` of a job: a list or tuple of exception classes or
    their import paths (as Celery's task option takes classes); stored as import paths, each of which
    must import here as an exception class."""
    from cron_at_scale.policy.retry import exception_path, import_exception

    if isinstance(value, (str, type)) or not isinstance(value, (list, tuple)):
        raise ValidationError(opt, f"must be a list or tuple of exception classes or their import paths, "
                                   f"got {show(value, 60)}")
    out = []
    for item in value:
        path = exception_path(item) if isinstance(item, type) else item
        if not isinstance(path, str) or "." not in path:
            raise ValidationError(opt, f"an item must be an exception class or its import path "
                                       f"('module.ExceptionName'), got {show(item, 60)}")
        if isinstance(item, type) and not issubclass(item, BaseException):
            raise ValidationError(opt, f"{path!r} is not an exception class")
        if not isinstance(item, type):
            try:
                import_exception(path)
            except ValueError as e:
                raise ValidationError(opt, str(e)) from None
        out.append(path)
    return out


def check_retry_kwargs(value: Any) -> dict[str, Any]:
    """A job's ``retry_kwargs`` (Celery's: the arguments an autoretry passes to ``retry()``):
    ``max_retries`` (an integer from 0 to 1000, or None) and ``countdown`` (seconds)."""
    from cron_at_scale.policy.retry import JOB_RETRY_KWARGS

    if not isinstance(value, Mapping):
        raise ValidationError("retry_kwargs", f"must be a dict, got {show(value, 60)}")
    for key in value:
        if key not in JOB_RETRY_KWARGS:
            raise ValidationError("retry_kwargs", f"takes {' and '.join(sorted(JOB_RETRY_KWARGS))} on a job "
                                                  f"(eta: use countdown), got {show(key, 40)}")
    limit = value.get("max_retries")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= 1000):
        raise ValidationError("retry_kwargs", f"max_retries must be an integer from 0 to 1000 or None, "
                                              f"got {show(limit, 40)}")
    out = dict(value)
    if "countdown" in value:
        out["countdown"] = seconds("retry_kwargs", value["countdown"])
    return out


def horizon_error(field_name: str, value: Any) -> ValidationError:
    """The one refusal of a fire time too far ahead, whichever argument gave it (``at``, ``eta``,
    ``countdown``): beyond ``MAX_COUNTDOWN`` seconds from now."""
    return ValidationError(field_name, f"must be at most {MAX_COUNTDOWN} seconds (100 years) ahead, got {show(value, 40)}")


def check_horizon(field_name: str, fire_at: datetime, now: datetime, value: Any) -> None:
    """Raise :func:`horizon_error` if ``fire_at`` (an aware datetime) is more than ``MAX_COUNTDOWN``
    seconds after ``now``; ``value`` is what the caller gave, for the message."""
    if (fire_at - now).total_seconds() > MAX_COUNTDOWN:
        raise horizon_error(field_name, value)


def seconds(field_name: str, value: Any, minimum: float = 0.0) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not minimum <= value <= MAX_COUNTDOWN:
        raise ValidationError(field_name, f"must be seconds (or a timedelta) from {minimum} to {MAX_COUNTDOWN}, "
                                          f"got {show(value, 40)}")
    return float(value)


def check_policy(recurring: bool, catchup: str, window: Any, overlap: str, jitter: Any) -> dict:
    """Validate the recurring-job policies (see ``cron_at_scale.policy.recurrence``)."""
    if catchup not in _CATCHUPS:
        raise ValidationError("catchup", f"must be one of {', '.join(_CATCHUPS)}, got {show(catchup, 40)}")
    if overlap not in _OVERLAPS:
        raise ValidationError("overlap", f"must be one of {', '.join(_OVERLAPS)}, got {show(overlap, 40)}")
    window = DEFAULT_CATCHUP_WINDOW if window is None else seconds("catchup_window", window)
    jitter = seconds("jitter", jitter)
    customised = (catchup != "latest" or overlap != "skip" or window != DEFAULT_CATCHUP_WINDOW or jitter)
    if customised and not recurring:
        raise ValidationError("catchup" if catchup != "latest" else "overlap" if overlap != "skip" else
                              "catchup_window" if window != DEFAULT_CATCHUP_WINDOW else "jitter",
                              "applies to recurring jobs only (cron= or every=)")
    return {"catchup": catchup, "catchup_window": window, "overlap": overlap, "jitter": jitter}


def check_tz(tz: str) -> None:
    check_text("tz", tz, 64)  # NUL and lone surrogates too, which zone lookup would not name
    cronlib.check_zone(tz)


def task_name(task: Any, registered: set[str] | None = None) -> str:
    name = getattr(task, "name", task)
    if not isinstance(name, str):
        raise ValidationError("task", f"must be a Celery task or its registered name, got {show(task, 60)}")
    check_text("task", name, 200)
    if registered is not None and name in registered:
        return name
    if conf.get("VALIDATE_TASK_NAMES") and not is_registered(name):
        raise ValidationError("task", f"{show(name)} is not a registered Celery task (is the module that defines it "
                                      "imported by your Celery app, and the app by your project's __init__.py? "
                                      "or pass the task object itself)")
    if registered is not None:
        registered.add(name)
    return name


def job_uuid(job_id: Any) -> uuid.UUID:
    """``job_id`` (a UUID or its text) as a UUID; ``ValidationError`` on field ``job_id`` otherwise."""
    try:
        return job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
    except (ValueError, TypeError, AttributeError):
        raise ValidationError("job_id", f"{show(job_id, 60)} is not a UUID") from None


_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# json.dumps builds its C encoder again on every call (~2 µs); this one is built once. It has no cycle
# check: what it encodes has passed check_json, which refuses anything nested deeper than MAX_JSON_DEPTH.
_make_encoder = getattr(json.encoder, "c_make_encoder", None)  # None without the _json C module
_C_ENCODER = _make_encoder and _make_encoder(
    None, _JSON.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)


def dumps(obj: Any) -> str:
    """Compact JSON (non-ASCII kept) of a value ``check_json`` accepted."""
    return "".join(_C_ENCODER(obj, 0)) if _C_ENCODER else _JSON.encode(obj)
