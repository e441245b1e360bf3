"""The scheduling API: ``schedule``, ``schedule_many``, ``cancel``.

Scheduling is an ordinary insert through Django's ORM: inside
``transaction.atomic()`` it commits or rolls back with the caller's rows.
Bad input raises :class:`cron_at_scale.ValidationError` naming the argument,
before anything is written.
"""

from __future__ import annotations

import csv
import io
import math
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from django.db import IntegrityError, connection, transaction

from . import conf
from . import cron as cronlib
from .app import is_registered
from .exceptions import ValidationError
from .models import DEFAULT_CATCHUP_WINDOW, LIVE_STATUSES, Catchup, Job, Overlap, ScheduleType, Status
from .recurrence import Recurrence
from .sql import QUERIES

_ARGUMENTS = ["args", "kwargs", "at", "countdown", "cron", "every", "tz", "queue", "max_retries", "key",
              "catchup", "catchup_window", "overlap", "jitter"]
_CATCHUPS = tuple(Catchup.values)
_OVERLAPS = tuple(Overlap.values)
MAX_COUNTDOWN = 100 * 365 * 86400  # seconds; a longer horizon is a bug, not a plan
MAX_JSON_DEPTH = 64
MAX_INT_BITS = 1024  # far beyond any id or amount; Python refuses to print ints of ~4300+ digits
# Options a job may carry: Celery's message priority and the retry policy's overrides.
_OPTIONS = {"priority", "retry_backoff", "retry_backoff_max", "retry_jitter", "retry_all_exceptions"}


def _show(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, never failing (a 5000-digit int's repr raises)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_text(field: str, value: Any, max_len: int, *, allow_none: bool = False) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not value:
        raise ValidationError(field, f"must be a non-empty string, got {_show(value, 80)}")
    if len(value) > max_len:
        raise ValidationError(field, f"is {len(value)} characters long; the limit is {max_len}")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(field, "must be valid Unicode (no lone surrogates)") from None
    return value


def _check_json(field: str, value: Any, depth: int = 0) -> None:
    """Accept exactly what JSON (and PostgreSQL's jsonb) round-trips unchanged."""
    if depth > MAX_JSON_DEPTH:
        raise ValidationError(field, f"is nested deeper than {MAX_JSON_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise ValidationError(field, f"an integer of {value.bit_length()} bits is too large (the limit is "
                                         f"{MAX_INT_BITS} bits)")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(field, f"{_show(value)} is not JSON (NaN and infinity are not allowed)")
        if abs(value) >= 2.0**53 and value.is_integer():
            # jsonb keeps it as an exact number and it would come back an int: say so now
            raise ValidationError(field, f"the float {_show(value)} is beyond 2**53 and would arrive as an int; "
                                         "pass an int or a string")
        return
    if isinstance(value, str):
        if "\x00" in value:
            raise ValidationError(field, "strings must not contain NUL characters (PostgreSQL jsonb refuses them)")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError(field, "strings must be valid Unicode (no lone surrogates)") from None
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_json(field, item, depth + 1)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValidationError(field, f"dict keys must be strings, got {_show(k, 40)}")
            _check_json(field, k, depth + 1)
            _check_json(field, v, depth + 1)
        return
    raise ValidationError(field, f"{type(value).__name__} is not JSON-serializable (payloads are JSON only)")


def _check_batch_size(batch_size: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 1_000_000:
        raise ValidationError("batch_size", f"must be an integer from 1 to 1000000, got {_show(batch_size)}")


def _refuse_private(spec: Mapping[str, Any]) -> None:
    for name in spec:
        if not isinstance(name, str):
            raise ValidationError("specs", f"argument names must be strings, got {_show(name)}")
        if name.startswith("_"):
            raise ValidationError(name, "unknown argument")


def _check_option(opt: str, value: Any) -> None:
    if opt == "priority" and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255):
        raise ValidationError(opt, f"must be an integer from 0 to 255, got {_show(value, 40)}")
    if opt in ("retry_backoff", "retry_backoff_max") and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        or not 0 <= value <= MAX_COUNTDOWN
    ):
        raise ValidationError(opt, f"must be a number of seconds from 0 to {MAX_COUNTDOWN}, got {_show(value, 40)}")
    if opt in ("retry_jitter", "retry_all_exceptions") and not isinstance(value, bool):
        raise ValidationError(opt, f"must be True or False, got {_show(value, 40)}")


def _seconds(field_name: str, value: Any, minimum: float = 0.0) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not minimum <= value <= MAX_COUNTDOWN:
        raise ValidationError(field_name, f"must be seconds (or a timedelta) from {minimum} to {MAX_COUNTDOWN}, "
                                          f"got {_show(value, 40)}")
    return float(value)


def _check_policy(recurring: bool, catchup: str, window: Any, overlap: str, jitter: Any) -> dict:
    """Validate the recurring-job policies (see ``cron_at_scale.recurrence``)."""
    if catchup not in _CATCHUPS:
        raise ValidationError("catchup", f"must be one of {', '.join(_CATCHUPS)}, got {_show(catchup, 40)}")
    if overlap not in _OVERLAPS:
        raise ValidationError("overlap", f"must be one of {', '.join(_OVERLAPS)}, got {_show(overlap, 40)}")
    window = DEFAULT_CATCHUP_WINDOW if window is None else _seconds("catchup_window", window)
    jitter = _seconds("jitter", jitter)
    customised = (catchup != "latest" or overlap != "skip" or window != DEFAULT_CATCHUP_WINDOW or jitter)
    if customised and not recurring:
        raise ValidationError("catchup" if catchup != "latest" else "overlap" if overlap != "skip" else
                              "catchup_window" if window != DEFAULT_CATCHUP_WINDOW else "jitter",
                              "applies to recurring jobs only (cron= or every=)")
    return {"catchup": catchup, "catchup_window": window, "overlap": overlap, "jitter": jitter}


def _check_tz(tz: str) -> None:
    _check_text("tz", tz, 64)  # NUL and lone surrogates too, which zone lookup would not name
    cronlib.check_zone(tz)


def _task_name(task: Any, registered: set[str] | None = None) -> str:
    name = getattr(task, "name", task)
    if not isinstance(name, str):
        raise ValidationError("task", f"must be a Celery task or its registered name, got {_show(task, 60)}")
    _check_text("task", name, 200)
    if registered is not None and name in registered:
        return name
    if conf.get("VALIDATE_TASK_NAMES") and not is_registered(name):
        raise ValidationError("task", f"{_show(name)} is not a registered Celery task")
    if registered is not None:
        registered.add(name)
    return name


def db_now() -> datetime:
    """The database's clock (``statement_timestamp()``), an aware datetime."""
    with connection.cursor() as cur:
        cur.execute(QUERIES["db_now"])
        return cur.fetchone()[0]


def _needs_db_now(spec: Mapping[str, Any]) -> bool:
    return spec.get("at") is None


def build_job(
    task: Any,
    *,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    at: datetime | None = None,
    countdown: float | None = None,
    cron: str | None = None,
    tz: str = "UTC",
    queue: str | None = None,
    max_retries: int = 3,
    key: str | None = None,
    every: float | timedelta | None = None,
    catchup: str = "latest",
    catchup_window: float | timedelta | None = None,
    overlap: str = "skip",
    jitter: float | timedelta = 0,
    _db_now: datetime | None = None,
    _registered: set[str] | None = None,
    **options: Any,
) -> Job:
    """Validate one job's arguments and return the unsaved ``Job`` (see ``schedule``)."""
    name = _task_name(task, _registered)
    given = [n for n, v in (("at", at), ("countdown", countdown), ("cron", cron), ("every", every)) if v is not None]
    if len(given) > 1 and given != ["at", "every"]:
        raise ValidationError(given[1], f"give one of at, countdown, cron, every (or at with every); got {' and '.join(given)}")
    if isinstance(args, (str, bytes, Mapping)) or not isinstance(args, Iterable):
        raise ValidationError("args", f"must be a list or tuple, got {type(args).__name__}")
    args = list(args)
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping):
        raise ValidationError("kwargs", f"must be a dict, got {type(kwargs).__name__}")
    kwargs = dict(kwargs)
    _check_json("args", args)
    _check_json("kwargs", kwargs)
    payload = {"args": args, "kwargs": kwargs}
    size, limit = len(_dumps(payload).encode()), conf.get("MAX_PAYLOAD_BYTES")
    if size > limit:
        big = "args" if len(_dumps(args)) >= len(_dumps(kwargs)) else "kwargs"
        raise ValidationError(big, f"the payload (args and kwargs) is {size} bytes as JSON; the limit is {limit} "
                                   "(CRON_AT_SCALE['MAX_PAYLOAD_BYTES']): pass an id, not the data")
    queue = _check_text("queue", queue, 200, allow_none=True) or ""
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or not 0 <= max_retries <= 1000:
        raise ValidationError("max_retries", f"must be an integer from 0 to 1000, got {_show(max_retries, 40)}")
    key = _check_text("key", key, 255, allow_none=True)
    for opt, value in options.items():
        if opt not in _OPTIONS:
            raise ValidationError(opt, f"unknown argument; schedule() takes {', '.join(_ARGUMENTS + sorted(_OPTIONS))}")
        _check_option(opt, value)
    tz = cronlib.zone_name(tz)  # type: ignore[assignment]  # a ZoneInfo is taken by its IANA name
    if not isinstance(tz, str):
        raise ValidationError("tz", f"must be an IANA time zone name, got {_show(tz, 40)}")

    recurring = cron is not None or every is not None
    job_id = uuid.uuid4()
    policy = _check_policy(recurring, catchup, catchup_window, overlap, jitter)
    if every is not None:
        every = _seconds("every", every, minimum=0.001)
    if at is not None:
        if not isinstance(at, datetime):
            raise ValidationError("at", f"must be a datetime, got {type(at).__name__}")
        if at.tzinfo is None or at.utcoffset() is None:
            raise ValidationError("at", "must be an aware datetime (naive datetimes are ambiguous; use UTC)")
        try:  # stored in UTC: any offset Python allows, and the year must stay within 1..9999 there
            at = at.astimezone(timezone.utc)
        except (OverflowError, ValueError):
            raise ValidationError("at", f"{_show(at)} is out of range once in UTC") from None
    schedule_type, occurrence_at = ScheduleType.ONCE, None
    if at is not None and every is None:
        fire_at = at
    else:
        now = _db_now or db_now()
        if countdown is not None:
            if isinstance(countdown, bool) or not isinstance(countdown, (int, float)):
                raise ValidationError("countdown", f"must be a number of seconds, got {_show(countdown, 40)}")
            if not math.isfinite(countdown) or not 0 <= countdown <= MAX_COUNTDOWN:
                raise ValidationError("countdown", f"must be from 0 to {MAX_COUNTDOWN} seconds, got {_show(countdown)}")
            fire_at = now + timedelta(seconds=countdown)
        elif recurring:
            if cron is not None:
                cronlib.validate(cron, tz)
                schedule_type = ScheduleType.CRON
            else:
                _check_tz(tz)
                schedule_type = ScheduleType.INTERVAL
            rec = Recurrence(str(job_id), schedule_type, cron or "", tz, every, policy["jitter"])
            try:
                occurrence_at, fire_at = rec.first(now, start=at)
            except OverflowError:
                raise ValidationError("at" if at is not None else "every",
                                      "the first occurrence is beyond the year 9999") from None
        else:
            fire_at = now
    if schedule_type == ScheduleType.ONCE:
        _check_tz(tz)
    return Job(
        id=job_id,
        schedule_type=schedule_type,
        interval=every,
        occurrence_at=occurrence_at,
        **policy,
        fire_at=fire_at,
        cron_expr=cron or "",
        timezone=tz,
        task=name,
        payload=payload,
        queue=queue,
        options=dict(options),
        status=Status.PENDING,
        retries=0,
        max_retries=max_retries,
        attempts=0,
        lost_attempts=0,
        cancel_requested=False,
        locked_by="",
        key=key,
    )


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _live_job_by_key(key: str) -> Job | None:
    return Job.objects.filter(key=key, status__in=LIVE_STATUSES).first()


def schedule(task: Any, **spec: Any) -> Job:
    """Schedule one job and return it (the ``Job`` row, saved).

    ``task``: a Celery task or its registered name. Exactly one of, or none of:
    ``at`` (an aware datetime), ``countdown`` (seconds from now on the
    database clock), ``cron`` (crontab(5) expression, 5 fields or 6 with
    leading seconds, or a macro such as ``@daily``) with ``tz`` (IANA zone,
    default ``"UTC"``); none means now. ``args`` (list) and ``kwargs`` (dict)
    must be JSON. ``queue``: Celery queue (default: the task's routing).
    ``max_retries``: retries after the first attempt (Celery's meaning).
    ``key``: idempotency key, unique among live (pending, in-progress or
    paused) jobs; scheduling the same key again returns the existing job.
    ``every``: seconds (or a timedelta) between occurrences of an interval
    job, counted from the previous scheduled one (first at ``at`` if given).
    Recurring jobs (``cron``/``every``) take ``catchup`` (``"latest"``,
    ``"all"``, ``"skip"``), ``catchup_window`` (seconds, default 300),
    ``overlap`` (``"skip"``, ``"buffer_one"``, ``"allow"``) and ``jitter``
    (seconds); see ``cron_at_scale.recurrence``. ``priority``: Celery message priority. ``retry_backoff``,
    ``retry_backoff_max`` (seconds), ``retry_jitter``, ``retry_all_exceptions``:
    this job's retry policy (see ``cron_at_scale.retry``).

    Raises ``cron_at_scale.ValidationError`` (field named) and writes nothing.
    """
    _refuse_private(spec)
    job = build_job(task, **spec)
    if job.key is None:
        job.save(force_insert=True)
        return job
    try:
        with transaction.atomic():  # a savepoint inside the caller's transaction
            job.save(force_insert=True)
        return job
    except IntegrityError:
        existing = _live_job_by_key(job.key)
        if existing is None:  # the holder finished between our insert and our read: try once more
            with transaction.atomic():
                job.save(force_insert=True)
            return job
        return existing


def schedule_many(specs: Iterable[Mapping[str, Any]], *, batch_size: int = 10_000) -> list[Job]:
    """Schedule many jobs in bulk; each spec is ``schedule``'s arguments as a dict with ``task``.

    All specs are validated before anything is written: one bad spec raises
    ``ValidationError`` (its field names the spec's index, e.g. ``"[3].cron"``)
    and no row is written. Jobs without a ``key`` go in with PostgreSQL's
    ``COPY``; keyed ones with ``INSERT ... ON CONFLICT DO NOTHING``. Inside the
    caller's transaction, like ``schedule``. Returns the jobs in spec order; a
    spec whose ``key`` names a live job returns that job.
    """
    if isinstance(specs, (str, bytes, Mapping)) or not isinstance(specs, Iterable):
        raise ValidationError("specs", f"must be a list of dicts, got {type(specs).__name__}")
    _check_batch_size(batch_size)
    specs = list(specs)
    now = db_now() if any(_needs_db_now(s) for s in specs if isinstance(s, Mapping)) else None
    jobs: list[Job] = []
    registered: set[str] = set()
    for i, spec in enumerate(specs):
        if not isinstance(spec, Mapping) or "task" not in spec:
            raise ValidationError(f"[{i}]", "each spec must be a dict with a 'task'")
        spec = dict(spec)
        task = spec.pop("task")
        try:
            _refuse_private(spec)
            jobs.append(build_job(task, _db_now=now, _registered=registered, **spec))
        except ValidationError as e:
            raise ValidationError(f"[{i}].{e.field}", e.text.split(": ", 1)[1]) from None
        except TypeError as e:
            raise ValidationError(f"[{i}]", str(e)) from None
    first_by_key: dict[str, Job] = {}
    keyed: list[Job] = []
    plain: list[Job] = []
    for job in jobs:
        if job.key is None:
            plain.append(job)
        elif job.key not in first_by_key:
            first_by_key[job.key] = job
            keyed.append(job)
    with transaction.atomic():
        for start in range(0, len(plain), batch_size):
            _copy(plain[start : start + batch_size])
        for start in range(0, len(keyed), 1000):
            Job.objects.bulk_create(keyed[start : start + 1000], ignore_conflicts=True)
        if first_by_key:
            live = {j.key: j for j in Job.objects.filter(key__in=list(first_by_key), status__in=LIVE_STATUSES)}
            return [live.get(j.key, j) if j.key is not None else j for j in jobs]
    return jobs


_COPY_COLUMNS = ("id", "schedule_type", "fire_at", "cron_expr", "timezone", "task", "payload", "queue", "options",
                 "status", "max_retries", "interval", "occurrence_at", "catchup", "catchup_window", "overlap",
                 "jitter")


def _copy(jobs: list[Job]) -> None:
    """Insert ``jobs`` (no keys) with one ``COPY ... FROM STDIN`` (CSV, strings quoted; the two
    nullable columns read "" as NULL)."""
    buf = io.StringIO()
    writer = csv.writer(buf, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n")
    for j in jobs:
        writer.writerow((
            str(j.id), j.schedule_type, j.fire_at.isoformat(), j.cron_expr, j.timezone, j.task, _dumps(j.payload),
            j.queue, _dumps(j.options), j.status, j.max_retries, j.interval,
            j.occurrence_at.isoformat() if j.occurrence_at else None, j.catchup, j.catchup_window, j.overlap, j.jitter,
        ))
    buf.seek(0)
    with connection.cursor() as cur:
        cur.copy_expert(f"COPY cron_at_scale_job ({', '.join(_COPY_COLUMNS)}) FROM STDIN WITH (FORMAT csv, FORCE_NULL (interval, occurrence_at))", buf)


def cancel(job_id: uuid.UUID | str) -> bool:
    """Cancel a job unless it already finished; True if this call cancelled it.

    A pending job will not fire; a claimed one is skipped by the worker; a
    running one sees ``current_job().cancel_requested`` at its next heartbeat.
    Raises ``ValidationError`` (field ``job_id``) for a malformed id.
    """
    with connection.cursor() as cur:
        cur.execute(QUERIES["cancel"], {"job_id": _job_uuid(job_id)})
        return cur.fetchone() is not None


def requeue(job_id: uuid.UUID | str | None = None, *, task: str | None = None, queue: str | None = None,
            failed_after: datetime | None = None, failed_before: datetime | None = None,
            all_failed: bool = False, batch_size: int = 1000) -> int:
    """Put failed jobs back to ``pending``, due now, with retries and lost attempts reset.

    One job (``job_id``), or every failed job matching the filters (``task``
    name, ``queue``, failed after/before an aware datetime); with no job id
    and no filter, ``all_failed=True`` is required (so a typo cannot requeue
    a whole dead-letter queue). Returns how many jobs were requeued. A job
    whose idempotency key is held by a live job stays failed.
    Raises ``ValidationError`` for a malformed id or filter.
    """
    from django.db.models import Q

    _check_batch_size(batch_size)
    query = Q(status=Status.FAILED)
    if job_id is not None:
        query &= Q(id=_job_uuid(job_id))
    if task is not None:
        query &= Q(task=_check_text("task", task, 200))
    if queue is not None:
        query &= Q(queue=_check_text("queue", queue, 200))
    for field_name, value, lookup in (("failed_after", failed_after, "gte"), ("failed_before", failed_before, "lt")):
        if value is not None:
            if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
                raise ValidationError(field_name, "must be an aware datetime")
            try:
                value = value.astimezone(timezone.utc)
            except (OverflowError, ValueError):
                raise ValidationError(field_name, f"{_show(value)} is out of range once in UTC") from None
            query &= Q(**{f"updated_at__{lookup}": value})
    if job_id is None and task is None and queue is None and failed_after is None and failed_before is None \
            and not all_failed:
        raise ValidationError("job_id", "give a job id, a filter, or all_failed=True")
    ids = list(Job.objects.filter(query).values_list("id", flat=True))
    done = 0
    with connection.cursor() as cur:
        for start in range(0, len(ids), batch_size):
            cur.execute(QUERIES["requeue"], {"job_ids": ids[start : start + batch_size]})
            done += cur.rowcount
    return done


def _job_uuid(job_id: Any) -> uuid.UUID:
    try:
        return job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
    except (ValueError, TypeError, AttributeError):
        raise ValidationError("job_id", f"{_show(job_id, 60)} is not a UUID") from None


def pause(job_id: uuid.UUID | str, note: str = "") -> bool:
    """Hold a recurring (cron or interval) job; True if this call paused it.

    A run already started goes on. ``note`` (say why) shows in the admin.
    Raises ``ValidationError`` for a malformed id or note.
    """
    if not isinstance(note, str) or len(note) > 2000:
        raise ValidationError("note", "must be a string of at most 2000 characters")
    if note:
        _check_text("note", note, 2000)
    with connection.cursor() as cur:
        cur.execute(QUERIES["pause"], {"job_id": _job_uuid(job_id), "note": note})
        return cur.fetchone() is not None


def resume(job_id: uuid.UUID | str) -> bool:
    """Resume a paused job; True if this call resumed it. Occurrences that fell
    due while it was paused follow its catch-up policy (``catchup``, ``catchup_window``)."""
    with connection.cursor() as cur:
        cur.execute(QUERIES["resume"], {"job_id": _job_uuid(job_id)})
        return cur.fetchone() is not None
