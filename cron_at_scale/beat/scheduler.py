"""Drop-in for ``celery beat``: ``celery -A proj beat -S cron_at_scale.beat:Scheduler``.

With this scheduler, ``celery beat`` stops being a clock: at start it copies
``app.conf.beat_schedule`` into recurring jobs (:func:`sync_beat_schedule`),
then every ``tick()`` is one dispatcher step (claim due jobs from PostgreSQL,
publish them; reap expired leases every ``REAPER_INTERVAL``). Any number of
beats may run at once, like dispatchers. Beat's own schedule file is never
opened: the jobs table is the state.

Mapping of a ``beat_schedule`` entry to a job keyed ``beat:<entry name>``:

* ``crontab`` -> ``cron=`` (5 fields, rendered from the crontab's expanded
  value sets; a full set is ``*``, an arithmetic one from the field's minimum
  is ``*/S`` in day and month fields, and in minute/hour fields written with a
  leading ``*``) in the crontab's time zone (the app's ``timezone`` setting, UTC
  by default; it must be an IANA zone).
* Days: Celery requires day-of-month **and** day-of-week to match; crontab(5)
  (and cron_at_scale) *ORs* them unless one field's text begins with ``*``.
  So an entry maps when at most one of the two is restricted, or when a
  restricted one is a ``*/S`` step (then cron ANDs, as Celery does); otherwise
  (e.g. ``day_of_month='1-7', day_of_week='mon'``, "first Monday") it is
  reported as not mappable rather than changing its meaning.
* ``timedelta``, a number of seconds, or ``celery.schedules.schedule`` ->
  ``every=`` seconds (first run one interval after the sync, as beat does;
  ``relative=True`` is ignored).
* ``solar`` and any other schedule class (a custom ``schedule`` subclass):
  not supported; listed in the sync's summary, by ``manage.py check``
  (``cron_at_scale.W006``) and by ``cron_status``, nothing written.
* ``args``, ``kwargs`` (JSON), ``options["queue"]``, ``options["priority"]``
  and ``expires`` (in ``options`` or on the entry; seconds: a run not started
  that long after its occurrence is skipped and counted, see
  :mod:`cron_at_scale.policy.expiry`) carry over; other options (``exchange``,
  ``routing_key``, ``headers``...) are ignored with a warning. The task name
  must be registered.
* A crontab whose fire times differ from Celery beat's across a DST
  transition within two years (:mod:`cron_at_scale.beat.dst`) is reported once,
  when its job is created or its expression or zone changes (``SyncReport.dst``).
* Jobs get ``overlap="allow"`` (beat publishes whether or not the previous run
  finished) and the default catch-up (one run for the latest missed occurrence
  within five minutes, which is what a restarted beat does).

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
import signal
import threading
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC
from typing import TYPE_CHECKING, Any

from celery import beat as celery_beat
from celery import schedules
from django.db import IntegrityError, InterfaceError, OperationalError, transaction

from cron_at_scale.api.control import DEFINITION_FIELDS, apply_change, cancel
from cron_at_scale.api.schedule import build_job, db_now, pause
from cron_at_scale.beat import dst
from cron_at_scale.exceptions import ValidationError
from cron_at_scale.models import LIVE_STATUSES, Job, ScheduleType, Status

if TYPE_CHECKING:
    from cron_at_scale.dispatcher.loop import Dispatcher

log = logging.getLogger(__name__)

KEY_PREFIX = "beat:"
REMOVED_NOTE = "removed from beat_schedule"
# Publish options a job can carry; anything else in an entry's options is ignored (with a warning).
CARRIED_OPTIONS = ("queue", "priority", "expires")
# What makes two jobs "the same" (compared on every sync): cron_at_scale.api.control.DEFINITION_FIELDS.
COMPARED_FIELDS = DEFINITION_FIELDS


class Unmappable(ValueError):
    """A schedule (or entry) that cron_at_scale cannot run with the same meaning; ``str()`` says why."""


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


# -- schedules ------------------------------------------------------------------------------


def zone_name(tz: Any) -> str:
    """IANA name of a tzinfo (``None`` and UTC -> ``"UTC"``); raises :class:`Unmappable` if it has none."""
    if tz is None or tz is UTC:
        return "UTC"
    name = getattr(tz, "key", None) or getattr(tz, "zone", None)  # zoneinfo, pytz
    if not name and isinstance(tz, str):
        name = tz
    if not name:
        raise Unmappable(f"time zone {tz!r} has no IANA name (set the Celery timezone setting to one)")
    return str(name)


def _field(values: set[int], lo: int, hi: int, steps: bool = True) -> str:
    """One cron field for a Celery value set over ``lo..hi``: ``*``, ``*/S`` (if ``steps``), or a list of ranges."""
    values = set(values)
    if values == set(range(lo, hi + 1)):
        return "*"
    for step in range(2, hi - lo + 1) if steps else ():
        if values == set(range(lo, hi + 1, step)):
            return f"*/{step}"
    items, ordered = [], sorted(values)
    start = prev = ordered[0]
    for v in [*ordered[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        items.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(items)


def crontab_to_cron(ct: schedules.crontab) -> tuple[str, str]:
    """``(expr, tz)``: a Celery ``crontab`` as a 5-field cron expression with the same fire times.

    Raises :class:`Unmappable` when Celery's day-of-month AND day-of-week rule
    cannot be written in cron syntax (both restricted, neither a ``*/S`` step),
    or when the crontab's time zone has no IANA name.
    """
    from cron_at_scale import cron as cronlib

    # Minute and hour are written as */S only if written so (a field beginning with * makes a wildcard
    # job under the DST policy, see cron_at_scale.cron); day fields whenever they are steps (the AND rule).
    # The fields as written, through the pickle protocol (crontab.__reduce__): minute, hour,
    # day_of_week, day_of_month, month_of_year.
    orig_minute, orig_hour, orig_dow, orig_dom = ct.__reduce__()[1][:4]  # a subclass may add more (its tz)
    minute = _field(ct.minute, 0, 59, steps=str(orig_minute).startswith("*"))
    hour = _field(ct.hour, 0, 23, steps=str(orig_hour).startswith("*"))
    dom, dow = _field(ct.day_of_month, 1, 31), _field(ct.day_of_week, 0, 6)
    expr = " ".join((minute, hour, dom, _field(ct.month_of_year, 1, 12), dow))
    if dom != "*" and dow != "*" and not (dom.startswith("*") or dow.startswith("*")):
        raise Unmappable(
            f"Celery runs a crontab only on days matching both day_of_month ({orig_dom}) and "
            f"day_of_week ({orig_dow}); cron ORs these fields, and {expr!r} would fire on more days. "
            "Split it, or run the task daily and check the date in the task")
    parsed = cronlib.parse(expr)  # self-check: the same value sets as Celery's
    if (parsed.minutes, parsed.hours, parsed.days, parsed.months, parsed.weekdays) != tuple(
            frozenset(s) for s in (ct.minute, ct.hour, ct.day_of_month, ct.month_of_year, ct.day_of_week)):
        raise Unmappable(f"internal error: {expr!r} does not match the crontab {ct!r}")
    return expr, zone_name(ct.tz)


def schedule_spec(sched: Any, app=None) -> dict[str, Any]:
    """``schedule()`` arguments for a beat schedule: ``{"cron", "tz"}`` or ``{"every"}``.

    ``sched``: a ``crontab``, ``celery.schedules.schedule``, ``timedelta`` or
    seconds. Raises :class:`Unmappable` for ``solar``, other schedule classes
    and crontabs whose day rule cannot be kept.
    """
    sched = schedules.maybe_schedule(sched, app=app)
    if isinstance(sched, schedules.solar):
        raise Unmappable("solar schedules are not supported")
    if isinstance(sched, schedules.crontab):
        expr, tz = crontab_to_cron(sched)
        return {"cron": expr, "tz": tz}
    if type(sched) is schedules.schedule:
        return {"every": sched.run_every.total_seconds()}
    raise Unmappable(f"schedule class {type(sched).__module__}.{type(sched).__qualname__} is not supported: "
                     "express it as a crontab, a timedelta or seconds (or schedule(cron=...) / every=), "
                     "see docs/from-celery-beat.md")


def entry_spec(entry: Mapping[str, Any], app=None) -> tuple[dict[str, Any], list[str]]:
    """``(schedule() arguments, warnings)`` for one ``beat_schedule`` entry dict.

    Raises :class:`Unmappable` (no task, bad schedule or options).
    """
    if not isinstance(entry, Mapping) or not entry.get("task"):
        raise Unmappable("an entry must be a dict with 'task' and 'schedule'")
    spec = schedule_spec(entry.get("schedule"), app) if entry.get("schedule") is not None else None
    if spec is None:
        raise Unmappable("the entry has no 'schedule'")
    options = dict(entry.get("options") or {})
    if entry.get("expires") is not None and options.get("expires") is None:
        options["expires"] = entry["expires"]  # on the entry itself, as some projects write it
    ignored = sorted(set(options) - set(CARRIED_OPTIONS))
    warnings = [f"ignored options: {', '.join(ignored)}"] if ignored else []
    if entry.get("relative"):
        warnings.append("ignored relative=True (intervals count from the previous occurrence)")
    spec.update(task=entry["task"], args=entry.get("args") or (), kwargs=entry.get("kwargs") or {},
                overlap="allow")
    if options.get("queue") is not None:
        if not isinstance(options["queue"], str):
            raise Unmappable(f"options['queue'] must be a queue name, got {type(options['queue']).__name__}")
        spec["queue"] = options["queue"]
    if options.get("priority") is not None:
        spec["priority"] = options["priority"]
    if options.get("expires") is not None:
        spec["expires"] = options["expires"]  # validated by build_job (seconds; a datetime is refused)
    return spec, warnings


def unmapped(beat_schedule: Mapping[str, Any] | None, app=None) -> list[tuple[str, str]]:
    """``(name, reason)`` of the ``beat_schedule`` entries :func:`entry_spec` cannot map (a custom
    schedule class, solar, the day rule): they would not run under the drop-in. No database access;
    task names and argument values are checked by the sync itself."""
    out = []
    for name, entry in (beat_schedule or {}).items():
        try:
            entry_spec(entry, app)
        except (Unmappable, ValueError, TypeError) as e:
            out.append((str(name), str(e)))
    return out


# -- writing jobs ---------------------------------------------------------------------------


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
    for _ in range(3):
        with transaction.atomic():
            job = Job.objects.select_for_update().filter(key=new.key, status__in=LIVE_STATUSES).first()
            if job is None:
                if not revive_finished:
                    done = Job.objects.filter(key=new.key).order_by("-created_at").first()
                    if done is not None:
                        return "unchanged", done
                try:
                    with transaction.atomic():
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
            before = Job.objects.filter(key=key, status__in=LIVE_STATUSES).values_list("cron_expr", "timezone").first()
            if before != (new.cron_expr, new.timezone):
                now = now or db_now()
                note = dst.summary(new.cron_expr, new.timezone, now)
                if note:
                    report.dst.append((name, note))
                    log.warning("beat_schedule entry %r: %s", name, note)
        action, _job = upsert(new, resume_note=REMOVED_NOTE)
        getattr(report, action).append(name)
        kept.add(key)
    gone = Job.objects.filter(key__startswith=KEY_PREFIX, status=Status.PENDING).exclude(key__in=kept)
    for job_id, key in gone.exclude(schedule_type=ScheduleType.ONCE).values_list("id", "key"):
        if pause(job_id, note=REMOVED_NOTE):
            report.disabled.append(key[len(KEY_PREFIX):])
    return report


# -- the beat scheduler ---------------------------------------------------------------------


@contextmanager
def _signals_held():
    """Hold SIGTERM/SIGINT for one dispatcher step, so a claimed batch is always published first.

    (Beat's handler raises ``SystemExit``; it runs as soon as the step ends.)
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Scheduler(celery_beat.Scheduler):
    """A ``celery beat`` scheduler that is a cron_at_scale dispatcher (``-S cron_at_scale.beat:Scheduler``).

    ``setup_schedule()`` syncs ``beat_schedule`` (plus beat's default
    ``celery.backend_cleanup`` entry when the result backend needs it) into
    jobs; ``tick()`` runs one dispatcher step and returns the seconds to
    sleep: 0 after a full batch, else ``POLL_INTERVAL`` (after a database
    error, a backoff up to 5 s). ``sync()`` is a no-op (the state is in
    PostgreSQL); ``close()`` (idempotent) stops the dispatcher and closes its
    broker and database connections.
    """

    def __init__(self, app, *args, **kwargs):
        self.dispatcher: Dispatcher | None = None  # made by setup_schedule()
        self.report: SyncReport | None = None
        self._backoff = 0.0
        super().__init__(app, *args, **kwargs)  # calls setup_schedule() unless lazy

    def _default_entries(self) -> dict[str, Any]:
        """Beat's own default entry (see ``celery.beat.Scheduler.install_default_entries``)."""
        if self.app.conf.result_expires and not self.app.backend.supports_autoexpire:
            return {"celery.backend_cleanup": {"task": "celery.backend_cleanup", "schedule": schedules.crontab("0", "4", "*")}}
        return {}

    def setup_schedule(self) -> None:
        from cron_at_scale.dispatcher.loop import Dispatcher

        entries = {**self._default_entries(), **(self.app.conf.beat_schedule or {})}
        self.report = sync_beat_schedule(entries, app=self.app)
        # entries not mapped do not run: said at ERROR, where operators look
        log.log(logging.ERROR if self.report.unsupported else logging.INFO, "beat_schedule synced to jobs: %s",
                self.report.summary())
        self.dispatcher = Dispatcher(app=self.app)

    def tick(self, *args, **kwargs) -> float:
        from cron_at_scale import sql as db

        d = self.dispatcher
        if d is None:
            raise RuntimeError("tick() before setup_schedule(), or after close()")
        try:
            with _signals_held():
                claimed = d.step()
        except (OperationalError, InterfaceError) as e:
            self._backoff = min(5.0, (self._backoff or 0.1) * 2)
            log.warning("database unavailable (%s); retrying in %.1fs", str(e).strip()[:200], self._backoff)
            db.reset_connection()
            return self._backoff
        self._backoff = 0.0
        return 0.0 if claimed >= d.batch_size else d.next_wait()

    def sync(self) -> None:
        """Nothing to save: every job and its next fire time is in PostgreSQL."""

    def close(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.stop()
            self.dispatcher.close()  # held runs published at their time, shards released, broker connection closed
            log.info("dispatcher %s stopped: %d claimed, %d published", self.dispatcher.name,
                     self.dispatcher.claimed_total, self.dispatcher.published_total)
            self.dispatcher = None
            from django.db import connection

            connection.close()
        super().close()

    @property
    def info(self) -> str:
        return "    . scheduler -> cron_at_scale dispatcher (jobs in PostgreSQL)"


__all__ = ["Scheduler", "SyncReport", "Unmappable", "crontab_to_cron", "schedule_spec", "sync_beat_schedule",
           "unmapped", "upsert"]
