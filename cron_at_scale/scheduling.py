"""The scheduling API: ``schedule``, ``schedule_many``, ``cancel``.

Scheduling is an ordinary insert through Django's ORM: inside
``transaction.atomic()`` it commits or rolls back with the caller's rows.
Bad input raises :class:`cron_at_scale.ValidationError` naming the argument,
and nothing is written.
"""

from __future__ import annotations

import gc
import json
import math
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from itertools import chain, islice
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models.base import ModelState

from . import conf
from . import cron as cronlib
from .app import is_registered
from .exceptions import ValidationError
from .ids import job_ids, new_job_id
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
    kind = type(value)  # the commonest cases first (schedule_many checks 100,000s a second)
    if kind is int and value.bit_length() <= MAX_INT_BITS or kind is str and value.isascii() and "\x00" not in value:
        return
    if kind is list:
        for item in value:
            _check_json(field, item, depth + 1)
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
        raise ValidationError("task", f"{_show(name)} is not a registered Celery task (is the module that defines it "
                                      "imported by your Celery app, and the app by your project's __init__.py? "
                                      "or pass the task object itself)")
    if registered is not None:
        registered.add(name)
    return name


def db_now() -> datetime:
    """The database's clock (``statement_timestamp()``), an aware datetime."""
    with connection.cursor() as cur:
        cur.execute(QUERIES["db_now"])
        return cur.fetchone()[0]


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
    max_retries: int | None = None,
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
    if max_retries is not None and (
            isinstance(max_retries, bool) or not isinstance(max_retries, int) or not 0 <= max_retries <= 1000):
        raise ValidationError("max_retries", f"must be an integer from 0 to 1000 or None, got {_show(max_retries, 40)}")
    key = _check_text("key", key, 255, allow_none=True)
    for opt, value in options.items():
        if opt not in _OPTIONS:
            raise ValidationError(opt, f"unknown argument; schedule() takes {', '.join(_ARGUMENTS + sorted(_OPTIONS))}")
        _check_option(opt, value)
    tz = cronlib.zone_name(tz)  # type: ignore[assignment]  # a ZoneInfo is taken by its IANA name
    if not isinstance(tz, str):
        raise ValidationError("tz", f"must be an IANA time zone name, got {_show(tz, 40)}")

    recurring = cron is not None or every is not None
    job_id = new_job_id()
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


_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# json.dumps builds its C encoder again on every call (~2 µs); this one is built once. It has no cycle
# check: what it encodes has passed _check_json, which refuses anything nested deeper than MAX_JSON_DEPTH.
_make_encoder = getattr(json.encoder, "c_make_encoder", None)  # None without the _json C module
_C_ENCODER = _make_encoder and _make_encoder(
    None, _JSON.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)


def _dumps(obj: Any) -> str:
    return "".join(_C_ENCODER(obj, 0)) if _C_ENCODER else _JSON.encode(obj)


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
    ``max_retries``: retries after the first attempt (Celery's meaning); ``None`` (the default):
    the task's (``retry_kwargs["max_retries"]`` for its ``autoretry_for`` errors, else its
    ``max_retries``, Celery's default 3).
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

    All or nothing: one bad spec raises ``ValidationError`` (its field names
    the spec's index, e.g. ``"[3].cron"``) and no row is written. Jobs without
    a ``key`` go in with PostgreSQL's ``COPY`` (``batch_size`` rows a
    statement); keyed ones with ``INSERT ... ON CONFLICT DO NOTHING``. Inside
    the caller's transaction, like ``schedule``. Returns the jobs in spec
    order; a spec whose ``key`` names a live job returns that job.
    """
    if isinstance(specs, (str, bytes, Mapping)) or not isinstance(specs, Iterable):
        raise ValidationError("specs", f"must be a list of dicts, got {type(specs).__name__}")
    _check_batch_size(batch_size)
    specs = list(specs)
    if not specs:
        return []
    now = db_now()  # now, not halfway: once the COPY streams, a query cannot go on the connection
    with _gc_paused(), transaction.atomic():
        return _schedule_many(specs, batch_size, now)


def _schedule_many(specs: list[Any], batch_size: int, now: datetime) -> list[Job]:
    """``schedule_many`` once its arguments are checked, inside its transaction.

    Specs are validated as the COPY asks for rows, so that PostgreSQL takes in
    one chunk while Python checks the next; a bad spec ends the COPY and its
    ``ValidationError`` rolls back (the savepoint of) the rows sent before it.
    """
    registered: set[str] = set()
    fast = _FastRows(now, registered)
    order: list[Job | None] = []  # in spec order: the Job of each keyed spec, None for each row copied

    def rows() -> Iterator[tuple]:
        for i, spec in enumerate(specs):
            if (type(spec) is not dict and not isinstance(spec, Mapping)) or "task" not in spec:
                raise ValidationError(f"[{i}]", "each spec must be a dict with a 'task'")
            row = fast.row(spec)
            if row is None:  # anything unusual, or an error to report: build_job decides
                spec = dict(spec)
                task = spec.pop("task")
                try:
                    _refuse_private(spec)
                    job = build_job(task, _db_now=now, _registered=registered, **spec)
                except ValidationError as e:
                    raise ValidationError(f"[{i}].{e.field}", e.text.split(": ", 1)[1]) from None
                except TypeError as e:
                    raise ValidationError(f"[{i}]", str(e)) from None
                if job.key is not None:
                    order.append(job)
                    continue
                row = _job_row(job)
            order.append(None)
            yield row

    source = rows()
    copied: list[Job] = []
    while batch := _copy(source, batch_size):
        copied += batch
    first_by_key: dict[str, Job] = {}
    for job in order:
        if job is not None and job.key not in first_by_key:
            first_by_key[job.key] = job
    inserts = list(first_by_key.values())
    for start in range(0, len(inserts), 1000):
        Job.objects.bulk_create(inserts[start : start + 1000], ignore_conflicts=True)
    live = {j.key: j for j in Job.objects.filter(key__in=list(first_by_key), status__in=LIVE_STATUSES)} \
        if first_by_key else {}
    copied_jobs = iter(copied)
    return [next(copied_jobs) if job is None else live.get(job.key, job) for job in order]


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off: a bulk call allocates several containers a job (rows,
    payloads, Jobs), which set it off again and again over all of them (~5 µs a job). They hold no cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# A row is one job without a key, as a tuple of its column values (cheaper than a Job: ~1 µs, not ~15 µs):
# (id, fire_at, task, payload, queue, options, timezone, max_retries, payload JSON, options JSON, recurrence)
# where recurrence is _ONE_OFF or the recurring job's
# (schedule_type, cron_expr, interval, occurrence_at, catchup, catchup_window, overlap, jitter).
_ROW_FIELDS = ("id", "fire_at", "task", "payload", "queue", "options", "timezone", "max_retries")
_RECURRENCE_FIELDS = ("schedule_type", "cron_expr", "interval", "occurrence_at", "catchup", "catchup_window",
                      "overlap", "jitter")
_PENDING = str(Status.PENDING)  # the plain string, as the database gives it back
_ONE_OFF = (str(ScheduleType.ONCE), "", None, None, str(Catchup.LATEST), DEFAULT_CATCHUP_WINDOW, str(Overlap.SKIP), 0.0)
_FAST_KEYS = frozenset({"task", "args", "kwargs", "at", "countdown", "queue", "max_retries", "tz", *_OPTIONS})
_BASIC_KEYS = _FAST_KEYS - _OPTIONS


class _FastRows:
    """The row of a plain one-off job straight from its spec, with exactly ``build_job``'s checks.

    Only specs that are dicts of ``task``, ``args``, ``kwargs``, ``at`` or
    ``countdown``, ``queue``, ``max_retries``, ``tz`` and options, all valid,
    get a row; for anything else (recurring, keyed, a bad value) ``row``
    returns None and ``build_job`` decides, so its errors stay the only ones.
    Task names, queues and zones are checked once per call, not once per job.
    """

    def __init__(self, now: datetime, registered: set[str]) -> None:
        self.now = now
        self.registered = registered
        self.queues: set[str] = set()
        self.zones: set[str] = set()
        self.limit = conf.get("MAX_PAYLOAD_BYTES")
        self.ids = job_ids()

    def row(self, spec: Mapping[str, Any]) -> tuple | None:
        if type(spec) is not dict or not spec.keys() <= _FAST_KEYS:
            return None
        try:
            return self._row(spec)
        except ValidationError:
            return None

    def _row(self, spec: dict[str, Any]) -> tuple | None:
        get = spec.get
        task = spec["task"]
        name = task if type(task) is str and task in self.registered else _task_name(task, self.registered)
        args, kwargs = get("args", ()), get("kwargs")
        if type(args) is not list and type(args) is not tuple:
            return None
        args = list(args)
        if kwargs is None:
            kwargs = {}
        elif type(kwargs) is dict:
            kwargs = dict(kwargs)
        else:
            return None
        _check_json("args", args)
        if kwargs:
            _check_json("kwargs", kwargs)
        payload = {"args": args, "kwargs": kwargs}
        payload_json = f'{{"args":{_dumps(args)},"kwargs":{_dumps(kwargs) if kwargs else "{}"}}}'  # = _dumps(payload)
        if (len(payload_json) if payload_json.isascii() else len(payload_json.encode())) > self.limit:
            return None
        queue = get("queue")
        if queue is None:
            queue = ""
        elif type(queue) is not str:
            return None
        elif queue not in self.queues:
            self.queues.add(_check_text("queue", queue, 200))  # type: ignore[arg-type]
        max_retries = get("max_retries")
        if max_retries is not None and (type(max_retries) is not int or not 0 <= max_retries <= 1000):
            return None
        options: dict[str, Any] = {}
        if not spec.keys() <= _BASIC_KEYS:
            options = {opt: value for opt, value in spec.items() if opt in _OPTIONS}
            for opt, value in options.items():
                _check_option(opt, value)
        tz = cronlib.zone_name(get("tz", "UTC"))
        if type(tz) is not str:
            return None
        if tz not in self.zones:
            _check_tz(tz)
            self.zones.add(tz)
        at, countdown = get("at"), get("countdown")
        if at is not None:
            if countdown is not None or not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
                return None
            try:
                fire_at = at.astimezone(timezone.utc)
            except (OverflowError, ValueError):
                return None
        elif countdown is not None:
            if (type(countdown) is not int and type(countdown) is not float) or not 0 <= countdown <= MAX_COUNTDOWN:
                return None  # NaN and infinity fail the comparison too
            fire_at = self.now + timedelta(seconds=countdown)
        else:
            fire_at = self.now
        return (next(self.ids), fire_at, name, payload, queue, options, tz, max_retries, payload_json,
                _dumps(options) if options else "{}", _ONE_OFF)


def _job_row(job: Job) -> tuple:
    """The row of a job ``build_job`` made (no key)."""
    return (job.id, job.fire_at, job.task, job.payload, job.queue, job.options, job.timezone, job.max_retries,
            _dumps(job.payload), _dumps(job.options),
            (str(job.schedule_type), job.cron_expr, job.interval, job.occurrence_at, str(job.catchup),
             job.catchup_window, str(job.overlap), job.jitter))


# Columns that are the same for every job are left to their database defaults (retries, attempts, ...).
_COPY_SQL = ("COPY cron_at_scale_job (id, fire_at, payload, task, queue, options, timezone, max_retries, "
             "schedule_type, cron_expr, interval, occurrence_at, catchup, catchup_window, overlap, jitter, status) "
             "FROM STDIN")
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy(rows: Iterator[tuple], limit: int, chunk: int = 1000) -> list[Job]:
    """Insert up to ``limit`` rows taken from ``rows`` with one ``COPY ... FROM STDIN`` (text format)
    and return their Jobs; none left, no COPY. The COPY streams ``chunk`` rows at a time: PostgreSQL
    parses and indexes one while Python takes the next from ``rows`` and builds the Jobs of the last."""
    jobs: list[Job] = []
    alias = connection.alias
    tails: dict[tuple, str] = {}  # the columns after payload: the same for most one-off jobs

    def text(value: str) -> str:
        return value.translate(_COPY_ESCAPES)

    def time(value: datetime | None) -> str:
        return "\\N" if value is None else value.isoformat()

    def number(value: float | None) -> str:
        return "\\N" if value is None else repr(float(value))

    def recurrence(rec: tuple) -> str:
        kind, cron_expr, interval, occurrence_at, catchup, window, overlap, jitter = rec
        return (f"\t{kind}\t{text(cron_expr)}\t{number(interval)}\t{time(occurrence_at)}\t{catchup}"
                f"\t{number(window)}\t{overlap}\t{number(jitter)}\t{_PENDING}\n")

    one_off = recurrence(_ONE_OFF)

    def chunks() -> Iterator[bytes]:
        left = limit
        while left and (part := list(islice(rows, min(chunk, left)))):
            left -= len(part)
            lines = []
            for job_id, fire_at, task, _, queue, _, tz, max_retries, payload, options, rec in part:
                tail = tails.get(key := (task, queue, options, tz, max_retries)) if rec is _ONE_OFF else None
                if tail is None:
                    most = "\\N" if max_retries is None else max_retries  # NULL: the task's
                    tail = f"\t{text(task)}\t{text(queue)}\t{text(options)}\t{text(tz)}\t{most}"
                    if rec is _ONE_OFF:
                        tail = tails[key] = tail + one_off
                    else:
                        tail += recurrence(rec)
                payload = payload.replace("\\", "\\\\")  # JSON escapes tabs and line breaks itself
                lines.append(f"{job_id.hex}\t{fire_at.isoformat()}\t{payload}{tail}")
            yield "".join(lines).encode()
            jobs.extend([_job_from_row(row, alias) for row in part])

    stream = chunks()
    first = next(stream, None)  # a bad spec here raises before any COPY
    if first is None:
        return jobs
    reader = _Reader(chain([first], stream))
    with connection.cursor() as cur:
        cur.copy_expert(_COPY_SQL, reader)
    if reader.error is not None:
        raise reader.error
    return jobs


class _Reader:
    """A file for psycopg2's ``copy_expert`` whose ``read`` gives the next of ``chunks``, b"" at their end.

    An error making a chunk (a bad spec) ends the COPY as if at the end and waits in ``error``: the
    caller raises it, which rolls the rows back, rather than psycopg2 turning it into a failed COPY.
    """

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.error: Exception | None = None

    def read(self, size: int = -1) -> bytes:
        try:
            return next(self.chunks, b"")
        except Exception as e:  # noqa: BLE001
            self.error = e
            return b""


_JOB_DEFAULTS = {"status": _PENDING, "retries": 0, "attempts": 0, "lost_attempts": 0,
                 "cancel_requested": False, "locked_by": "", "locked_until": None, "key": None, "buffered_at": None,
                 "missed_occurrences": 0, "skipped_occurrences": 0, "pause_note": ""}
_ONE_OFF_DEFAULTS = {**_JOB_DEFAULTS, **dict(zip(_RECURRENCE_FIELDS, _ONE_OFF))}


def _job_from_row(row: tuple, alias: str) -> Job:
    """The saved ``Job`` of a row copied in, built without ``Model.__init__`` (~15 µs a job): as loaded from the
    database, with ``shard``, ``created_at`` and ``updated_at`` (set there) deferred until read."""
    job = Job.__new__(Job)
    state = ModelState()
    state.adding, state.db = False, alias
    values = job.__dict__
    values.update(_ONE_OFF_DEFAULTS)
    if row[10] is not _ONE_OFF:
        values.update(zip(_RECURRENCE_FIELDS, row[10]))
    values.update(zip(_ROW_FIELDS, row))
    values["_state"] = state
    return job


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
