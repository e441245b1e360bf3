"""Controls of stored jobs: ``cancel``, ``requeue``, ``pause``, ``resume``, and the change of a
job in place (:func:`apply_change`, behind ``reschedule``, ``schedule(update=True)``, the
admin's change form and the beat sync).

Each runs in the caller's transaction if there is one; a malformed argument
raises :class:`cron_at_scale.ValidationError` and changes nothing.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import datetime, timezone
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from cron_at_scale import conf
from cron_at_scale import sql as db
from cron_at_scale.api.validation import RESUME_CHOICES, check_batch_size, check_text, job_uuid, show
from cron_at_scale.dispatcher.advance import advance
from cron_at_scale.dispatcher.claimed import Claimed
from cron_at_scale.exceptions import ValidationError
from cron_at_scale.models import Job, ScheduleType, Status
from cron_at_scale.policy.recurrence import NONE, Recurrence, plan

log = logging.getLogger(__name__)

# What defines a job, compared by schedule(key=...), the beat sync and apply_change.
DEFINITION_FIELDS = ("task", "payload", "queue", "options", "max_retries", "schedule_type", "cron_expr", "timezone",
                     "interval", "catchup", "catchup_window", "overlap", "jitter")
# The fields schedule(key=K) refuses to see differ from the live job's (without update=True).
SCHEDULE_FIELDS = ("schedule_type", "cron_expr", "timezone", "interval", "catchup", "catchup_window", "overlap",
                   "jitter")


def cancel(job_id: uuid.UUID | str) -> bool:
    """Cancel a job unless it already finished; True if this call cancelled it.

    A pending job will not fire; a claimed one is skipped by the worker; a
    running one sees ``current_job().cancel_requested`` at its next heartbeat.
    Raises ``ValidationError`` (field ``job_id``) for a malformed id.
    """
    job_id = job_uuid(job_id)
    with conf.using(conf.alias_of_job(job_id)):
        return db.run("cancel", {"job_id": job_id}, fetch="one", retries=0) is not None


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
    check_batch_size(batch_size)
    query = Q(status=Status.FAILED)
    if job_id is not None:
        query &= Q(id=job_uuid(job_id))
    if task is not None:
        query &= Q(task=check_text("task", task, 200))
    if queue is not None:
        query &= Q(queue=check_text("queue", queue, 200))
    for field_name, value, lookup in (("failed_after", failed_after, "gte"), ("failed_before", failed_before, "lt")):
        if value is not None:
            if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
                raise ValidationError(field_name, "must be an aware datetime")
            try:
                value = value.astimezone(timezone.utc)
            except (OverflowError, ValueError):
                raise ValidationError(field_name, f"{show(value)} is out of range once in UTC") from None
            query &= Q(**{f"updated_at__{lookup}": value})
    if job_id is None and task is None and queue is None and failed_after is None and failed_before is None \
            and not all_failed:
        raise ValidationError("job_id", "give a job id, a filter, or all_failed=True")
    done = 0
    aliases = [conf.alias_of_job(job_uuid(job_id))] if job_id is not None else conf.shard_aliases()
    for alias in aliases:  # each database of SHARD_DATABASES its own
        with conf.using(alias):
            ids = list(Job.objects.using(alias).filter(query).values_list("id", flat=True))
            for start in range(0, len(ids), batch_size):
                done += db.run("requeue", {"job_ids": ids[start : start + batch_size]}, fetch="count", retries=0)
    return done


def pause(job_id: uuid.UUID | str, note: str = "") -> bool:
    """Hold a recurring (cron or interval) job; True if this call paused it.

    A run already started goes on. ``note`` (say why) shows in the admin.
    Raises ``ValidationError`` for a malformed id or note.
    """
    if not isinstance(note, str) or len(note) > 2000:
        raise ValidationError("note", "must be a string of at most 2000 characters")
    if note:
        check_text("note", note, 2000)
    job_id = job_uuid(job_id)
    with conf.using(conf.alias_of_job(job_id)):
        return db.run("pause", {"job_id": job_id, "note": note}, fetch="one", retries=0) is not None


def resume(job_id: uuid.UUID | str, missed: str | None = None) -> bool:
    """Resume a paused job; True if this call resumed it (False: it was not paused).

    ``missed``: what to do with the occurrences that fell due while it was paused,
    within its ``catchup_window`` (seconds; older ones are always missed):

    * ``None`` (default): the job's own ``catchup`` policy, applied by the next claim as
      after any outage (``"latest"``, ``"all"``, or ``"skip"``, which fires a lone due
      occurrence; see :mod:`cron_at_scale.policy.recurrence`);
    * ``"skip"``: fire none of them; the job waits for its next future occurrence;
    * ``"latest"``: fire the latest of them, once;
    * ``"all"``: fire each of them.

    With a choice, the runs are fired by this call (logged in this transaction,
    published to the broker once it commits; a publish that fails is fired again by
    a dispatcher's reaper after ``DISPATCH_LEASE``), under the job's ``overlap`` policy.
    Occurrences not fired are counted in ``missed_occurrences``.
    Raises ``ValidationError`` (field ``job_id`` or ``missed``) and changes nothing.
    """
    if missed is not None and missed not in RESUME_CHOICES:
        raise ValidationError("missed", f"must be one of {', '.join(RESUME_CHOICES)} or None, got {show(missed, 40)}")
    job_uuid_ = job_uuid(job_id)
    with conf.using(conf.alias_of_job(job_uuid_)):
        return _resume_now(job_uuid_, missed)


def _resume_now(job_uuid_: uuid.UUID, missed: str | None) -> bool:
    if missed is None:
        return _resume(job_uuid_)
    with transaction.atomic(using=conf.db_alias()):
        row = _lock(job_uuid_)
        if row is None or row.status != Status.PAUSED:
            return False
        _resume(job_uuid_)
        runs: list[Claimed] = []
        if row.fire_at <= row.db_now:
            runs = advance([row], lease=float(conf.get("DISPATCH_LEASE")), catchup=NONE if missed == "skip" else missed)
        _publish_on_commit(runs)
    return True


# -- changing a job in place ------------------------------------------------------------------------


def _lock(job_id: uuid.UUID):
    """The job's row (``lock_job``'s columns), locked until the transaction ends, with ``db_now`` read
    after the lock was granted; None if there is no such job. Call inside ``transaction.atomic(using=conf.db_alias())``."""
    row = db.run("lock_job", {"job_id": job_id}, fetch="one", retries=0)
    if row is None:
        return None
    return row._replace(db_now=db.db_now())


def _resume(job_id: uuid.UUID) -> bool:
    """The ``resume`` statement: True if the job was paused (and is now pending)."""
    return db.run("resume", {"job_id": job_id}, fetch="one", retries=0) is not None


def _publish_on_commit(runs: list[Claimed]) -> None:
    """Send ``runs`` (their attempts logged 'dispatched' in this transaction) once it commits."""
    if not runs:
        return

    def send() -> None:
        from cron_at_scale.broker.publish import publish_batch
        from cron_at_scale.celery_app import get_app

        try:
            publish_batch(get_app(), runs)
        except Exception as e:  # noqa: BLE001  the attempts are in the database: the reaper fires them again
            log.warning("could not publish %d runs (%s); a dispatcher's reaper fires them again after "
                        "DISPATCH_LEASE", len(runs), str(e)[:200])

    transaction.on_commit(send, using=conf.db_alias())


def definition(job: Job) -> dict[str, Any]:
    """The fields that define ``job`` (:data:`DEFINITION_FIELDS`), normalized as stored
    (tuples in the payload as lists, the interval a float)."""
    values = {f: getattr(job, f) for f in DEFINITION_FIELDS}
    values["payload"] = json.loads(json.dumps(values["payload"]))
    values["interval"] = None if values["interval"] is None else float(values["interval"])
    return values


def differing_schedule_fields(job: Job, new: Job) -> list[str]:
    """The :data:`SCHEDULE_FIELDS` in which ``new`` differs from ``job``."""
    have, want = definition(job), definition(new)
    return [f for f in SCHEDULE_FIELDS if have[f] != want[f]]


def apply_change(job: Job, new: Job, *, move: bool = False, first: tuple[datetime, datetime] | None = None,
                 resume: bool = False) -> dict[str, Any]:
    """Make the stored ``job`` look like ``new`` (an unsaved job from ``build_job``, validated); return the
    columns written (empty: nothing differed).

    The caller holds the row lock (``SELECT ... FOR UPDATE``) in its transaction. A
    recurring job whose schedule changed (type, cron expression, zone, interval, jitter),
    or with ``move`` or ``resume``, goes to the new schedule's first occurrence after the
    database's now (``first``: that (occurrence, fire_at) as the caller computed it):
    the occurrences of the old schedule due before now fire first, as a claim would fire
    them (published once the transaction commits); its runs claimed ahead of their time
    and not started end 'skipped' (``supersede_held_runs``); a run already started, and
    an occurrence buffered for it (``overlap="buffer_one"``), go on. A one-off job moves
    to ``new.fire_at`` only with ``move``. Other fields (arguments, queue, options,
    policies) change in place and keep ``fire_at``. ``resume`` (a paused recurring job)
    sets it pending, from the new first occurrence, with no catch-up of the pause.

    Raises ``ValidationError`` (field ``job``) for a job that is not live, a one-off job
    already claimed, or a change between a one-off and a recurring schedule.
    """
    recurring = job.schedule_type != ScheduleType.ONCE
    if job.status not in (Status.PENDING, Status.PAUSED):
        if job.schedule_type == ScheduleType.ONCE and job.status == Status.IN_PROGRESS:
            raise ValidationError("job", f"job {job.id} is in progress (claimed, running or waiting for a retry "
                                         "decision): a one-off job can be changed only while it is pending")
        raise ValidationError("job", f"job {job.id} is {job.status}: only a live job can be changed")
    if recurring != (new.schedule_type != ScheduleType.ONCE):
        field = "at" if recurring else ("cron" if new.schedule_type == ScheduleType.CRON else "every")
        raise ValidationError(field, f"job {job.id} is {'a recurring' if recurring else 'a one-off'} job and cannot "
                                     f"become {'a one-off' if recurring else 'a recurring'} one: cancel it and "
                                     "schedule a new job")
    have, want = definition(job), definition(new)
    changes: dict[str, Any] = {f: want[f] for f in DEFINITION_FIELDS if want[f] != have[f]}
    if not recurring:
        if move and new.fire_at != job.fire_at:
            changes["fire_at"] = new.fire_at
    elif move or resume or any(f in changes for f in ("schedule_type", "cron_expr", "interval", "jitter")) or (
            "timezone" in changes and new.schedule_type == ScheduleType.CRON):
        row = _lock(job.id)
        now = row.db_now
        missed = 0
        if row.status == Status.PENDING and row.fire_at <= now:
            # due before the change: fired as the claim would have, under the old schedule
            _publish_on_commit(advance([row], lease=float(conf.get("DISPATCH_LEASE"))))
        elif row.status == Status.PAUSED and (row.occurrence_at or row.fire_at) <= now:
            old = Recurrence(str(job.id), row.schedule_type, row.cron_expr, row.timezone, row.interval, row.jitter,
                             NONE, row.catchup_window, row.overlap)
            missed = plan(old, row.occurrence_at or row.fire_at, now, running=True).missed
        if first is None:
            rec = Recurrence(str(job.id), new.schedule_type, new.cron_expr, new.timezone, new.interval, new.jitter)
            start = new.occurrence_at if new.schedule_type == ScheduleType.INTERVAL and move else None  # at=
            try:
                first = rec.first(now, start=start)
            except OverflowError:
                raise ValidationError("cron" if new.schedule_type == ScheduleType.CRON else "every",
                                      "the next occurrence is beyond the year 9999") from None
        changes["occurrence_at"], changes["fire_at"] = first
        if missed:
            changes["missed_occurrences"] = F("missed_occurrences") + missed
        held = db.run("supersede_held_runs", {"job_id": job.id, "now": now}, retries=0)
        if held:
            log.info("job %s rescheduled: %d runs claimed ahead of their time will not run (attempts %s)",
                     job.id, len(held), ", ".join(str(r.attempt) for r in held))
    if resume and job.status == Status.PAUSED:
        changes.update(status=Status.PENDING, pause_note="", buffered_at=None)
    if changes:
        Job.objects.filter(pk=job.pk).update(**changes, updated_at=Now())
    return changes
