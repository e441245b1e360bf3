"""Copying ``beat_schedule`` into keyed recurring jobs (``beat:<entry name>``) at every beat start.

A changed entry updates its job in place, through the same path as
``cron_at_scale.reschedule`` (same row; a changed schedule restarts from now:
no run of the old schedule after the sync, none lost or doubled). A job whose entry is gone, or no longer mappable, is
paused with the note ``"removed from beat_schedule"``; re-adding the entry
resumes and updates that same row (from now, with no catch-up). A job the
operator paused by hand (any other note) stays paused. A ``beat:`` job that
was cancelled is created again: ``beat_schedule`` is the source of truth.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction

from cron_at_scale import conf
from cron_at_scale.api.control import DEFINITION_FIELDS, apply_change, cancel
from cron_at_scale.api.schedule import build_job, db_now, pause
from cron_at_scale.beat import dst
from cron_at_scale.beat.mapping import Unmappable, entry_spec
from cron_at_scale.exceptions import ValidationError
from cron_at_scale.models import LIVE_STATUSES, Job, ScheduleType, Status

log = logging.getLogger(__name__)

KEY_PREFIX = "beat:"
REMOVED_NOTE = "removed from beat_schedule"
# What makes two jobs "the same" (compared on every sync): cron_at_scale.api.control.DEFINITION_FIELDS.
COMPARED_FIELDS = DEFINITION_FIELDS


@dataclass
class SyncReport:
    """What a sync (or an import) did, by entry name.

    ``disabled``: jobs paused because their entry is gone (for
    ``cron_import_beat``: source rows set ``enabled=False``).
    ``unsupported``: ``(name, reason)`` of entries not mapped (nothing written
    for them). ``warnings``: ``(name, text)`` of entries mapped with
    something ignored. ``dst``: ``(name, text)`` of crontab entries whose
    fire times differ from Celery beat's across DST, reported by the sync that
    created the job or changed its expression or zone (not again).
    """

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    unsupported: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    dst: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        """One line: the counts, then the names of entries not mapped (they do not run) and of
        entries whose DST meaning differs from Celery beat's."""
        text = (f"{len(self.created)} created, {len(self.updated)} updated, {len(self.unchanged)} unchanged, "
                f"{len(self.disabled)} disabled, {len(self.unsupported)} not mapped")
        if self.unsupported:
            text += " (NOT RUNNING: " + "; ".join(f"{name}: {why}" for name, why in self.unsupported) + ")"
        if self.dst:
            text += f"; DST differs from Celery beat for {len(self.dst)}: " + ", ".join(n for n, _ in self.dst)
        return text


def upsert(new: Job, *, resume_note: str | None = None, revive_finished: bool = True,
           compare_fire_at: bool = False) -> tuple[str, Job]:
    """Make the live job keyed ``new.key`` look like ``new`` (an unsaved, validated job; see ``build_job``).

    Returns ``("created" | "updated" | "unchanged", job)``. The live job is
    locked (``SELECT ... FOR UPDATE``) while compared and changed, so
    concurrent callers serialize; two inserting at once meet on the live-key
    unique index and the loser updates the winner's row. The change is
    ``reschedule``'s (:func:`cron_at_scale.api.control.apply_change`): a changed
    schedule (or ``fire_at`` with ``compare_fire_at``) takes ``new``'s next fire
    time, with no run lost or doubled by the change. A job paused with note
    ``resume_note`` is resumed from ``new``'s next fire time. With
    ``revive_finished=False`` a finished job with the key (completed, failed,
    cancelled) counts as unchanged and nothing is inserted.
    """
    with conf.using(conf.alias_of_job(new.id)):  # the key's database (SHARD_DATABASES)
        return _upsert(new, resume_note, revive_finished, compare_fire_at)


def _upsert(new: Job, resume_note: str | None, revive_finished: bool, compare_fire_at: bool) -> tuple[str, Job]:
    for _ in range(3):
        with transaction.atomic(using=conf.db_alias()):
            job = Job.objects.select_for_update().filter(key=new.key, status__in=LIVE_STATUSES).first()
            if job is None:
                if not revive_finished:
                    done = Job.objects.filter(key=new.key).order_by("-created_at").first()
                    if done is not None:
                        return "unchanged", done
                try:
                    with transaction.atomic(using=conf.db_alias()):
                        new.save(force_insert=True)
                    return "created", new
                except IntegrityError:
                    continue  # another process inserted it first: lock and compare its row
            if job.schedule_type == ScheduleType.ONCE and job.status != Status.PENDING:
                return "unchanged", job  # already claimed or running: leave it alone
            if (job.schedule_type == ScheduleType.ONCE) != (new.schedule_type == ScheduleType.ONCE):
                cancel(job.id)  # one-off <-> recurring is not a change in place: the entry's new job replaces it
                new.save(force_insert=True)
                return "updated", new
            resume = resume_note is not None and job.status == Status.PAUSED and job.pause_note == resume_note
            changes = apply_change(job, new, move=compare_fire_at, first=(new.occurrence_at, new.fire_at),
                                   resume=resume)
            if not changes:
                return "unchanged", job
            job.refresh_from_db()
            return "updated", job
    raise IntegrityError(f"could not insert or lock the live job keyed {new.key!r}")


def sync_beat_schedule(beat_schedule: Mapping[str, Any], *, app=None) -> SyncReport:
    """Make the ``beat:<name>`` jobs match ``beat_schedule`` (Celery's ``app.conf.beat_schedule``).

    Creates missing jobs, updates changed ones in place, pauses (note
    ``"removed from beat_schedule"``) live ``beat:`` jobs whose entry is gone
    or not mappable, and resumes ones whose entry came back. Safe to run from
    several processes at once: one job per entry. Entries that cannot be
    mapped (see the module docstring) or are invalid (unregistered task,
    non-JSON args) are listed in ``unsupported`` with the reason and logged;
    nothing is written for them. Database errors propagate.
    """
    report = SyncReport()
    kept: set[str] = set()
    now = None
    for name, entry in beat_schedule.items():
        key = f"{KEY_PREFIX}{name}"
        try:
            spec, warnings = entry_spec(entry, app)
            new = build_job(spec.pop("task"), key=key, **spec)
        except (Unmappable, ValidationError, ValueError, TypeError) as e:
            report.unsupported.append((name, str(e)))
            log.error("beat_schedule entry %r not synced, it will NOT run: %s", name, e)
            continue
        report.warnings += [(name, w) for w in warnings]
        for w in warnings:
            log.warning("beat_schedule entry %r: %s", name, w)
        if new.cron_expr:  # DST: reported once, by the sync that creates the job or changes its expression/zone
            before = Job.objects.using(conf.alias_of_job(new.id)).filter(key=key, status__in=LIVE_STATUSES) \
                .values_list("cron_expr", "timezone").first()
            if before != (new.cron_expr, new.timezone):
                now = now or db_now()
                note = dst.summary(new.cron_expr, new.timezone, now)
                if note:
                    report.dst.append((name, note))
                    log.warning("beat_schedule entry %r: %s", name, note)
        action, _job = upsert(new, resume_note=REMOVED_NOTE)
        getattr(report, action).append(name)
        kept.add(key)
    for alias in conf.shard_aliases():  # every database of SHARD_DATABASES
        gone = Job.objects.using(alias).filter(key__startswith=KEY_PREFIX, status=Status.PENDING).exclude(key__in=kept)
        for job_id, key in gone.exclude(schedule_type=ScheduleType.ONCE).values_list("id", "key"):
            if pause(job_id, note=REMOVED_NOTE):
                report.disabled.append(key[len(KEY_PREFIX):])
    return report


__all__ = ["COMPARED_FIELDS", "KEY_PREFIX", "REMOVED_NOTE", "SyncReport", "sync_beat_schedule", "upsert"]
