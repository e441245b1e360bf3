"""``schedule_many``: many jobs in one call, streamed into PostgreSQL with ``COPY``.

The same validation as ``schedule`` (plain one-off specs take a fast path
with exactly ``build_job``'s checks; anything else goes through
``build_job``), all or nothing, inside the caller's transaction.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta, timezone
from itertools import chain, islice
from typing import Any

from django.db import transaction
from django.db.models.base import ModelState

from cron_at_scale import conf
from cron_at_scale import cron as cronlib
from cron_at_scale import sql as db
from cron_at_scale.api.schedule import build_job
from cron_at_scale.api.validation import (
    MAX_COUNTDOWN,
    OPTIONS,
    check_batch_size,
    check_json,
    check_option,
    check_text,
    check_tz,
    dumps,
    refuse_private,
    task_name,
)
from cron_at_scale.exceptions import ValidationError
from cron_at_scale.ids import job_ids
from cron_at_scale.models import DEFAULT_CATCHUP_WINDOW, LIVE_STATUSES, Catchup, Job, Overlap, ScheduleType, Status
from cron_at_scale.ops import tracing
from cron_at_scale.sql import db_now


def schedule_many(specs: Iterable[Mapping[str, Any]], *, batch_size: int = 10_000) -> list[Job]:
    """Schedule many jobs in bulk; each spec is ``schedule``'s arguments as a dict with ``task``.

    All or nothing: one bad spec raises ``ValidationError`` (its field names
    the spec's index, e.g. ``"[3].cron"``) and no row is written. Jobs without
    a ``key`` go in with PostgreSQL's ``COPY`` (``batch_size`` rows a
    statement); keyed ones (and those with a ``grace``) with ``INSERT ... ON CONFLICT DO NOTHING``. Inside
    the caller's transaction, like ``schedule``. Returns the jobs in spec
    order; a spec whose ``key`` names a live job returns that job.
    """
    if isinstance(specs, (str, bytes, Mapping)) or not isinstance(specs, Iterable):
        raise ValidationError("specs", f"must be a list of dicts, got {type(specs).__name__}")
    check_batch_size(batch_size)
    specs = list(specs)
    if not specs:
        return []
    now = db_now()  # now, not halfway: once the COPY streams, a query cannot go on the connection
    if conf.shard_map() is None:
        with _gc_paused(), transaction.atomic(using=conf.db_alias()):
            return _schedule_many(specs, batch_size, now)
    # SHARD_DATABASES: every job on its shard's database, in one transaction on each, committed
    # one after the other once every row is in (all or nothing up to the commits)
    with _gc_paused(), ExitStack() as stack:
        for alias in conf.shard_aliases():
            stack.enter_context(transaction.atomic(using=alias))
        return _schedule_many(specs, batch_size, now, sharded=True)


def _schedule_many(specs: list[Any], batch_size: int, now: datetime, sharded: bool = False) -> list[Job]:
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
                    refuse_private(spec)
                    job = build_job(task, _db_now=now, _registered=registered, **spec)
                except ValidationError as e:
                    raise ValidationError(f"[{i}].{e.field}", e.text.split(": ", 1)[1]) from None
                except TypeError as e:
                    raise ValidationError(f"[{i}]", str(e)) from None
                if job.key is not None or job.grace is not None:  # not a column of the COPY: inserted below
                    order.append(job)
                    continue
                row = _job_row(job)
            order.append(None)
            yield row

    source = rows()
    copied: list[Job] = []
    trace = tracing.carrier()  # one caller, one span: the same context on every job of the call
    if sharded:  # every spec checked first, then each database's rows copied there
        made = list(source)
        by_alias = conf.by_job_alias(made, lambda row: row[0])
        jobs: dict[Any, Job] = {}
        for alias, part in by_alias.items():
            with conf.using(alias):
                left = iter(part)
                while batch := _copy(left, batch_size, trace):
                    jobs.update((job.id, job) for job in batch)
        copied = [jobs[row[0]] for row in made]
    while not sharded and (batch := _copy(source, batch_size, trace)):
        copied += batch
    first_by_key: dict[str, Job] = {}
    unkeyed: list[Job] = []
    for job in order:
        if job is not None and job.key is None:
            unkeyed.append(job)
        elif job is not None and job.key not in first_by_key:
            first_by_key[job.key] = job
    inserts = unkeyed + list(first_by_key.values())
    live: dict[str, Job] = {}
    for alias in conf.shard_aliases() if sharded else [conf.db_alias()]:
        mine = [job for job in inserts if conf.alias_of_job(job.id) == alias] if sharded else inserts
        for start in range(0, len(mine), 1000):
            Job.objects.using(alias).bulk_create(mine[start : start + 1000], ignore_conflicts=True)
        keys = [job.key for job in mine if job.key is not None]
        if keys:
            live.update((j.key, j) for j in Job.objects.using(alias).filter(key__in=keys, status__in=LIVE_STATUSES))
    copied_jobs = iter(copied)
    return [next(copied_jobs) if job is None else job if job.key is None else live.get(job.key, job) for job in order]


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
_FAST_KEYS = frozenset({"task", "args", "kwargs", "at", "countdown", "queue", "max_retries", "tz", *OPTIONS})
_BASIC_KEYS = _FAST_KEYS - OPTIONS


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
        name = task if type(task) is str and task in self.registered else task_name(task, self.registered)
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
        check_json("args", args)
        if kwargs:
            check_json("kwargs", kwargs)
        payload = {"args": args, "kwargs": kwargs}
        payload_json = f'{{"args":{dumps(args)},"kwargs":{dumps(kwargs) if kwargs else "{}"}}}'  # = dumps(payload)
        if (len(payload_json) if payload_json.isascii() else len(payload_json.encode())) > self.limit:
            return None
        queue = get("queue")
        if queue is None:
            queue = ""
        elif type(queue) is not str:
            return None
        elif queue not in self.queues:
            self.queues.add(check_text("queue", queue, 200))  # type: ignore[arg-type]
        max_retries = get("max_retries")
        if max_retries is not None and (type(max_retries) is not int or not 0 <= max_retries <= 1000):
            return None
        options: dict[str, Any] = {}
        if not spec.keys() <= _BASIC_KEYS:
            options = {opt: value for opt, value in spec.items() if opt in OPTIONS}
            for opt, value in options.items():
                options[opt] = check_option(opt, value)
        tz = cronlib.zone_name(get("tz", "UTC"))
        if type(tz) is not str:
            return None
        if tz not in self.zones:
            check_tz(tz)
            self.zones.add(tz)
        at, countdown = get("at"), get("countdown")
        if at is not None:
            if countdown is not None or not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
                return None
            try:
                fire_at = at.astimezone(timezone.utc)
            except (OverflowError, ValueError):
                return None
            if (fire_at - self.now).total_seconds() > MAX_COUNTDOWN:
                return None
        elif countdown is not None:
            if (type(countdown) is not int and type(countdown) is not float) or not 0 <= countdown <= MAX_COUNTDOWN:
                return None  # NaN and infinity fail the comparison too
            fire_at = self.now + timedelta(seconds=countdown)
        else:
            fire_at = self.now
        return (next(self.ids), fire_at, name, payload, queue, options, tz, max_retries, payload_json,
                dumps(options) if options else "{}", _ONE_OFF)


def _job_row(job: Job) -> tuple:
    """The row of a job ``build_job`` made (no key)."""
    return (job.id, job.fire_at, job.task, job.payload, job.queue, job.options, job.timezone, job.max_retries,
            dumps(job.payload), dumps(job.options),
            (str(job.schedule_type), job.cron_expr, job.interval, job.occurrence_at, str(job.catchup),
             job.catchup_window, str(job.overlap), job.jitter))


# Columns that are the same for every job are left to their database defaults (retries, attempts, ...).
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy(rows: Iterator[tuple], limit: int, trace: dict[str, str] | None = None, chunk: int = 1000) -> list[Job]:
    """Insert up to ``limit`` rows taken from ``rows`` with one ``COPY ... FROM STDIN`` (text format)
    and return their Jobs, each with ``trace`` as its trace context; none left, no COPY. The COPY streams ``chunk`` rows at a time: PostgreSQL
    parses and indexes one while Python takes the next from ``rows`` and builds the Jobs of the last."""
    jobs: list[Job] = []
    alias = conf.db_alias()
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
                f"\t{number(window)}\t{overlap}\t{number(jitter)}\t{_PENDING}\t{traced}\n")

    traced = "\\N" if trace is None else text(dumps(trace))

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
            jobs.extend([_job_from_row(row, alias, trace) for row in part])

    stream = chunks()
    first = next(stream, None)  # a bad spec here raises before any COPY
    if first is None:
        return jobs
    reader = _Reader(chain([first], stream))
    db.run("copy_jobs", copy_from=reader, retries=0)
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
                 "missed_occurrences": 0, "skipped_occurrences": 0, "expired_runs": 0, "pause_note": "",
                 "trace_context": None}
_ONE_OFF_DEFAULTS = {**_JOB_DEFAULTS, **dict(zip(_RECURRENCE_FIELDS, _ONE_OFF))}


def _job_from_row(row: tuple, alias: str, trace: dict[str, str] | None = None) -> Job:
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
    values["trace_context"] = trace
    values["_state"] = state
    return job
