"""The scheduling API: ``schedule`` builds one job from its arguments and inserts it.

Scheduling is an ordinary insert through Django's ORM: inside
``transaction.atomic()`` it commits or rolls back with the caller's rows.
Bad input raises :class:`cron_at_scale.ValidationError` naming the argument,
and nothing is written.

``reschedule`` changes a stored job in place from the same arguments (the
writing itself is ``cron_at_scale.api.control.apply_change``).

The rest of the API lives beside it and is importable from here too:
``schedule_many`` (bulk, ``COPY``) in ``cron_at_scale.api.bulk``; ``cancel``,
``requeue``, ``pause``, ``resume`` in ``cron_at_scale.api.control``; the input
checks in ``cron_at_scale.api.validation``.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from cron_at_scale import conf
from cron_at_scale import cron as cronlib
from cron_at_scale.api.control import apply_change, cancel, differing_schedule_fields, pause, requeue, resume
from cron_at_scale.api.validation import (
    ARGUMENTS,
    MAX_COUNTDOWN,
    MAX_INT_BITS,
    MAX_JSON_DEPTH,
    OPTIONS,
    check_changes,
    check_horizon,
    check_json,
    check_option,
    check_policy,
    check_text,
    check_tz,
    dumps,
    horizon_error,
    refuse_private,
    seconds,
    show,
    task_name,
)
from cron_at_scale.exceptions import KeyConflict, ValidationError
from cron_at_scale.ids import new_job_id, shard_of_key
from cron_at_scale.models import LIVE_STATUSES, Job, ScheduleType, Status
from cron_at_scale.ops import tracing
from cron_at_scale.policy import expiry
from cron_at_scale.policy.recurrence import Recurrence
from cron_at_scale.sql import db_now  # the database's clock; a name here too, as before

if TYPE_CHECKING:
    from cron_at_scale.api.bulk import schedule_many

__all__ = ["schedule", "reschedule", "build_job", "db_now", "schedule_many", "cancel", "requeue", "pause", "resume",
           "ValidationError", "KeyConflict", "MAX_COUNTDOWN", "MAX_INT_BITS", "MAX_JSON_DEPTH"]


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
    grace: float | timedelta | None = None,
    _db_now: datetime | None = None,
    _registered: set[str] | None = None,
    **options: Any,
) -> Job:
    """Validate one job's arguments and return the unsaved ``Job`` (see ``schedule``)."""
    name = task_name(task, _registered)
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
    check_json("args", args)
    check_json("kwargs", kwargs)
    payload = {"args": args, "kwargs": kwargs}
    size, limit = len(dumps(payload).encode()), conf.get("MAX_PAYLOAD_BYTES")
    if size > limit:
        big = "args" if len(dumps(args)) >= len(dumps(kwargs)) else "kwargs"
        raise ValidationError(big, f"the payload (args and kwargs) is {size} bytes as JSON; the limit is {limit} "
                                   "(CRON_AT_SCALE['MAX_PAYLOAD_BYTES']): pass an id, not the data")
    queue = check_text("queue", queue, 200, allow_none=True) or ""
    if max_retries is not None and (
            isinstance(max_retries, bool) or not isinstance(max_retries, int) or not 0 <= max_retries <= 1000):
        raise ValidationError("max_retries", f"must be an integer from 0 to 1000 or None, got {show(max_retries, 40)}")
    key = check_text("key", key, 255, allow_none=True)
    if options.get("expires", 0) is None:
        del options["expires"]  # Celery's default: no expiry
    expires_at = options.pop("expires", None) if isinstance(options.get("expires"), datetime) else None
    if "expires" in options:
        options["expires"] = expiry.check(options["expires"])
    for opt, value in options.items():
        if opt not in OPTIONS:
            raise ValidationError(opt, f"unknown argument; schedule() takes {', '.join(ARGUMENTS + sorted(OPTIONS))}")
        options[opt] = check_option(opt, value)
    tz = cronlib.zone_name(tz)  # type: ignore[assignment]  # a ZoneInfo is taken by its IANA name
    if not isinstance(tz, str):
        raise ValidationError("tz", f"must be an IANA time zone name, got {show(tz, 40)}")

    recurring = cron is not None or every is not None
    job_id = new_job_id(None if key is None else shard_of_key(key))
    policy = check_policy(recurring, catchup, catchup_window, overlap, jitter)
    if every is not None:
        every = seconds("every", every, minimum=0.001)
    if grace is not None:
        grace = seconds("grace", grace, minimum=0.001)
        if not recurring:
            raise ValidationError("grace", "applies to recurring jobs only (cron= or every=)")
    if at is not None:
        if not isinstance(at, datetime):
            raise ValidationError("at", f"must be a datetime, got {type(at).__name__}")
        if at.tzinfo is None or at.utcoffset() is None:
            raise ValidationError("at", "must be an aware datetime (naive datetimes are ambiguous; use UTC)")
        try:  # stored in UTC: any offset Python allows, and the year must stay within 1..9999 there
            at = at.astimezone(timezone.utc)
        except (OverflowError, ValueError):
            raise ValidationError("at", f"{show(at)} is out of range once in UTC") from None
        # The local clock when no database time was read: a skew of seconds is nothing beside 100 years.
        check_horizon("at", at, _db_now or datetime.now(timezone.utc), at)
    schedule_type, occurrence_at = ScheduleType.ONCE, None
    if at is not None and every is None:
        fire_at = at
    else:
        now = _db_now or db_now()
        if countdown is not None:
            if isinstance(countdown, bool) or not isinstance(countdown, (int, float)):
                raise ValidationError("countdown", f"must be a number of seconds, got {show(countdown, 40)}")
            if not math.isfinite(countdown) or countdown < 0:
                raise ValidationError("countdown", f"must be 0 or more seconds, got {show(countdown)}")
            if countdown > MAX_COUNTDOWN:
                raise horizon_error("countdown", countdown)
            fire_at = now + timedelta(seconds=countdown)
        elif recurring:
            if cron is not None:
                cronlib.validate(cron, tz)
                schedule_type = ScheduleType.CRON
            else:
                check_tz(tz)
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
        check_tz(tz)
    if expires_at is not None:
        options["expires"] = expiry.from_datetime(expires_at, fire_at, recurring)
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
        grace=grace,
        trace_context=tracing.carrier(),  # the caller's span, if any (NULL otherwise: nothing stored)
    )


def _live_job_by_key(key: str) -> Job | None:
    return Job.objects.using(conf.db_alias()).filter(key=key, status__in=LIVE_STATUSES).first()



def schedule(task: Any, *, update: bool = False, **spec: Any) -> Job:
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
    paused) jobs; scheduling the same key again returns the existing job, if its
    schedule is the same (``schedule_type``, ``cron_expr``, ``timezone``, ``interval``,
    ``catchup``, ``catchup_window``, ``overlap``, ``jitter``); if one differs it raises
    ``cron_at_scale.KeyConflict`` naming them, unless ``update=True``: then the
    live job is changed in place to this call's definition (:func:`reschedule`; a
    one-off job already claimed is returned unchanged).
    ``every``: seconds (or a timedelta) between occurrences of an interval
    job, counted from the previous scheduled one (first at ``at`` if given).
    Recurring jobs (``cron``/``every``) take ``catchup`` (``"latest"``,
    ``"all"``, ``"skip"``), ``catchup_window`` (seconds, default 300),
    ``overlap`` (``"skip"``, ``"buffer_one"``, ``"allow"``) and ``jitter``
    (seconds); see ``cron_at_scale.policy.recurrence``. ``grace``: seconds an occurrence of a recurring job
    may go without a successful run before the job is overdue (default: the ``OVERDUE_GRACE``
    setting, 300 s); see ``cron_at_scale.maintenance.overdue``. ``priority``: Celery message priority. ``retry_backoff``
    (Celery's: ``True`` or a factor in seconds, delay ``factor * 2**n``), ``retry_backoff_max``
    (seconds), ``retry_jitter``, ``retry_all_exceptions``, ``autoretry_for`` and ``dont_autoretry_for``
    (lists of exception classes or import paths, stored as paths), ``retry_kwargs`` (``max_retries``,
    ``countdown``): this job's retry policy, the task's Celery options of the same names replaced for
    this job (see ``cron_at_scale.policy.retry``). ``expires``: seconds (or a timedelta; for
    a one-off job also an aware datetime, taken as that many seconds after its ``fire_at``): a run
    not started that long after its scheduled time is skipped and counted in ``expired_runs``,
    never run (Celery's ``expires``; see ``cron_at_scale.policy.expiry``).

    Raises ``cron_at_scale.ValidationError`` (field named) and writes nothing.
    """
    refuse_private(spec)
    if not isinstance(update, bool):
        raise ValidationError("update", f"must be True or False, got {show(update, 40)}")
    job = build_job(task, **spec)
    with conf.using(conf.alias_of_job(job.id)):  # the job's own database (SHARD_DATABASES)
        return _save(job, update, spec)


def _save(job: Job, update: bool, spec: dict[str, Any]) -> Job:
    """Insert ``job``; for a key already live, the live job (or it, changed: ``update``)."""
    if job.key is None:
        job.save(force_insert=True, using=conf.db_alias())
        return job
    try:
        with transaction.atomic(using=conf.db_alias()):  # a savepoint inside the caller's transaction
            job.save(force_insert=True, using=conf.db_alias())
        return job
    except IntegrityError:
        existing = _live_job_by_key(job.key)
        if existing is None:  # the holder finished between our insert and our read: try once more
            with transaction.atomic(using=conf.db_alias()):
                job.save(force_insert=True, using=conf.db_alias())
            return job
    differ = differing_schedule_fields(existing, job)
    if not update:
        if differ:
            raise KeyConflict(differ[0], f"key {job.key!r} is held by live job {existing.id}, whose schedule differs "
                              "in " + ", ".join(f"{f} ({show(getattr(existing, f), 40)} there, "
                                                f"{show(getattr(job, f), 40)} here)" for f in differ)
                              + ": pass update=True to change that job in place, or use another key",
                              fields=differ, job=existing)
        return existing
    if existing.schedule_type == ScheduleType.ONCE and existing.status != Status.PENDING:
        return existing  # already claimed or running: left alone
    return reschedule(existing, **_definition_spec(job, spec))


def _definition_spec(job: Job, given: Mapping[str, Any]) -> dict[str, Any]:
    """``reschedule()`` arguments that make a stored job look like ``job`` (built from ``given``)."""
    spec: dict[str, Any] = {"task": job.task, "args": job.payload["args"], "kwargs": job.payload["kwargs"],
                            "queue": job.queue or None, "max_retries": job.max_retries, "tz": job.timezone,
                            **{opt: job.options.get(opt) for opt in OPTIONS}}
    if job.schedule_type != ScheduleType.ONCE:
        spec.update(catchup=job.catchup, catchup_window=job.catchup_window, overlap=job.overlap, jitter=job.jitter)
        spec["cron" if job.schedule_type == ScheduleType.CRON else "every"] = job.cron_expr or job.interval
    for name in ("at", "countdown"):
        if given.get(name) is not None:
            spec[name] = given[name]
    return spec


def _locked_job(job_or_key: Any) -> Job:
    """The job named by ``job_or_key`` (a ``Job``, its id, or the key of a live job), row-locked."""
    if isinstance(job_or_key, Job):
        lookup = Q(pk=job_or_key.pk)
    elif isinstance(job_or_key, uuid.UUID):
        lookup = Q(pk=job_or_key)
    elif isinstance(job_or_key, str) and job_or_key:
        try:
            lookup = Q(pk=uuid.UUID(job_or_key)) | Q(key=job_or_key, status__in=LIVE_STATUSES)
        except ValueError:
            lookup = Q(key=check_text("job_or_key", job_or_key, 255), status__in=LIVE_STATUSES)
    else:
        raise ValidationError("job_or_key", f"must be a Job, a job id or a key, got {show(job_or_key, 60)}")
    job = Job.objects.using(conf.db_alias()).select_for_update().filter(lookup).order_by("-created_at").first()
    if job is None:
        raise ValidationError("job_or_key", f"no job with id or live key {show(job_or_key, 80)}")
    return job


def reschedule(job_or_key: Any, **changes: Any) -> Job:
    """Change a stored job in place and return it, refreshed. Only the arguments given change.

    ``job_or_key``: a ``Job``, its id (UUID or text), or the key of a live job.
    ``changes``: ``schedule()``'s arguments but ``key``, and ``task``: ``cron`` and
    ``tz``, ``every`` (and ``at``, an interval's first occurrence), ``args``,
    ``kwargs``, ``queue``, ``max_retries``, ``catchup``, ``catchup_window``,
    ``overlap``, ``jitter``, ``priority`` and the retry options (``None`` removes
    an option; ``queue=None``, ``max_retries=None``: the task's). ``cron`` on an
    interval job makes it a cron job, ``every`` on a cron job an interval job.
    A one-off job takes ``at`` or ``countdown``, and only while ``pending``.

    A recurring job whose schedule changes (cron expression, zone, interval,
    jitter, ``at``) runs from the new schedule's first occurrence after the
    change, on the database clock (an interval: ``every`` seconds after the
    change, or at ``at``): occurrences of the old schedule due before the change
    fire as the dispatcher would have fired them; its runs claimed ahead of their
    time and not started do not run; a run already started finishes under its own
    attempt number. Changing only arguments, queue, options or policies keeps
    ``fire_at`` (a run claimed ahead of its time goes out as claimed). Also works
    on a paused job (it stays paused; the occurrences of the old schedule it
    missed are counted in ``missed_occurrences``).

    One transaction, the job's row locked (``SELECT ... FOR UPDATE``): a
    dispatcher claiming it meanwhile either committed first (its runs are
    handled as above) or skips it until this commits. Raises
    ``cron_at_scale.ValidationError`` naming the field (an unknown argument, a
    bad value, a job not live, a one-off already claimed, one-off to recurring
    or back) and changes nothing.
    """
    with conf.using(alias_of(job_or_key)), transaction.atomic(using=conf.db_alias()):
        job = _locked_job(job_or_key)
        new = changed_job(job, changes)
        apply_change(job, new, move=any(changes.get(n) is not None for n in ("at", "countdown")))
        job.refresh_from_db(using=conf.db_alias())
    return job


def alias_of(job_or_key: Any) -> str:
    """The database of the job named by ``job_or_key`` (a ``Job``, its id, or a key): its shard's alias
    in ``SHARD_DATABASES`` (a key's shard comes from the key), else ``db_alias()``."""
    owner = conf.shard_map()
    if owner is None:
        return conf.db_alias()
    if isinstance(job_or_key, Job):
        return conf.alias_of_job(job_or_key.pk)
    if isinstance(job_or_key, uuid.UUID):
        return conf.alias_of_job(job_or_key)
    if isinstance(job_or_key, str) and job_or_key:
        try:
            return conf.alias_of_job(uuid.UUID(job_or_key))
        except ValueError:
            return conf.alias_of_key(job_or_key)
    return conf.db_alias()


def changed_job(job: Job, changes: Mapping[str, Any]) -> Job:
    """The unsaved, validated job ``job`` becomes with ``changes`` (``reschedule()``'s arguments);
    writes nothing. Raises ``ValidationError`` naming the argument at fault."""
    check_changes(job.schedule_type, changes)
    return build_job(changes.get("task", job.task), _db_now=db_now(), _registered={job.task},
                     **_merged_spec(job, changes))


def _merged_spec(job: Job, changes: Mapping[str, Any]) -> dict[str, Any]:
    """``build_job()`` arguments (but the task) for ``job`` with ``changes`` applied."""
    spec: dict[str, Any] = {"args": job.payload.get("args", []), "kwargs": job.payload.get("kwargs", {}),
                            "tz": job.timezone, "queue": job.queue or None, "max_retries": job.max_retries,
                            **job.options}
    if job.schedule_type != ScheduleType.ONCE:
        spec.update(catchup=job.catchup, catchup_window=job.catchup_window, overlap=job.overlap, jitter=job.jitter)
        if changes.get("cron") is None and changes.get("every") is None:
            spec["cron" if job.schedule_type == ScheduleType.CRON else "every"] = job.cron_expr or job.interval
    for name, value in changes.items():
        if name == "task":
            continue
        if name in OPTIONS and value is None:
            spec.pop(name, None)
        elif name in ("at", "countdown", "cron", "every") and value is None:
            continue
        else:
            spec[name] = value
    return spec


def __getattr__(name: str) -> Any:
    # schedule_many's module imports build_job from this one: loaded on first use, not here
    if name == "schedule_many":
        from cron_at_scale.api.bulk import schedule_many

        return schedule_many
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
