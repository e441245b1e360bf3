"""Mapping of a ``beat_schedule`` entry to a job keyed ``beat:<entry name>``:

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
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC
from typing import Any

from celery import schedules

# Publish options a job can carry; anything else in an entry's options is ignored (with a warning).
CARRIED_OPTIONS = ("queue", "priority", "expires")


class Unmappable(ValueError):
    """A schedule (or entry) that cron_at_scale cannot run with the same meaning; ``str()`` says why."""


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


__all__ = ["CARRIED_OPTIONS", "Unmappable", "crontab_to_cron", "entry_spec", "schedule_spec", "unmapped", "zone_name"]
