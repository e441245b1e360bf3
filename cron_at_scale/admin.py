"""The Django admin for jobs, built for a table of ten million rows.

Each row says what the job is (its key, or ``beat:<entry>`` marked as the beat schedule's; its
task and queue; its id by the random tail a UUIDv7 ends with: the leading characters are the
time and the same for a minute's jobs), its status in colour, when it fires next and, when due
and not yet claimed, how late it is and why (its queue held, no dispatcher alive, a backlog).

What keeps every page under a second at that size:

* no exact ``COUNT(*)``: :class:`EstimatedCountPaginator` counts at most
  ``EXACT_COUNT_LIMIT + 1`` rows and, beyond, takes the planner's estimate
  (``pg_class.reltuples`` when unfiltered); ``show_full_result_count = False``;
  facets off; at most ``MAX_PAGES`` pages (deep ``OFFSET`` is a table scan:
  narrow with a filter or a search instead);
* the default order puts what needs attention first (:data:`ATTENTION`: late, failed, running,
  next due, paused, finished); :class:`AttentionPaginator` reads a page as a run of segments,
  each a range of the (status, fire_at, id) index, instead of sorting the table; a click on
  "next fire" orders by ``fire_at`` alone (:class:`FireOrderPaginator`: a merge of those ranges,
  one per status; the job table has no ``(fire_at, id)`` index since migration 0018); each filter
  (status, due, schedule type, task, queue) walks an index (migration 0003); the task and queue filters
  list their values with a skip scan of that index, not ``SELECT DISTINCT`` over the table;
* search is an index lookup: an exact job id (or a Celery task id ``<job id>:<attempt>``), the
  start of an id (a primary-key range), else a key prefix; any other part of an id (the tail the
  list shows) is looked for among the latest ``PARTIAL_ID_SCAN`` jobs only, and the page says so;
  never ``LIKE '%…%'`` over the table;
* the change page shows the latest ``ATTEMPTS_SHOWN`` attempts (an index
  range) and their django-celery-results ``TaskResult`` in one query. A cron
  job's page also previews its next ``NEXT_FIRES_SHOWN`` fires (no query).

Actions (cancel, run now, requeue, pause, resume) call the public API and
need custom permissions (``cancel_job``, ``run_job``, ``requeue_job``,
``pause_job``): without them the action is not offered, and a forged POST
naming it is refused by the action form. Resume asks, on an intermediate page,
what to do with the occurrences missed while paused (``resume(missed=...)``).

The job page has the same actions as buttons (:meth:`JobAdmin.job_action_view`: the action
itself, on that one job, with its permission).

The change form edits only a live recurring job's schedule (cron expression and
zone, or interval), with Django's ``change_job`` permission; saving calls
``cron_at_scale.reschedule`` (the one path that changes a job in place), and
its validation errors show on the field. A ``beat:`` job's schedule is the beat schedule's
(``beat_schedule`` in code, copied at every beat start): its page refuses schedule edits and
says where to change it.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from functools import cached_property

from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ORDER_VAR
from django.core.paginator import Paginator
from django.db.models import Case, F, IntegerField, Q, TextField, Value, When
from django.db.models.functions import Cast, Coalesce, Extract, Now, Replace
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

import cron_at_scale
from cron_at_scale import conf
from cron_at_scale import cron as cronlib
from cron_at_scale import sql as db
from cron_at_scale.exceptions import ValidationError
from cron_at_scale.models import LIVE_STATUSES, AttemptHistory, Job, JobAttempt, JobHistory, ScheduleType, Status
from cron_at_scale.ops import status as opstatus
from cron_at_scale.ops.fire_order import PENDING, in_fire_order, pending_in_fire_order
from cron_at_scale.ops.status import duration_text, planner_estimate, table_estimate

EXACT_COUNT_LIMIT = 10_000  # results counted exactly up to here (bounded: LIMIT); beyond, the planner's estimate
MAX_PAGES = 200  # deepest page offered: OFFSET 20,000 rows at 100 per page stays fast
ATTEMPTS_SHOWN = 50  # latest attempts on a job's page
NEXT_FIRES_SHOWN = 5  # a cron job's pending occurrence and the ones after it, on its page
MAX_ACTION_JOBS = 10_000  # an action over more rows is refused (use the commands, which batch)
PARTIAL_ID_SCAN = 100_000  # latest jobs (by id) a search for a part of an id looks through
SEARCH_IDS = 1_000  # ids a search by a part of an id lists at most
ID_TAIL = 12  # hex characters of an id the list shows: its last group, random (a UUIDv7's start is its time)
BEAT_PREFIX = "beat:"  # cron_at_scale.beat.sync.KEY_PREFIX: jobs the beat schedule owns

# The default order, what needs attention first: (segment, filter, order within it). Each segment is
# a range of the (status, fire_at, id) index read in order, or for pending jobs (late, next) each
# shard's range of the claim's index, merged (PENDING_SEGMENTS), so a page never sorts the table.
ATTENTION = (
    ("late", lambda now: PENDING & Q(fire_at__lte=now), ("fire_at", "id")),
    ("failed", lambda now: Q(status=Status.FAILED), ("-fire_at", "-id")),
    ("running", lambda now: Q(status=Status.IN_PROGRESS), ("fire_at", "id")),
    ("next", lambda now: PENDING & Q(fire_at__gt=now), ("fire_at", "id")),
    ("paused", lambda now: Q(status=Status.PAUSED), ("fire_at", "id")),
    ("completed", lambda now: Q(status=Status.COMPLETED), ("-fire_at", "-id")),
    ("cancelled", lambda now: Q(status=Status.CANCELLED), ("-fire_at", "-id")),
)
PENDING_SEGMENTS = frozenset({"late", "next"})
STATUS_COLOURS = {  # background, text: readable in the admin's light and dark themes
    Status.PENDING: ("#dde9f5", "#1f4e79"), Status.IN_PROGRESS: ("#fff1c2", "#6b4e00"),
    Status.COMPLETED: ("#dcefdc", "#245c24"), Status.FAILED: ("#f8d7d7", "#8a1c1c"),
    Status.CANCELLED: ("#e6e6e6", "#444444"), Status.PAUSED: ("#ece0f5", "#4f2a6b"),
}
LATE_COLOUR = ("#ba2121", "#ffffff")


class EstimatedCountPaginator(Paginator):
    """A paginator that never counts more than ``EXACT_COUNT_LIMIT + 1`` rows."""

    def counted(self):
        """The queryset whose rows are counted."""
        return self.object_list

    @cached_property
    def count(self) -> int:
        qs = self.counted()
        exact = qs[: EXACT_COUNT_LIMIT + 1].count()
        if exact <= EXACT_COUNT_LIMIT:
            return exact
        with db.get_connection().cursor() as cur:
            if not qs.query.where:
                estimate = table_estimate(cur, qs.model._meta.db_table)
            else:
                sql, params = qs.query.sql_with_params()
                estimate = planner_estimate(cur, sql, params)
        return max(exact, estimate)

    @cached_property
    def num_pages(self) -> int:
        return min(super().num_pages, MAX_PAGES)


class AttentionPaginator(EstimatedCountPaginator):
    """The default order (:data:`ATTENTION`) without sorting the table: a page is read segment by
    segment (late, failed, running, next due, paused, completed, cancelled), each an index range
    read in its own order, with a bounded count of the segments before it (at most
    ``MAX_PAGES`` pages deep). ``object_list`` is the filtered queryset; its own ordering (the
    same order as a ``CASE``, for a list small enough to fit on one page) is ignored here."""

    def __init__(self, object_list, per_page, *args, segments: bool = True, merged: bool = False, **kwargs):
        super().__init__(object_list, per_page, *args, **kwargs)
        self.now = db.db_now()
        self.segments = segments
        self.merged = merged

    def counted(self):  # unordered: the CASE of the small-list ordering is no index
        return self.object_list.order_by()

    def page(self, number):
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if self.count <= EXACT_COUNT_LIMIT:  # few rows: the database sorts them (the CASE), in memory
            # The rows' ids first, in (status, fire_at) order: that order makes the planner read the
            # filter through an index (for due=late it would otherwise expect a million pending rows
            # past due, not a thousand, and scan the table), then sort at most EXACT_COUNT_LIMIT rows.
            few = self.object_list.order_by("status", "fire_at").values("id")[: EXACT_COUNT_LIMIT + 1]
            return self._get_page(list(self.object_list.filter(id__in=few)[bottom:top]), number, self)
        if not self.segments:  # many rows of another filter: by fire time (see JobAdmin.get_paginator)
            if self.merged:  # no index of the filter's own in fire time order: a merge of the status ranges
                return self._get_page(in_fire_order(self.object_list, start=bottom, stop=top, descending=True),
                                      number, self)
            return self._get_page(list(self.object_list.order_by("-fire_at", "-id")[bottom:top]), number, self)
        rows: list = []
        before = 0  # rows of the segments before this one (counted up to top)
        base = self.object_list.order_by()
        for name, where, order in ATTENTION:
            if len(rows) >= self.per_page or before >= top:
                break
            segment = base.filter(where(self.now))
            n = segment[: top - before].count()
            start = max(0, bottom - before)
            if n > start and name in PENDING_SEGMENTS:
                rows += pending_in_fire_order(segment, start=start, stop=start + self.per_page - len(rows))
            elif n > start:
                rows += list(segment.order_by(*order)[start: start + self.per_page - len(rows)])
            before += n
        return self._get_page(rows, number, self)


class FireOrderPaginator(EstimatedCountPaginator):
    """A list ordered by the "next fire" column. With ``merged`` (no filter with an index of its own
    in fire time order) a page is a merge of each status's range of the (status, fire_at, id) index
    (:func:`cron_at_scale.ops.fire_order.in_fire_order`): the job table has no (fire_at, id) index.
    With ``pending`` (pending jobs only, under no filter with an index of its own) a page is a merge
    of the shards' ranges of the claim's index (:func:`~cron_at_scale.ops.fire_order.pending_in_fire_order`)."""

    def __init__(self, object_list, per_page, *args, merged: bool = True, pending: bool = False, **kwargs):
        super().__init__(object_list, per_page, *args, **kwargs)
        self.merged = merged
        self.pending = pending

    def counted(self):  # unordered: without a (fire_at, id) index the ordered count would sort the table
        return self.object_list.order_by() if self.merged or self.pending else self.object_list

    def page(self, number):
        if not self.merged and not self.pending:
            return super().page(number)
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        first = self.object_list.query.order_by[0] if self.object_list.query.order_by else "fire_at"
        descending = first.startswith("-") if isinstance(first, str) else bool(getattr(first, "descending", False))
        read = pending_in_fire_order if self.pending else in_fire_order
        rows = read(self.object_list, start=bottom, stop=bottom + self.per_page, descending=descending)
        return self._get_page(rows, number, self)


def merged_in_fire_order(params) -> bool:
    """Whether a job list under the filters ``params`` (``request.GET``) must read fire time order as
    a merge of the status ranges: none of its filters has an index of its own in that order (a
    status, due, task, named queue, recurring type; the lease, missed and overdue filters and a
    search name few rows)."""
    if any(params.get(name) for name in ("status__exact", "due", "task", "lease", "missed", "overdue", "q",
                                         "queue")):
        return False
    return params.get("schedule_type__exact") in (None, "", ScheduleType.ONCE)


def pending_in_fire_order_only(params) -> bool:
    """Whether a job list under the filters ``params`` (``request.GET``) holds pending jobs only (the
    pending status or a due bucket) under no filter with an index of its own in fire time order (a
    task, a named queue, a recurring type, a search): its fire time order is then a merge of the
    shards' ranges of the claim's index, which alone holds pending rows in that order."""
    if params.get("status__exact") != Status.PENDING and not params.get("due"):
        return False
    if any(params.get(name) for name in ("task", "lease", "missed", "overdue", "q", "queue")):
        return False
    return params.get("schedule_type__exact") in (None, "", ScheduleType.ONCE)


def attention_rank():
    """The default order as SQL expressions (rank, then a time within the rank): the same order as
    :data:`ATTENTION`, for lists of one page, which the database sorts in memory."""
    rank = Case(*(When(where(Now()), then=Value(i)) for i, (_n, where, _o) in enumerate(ATTENTION)),
                default=Value(len(ATTENTION)), output_field=IntegerField())
    epoch = Extract("fire_at", "epoch")
    newest_first = [Status.FAILED, Status.COMPLETED, Status.CANCELLED]
    return rank, Case(When(status__in=newest_first, then=Value(0) - epoch), default=epoch)


def distinct_values(column: str, limit: int = 200) -> list[str]:
    """Distinct values of a ``cron_at_scale_job`` column with an index leading on it: a skip scan
    (one index probe per value), so the cost grows with the values, not with the rows. The queue
    index holds named queues only: the default queue (``''``) is always listed first."""
    assert column in ("task", "queue")
    if column == "queue":
        from cron_at_scale.dispatcher.backpressure import job_queue_names

        return [""] + job_queue_names(limit)[: limit - 1]
    return [r.value for r in db.run("task_names", {"limit": limit}, retries=0)]


class _IndexedValueFilter(admin.SimpleListFilter):
    column = ""

    def lookups(self, request, model_admin):
        return [(v, v or "(default)") for v in distinct_values(self.column)]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(**{self.column: value})


class TaskFilter(_IndexedValueFilter):
    title = "task"
    parameter_name = "task"
    column = "task"


class QueueFilter(_IndexedValueFilter):
    title = "queue"
    parameter_name = "queue"
    column = "queue"


class DatabaseFilter(admin.SimpleListFilter):
    """With ``SHARD_DATABASES``: which database's jobs the list shows, one at a time (the first
    unless chosen). The list's own queries go there (:meth:`JobAdmin.changelist_view`)."""

    title = "database"
    parameter_name = "database"

    def lookups(self, request, model_admin):
        return [(alias, f"{alias} (shards {conf.shard_ranges(conf.shards_of(alias))})") for alias in conf.shard_aliases()]

    def choices(self, changelist):  # no "All": the list reads one database
        chosen = database_of(changelist.params.get(self.parameter_name) if hasattr(changelist, "params") else None)
        for lookup, title in self.lookup_choices:
            yield {"selected": lookup == chosen, "display": title,
                   "query_string": changelist.get_query_string({self.parameter_name: lookup})}

    def queryset(self, request, queryset):
        return queryset  # routed, not filtered


def database_of(chosen) -> str:
    """The database a list shows: ``chosen`` (a ``?database=`` value) if it holds shards, else the first."""
    homes = conf.shard_aliases()
    if isinstance(chosen, list):
        chosen = chosen[-1] if chosen else None
    return chosen if chosen in homes else homes[0]


class DueFilter(admin.SimpleListFilter):
    """Pending jobs by when they are due, the dashboard's buckets: ``late`` (due, not yet claimed by
    a dispatcher), the next minute, hour, day, later. A range of each shard's part of the claim's
    (shard, fire_at) index, which alone holds pending rows in fire time order."""

    title = "due"
    parameter_name = "due"
    BUCKETS = {"late": (None, timedelta(0)), "minute": (timedelta(0), timedelta(minutes=1)),
               "hour": (timedelta(minutes=1), timedelta(hours=1)), "day": (timedelta(hours=1), timedelta(days=1)),
               "later": (timedelta(days=1), None)}

    def lookups(self, request, model_admin):
        return [("late", "late (due, not yet claimed)"), ("minute", "in the next minute"),
                ("hour", "in the next hour"), ("day", "in the next day"), ("later", "later")]

    def queryset(self, request, queryset):
        if self.value() not in self.BUCKETS:
            return queryset
        lo, hi = self.BUCKETS[self.value()]  # type: ignore[index]
        queryset = queryset.filter(PENDING)
        if lo is not None:
            queryset = queryset.filter(fire_at__gt=Now() + lo)
        if hi is not None:
            queryset = queryset.filter(fire_at__lte=Now() + hi)
        return queryset


class LeaseFilter(admin.SimpleListFilter):
    """Running jobs whose lease has expired (the reaper's next work): in-progress rows only (the
    status index), then their ``locked_until``."""

    title = "lease"
    parameter_name = "lease"

    def lookups(self, request, model_admin):
        return [("expired", "expired (the reaper will re-fire)")]

    def queryset(self, request, queryset):
        if self.value() != "expired":
            return queryset
        return queryset.filter(status=Status.IN_PROGRESS, locked_until__lt=Now())


class MissedFilter(admin.SimpleListFilter):
    """Recurring jobs with missed occurrences (the recurring jobs' partial index, then the counter)."""

    title = "missed occurrences"
    parameter_name = "missed"

    def lookups(self, request, model_admin):
        return [("yes", "some missed")]

    def queryset(self, request, queryset):
        if self.value() != "yes":
            return queryset
        return queryset.exclude(schedule_type=ScheduleType.ONCE).filter(missed_occurrences__gt=0)


class OverdueFilter(admin.SimpleListFilter):
    """Recurring jobs overdue now (:mod:`cron_at_scale.maintenance.overdue`: no success within their
    grace of a due occurrence; not "late", which is a pending job past its fire time): the rule's
    ids (a walk of the recurring jobs' partial index, at most ``MAX_ACTION_JOBS``), then a
    primary-key lookup."""

    title = "overdue (no success within grace)"
    parameter_name = "overdue"

    def lookups(self, request, model_admin):
        return [("yes", "overdue now: no success within grace")]

    def queryset(self, request, queryset):
        if self.value() != "yes":
            return queryset
        from cron_at_scale.maintenance.overdue import overdue_jobs

        jobs, _total = overdue_jobs(limit=MAX_ACTION_JOBS)
        return queryset.filter(id__in=[j.id for j in jobs])


def _rendered(response):
    """``response`` rendered now (a ``TemplateResponse`` renders after the view returns, when its
    queries would no longer run inside the view's ``conf.using``)."""
    if hasattr(response, "render") and not getattr(response, "is_rendered", True):
        response.render()
    return response


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text.split(":", 1)[0])
    except ValueError:
        return None


def id_part(text: str) -> str | None:
    """``text`` as hex digits of a job id (dashes dropped, lower case), or None when it is not one
    (fewer than 4 digits, or anything but hex digits and dashes)."""
    digits = text.replace("-", "").lower()
    if len(digits) < 4 or len(digits) > 32 or any(c not in "0123456789abcdef" for c in digits):
        return None
    return digits


def id_prefix_range(digits: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The ids starting with ``digits``: a primary-key range (inclusive bounds)."""
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def is_beat_job(job: Job) -> bool:
    """Owned by the beat schedule: imported from ``beat_schedule`` (key ``beat:<entry name>``)."""
    return bool(job.key) and job.key.startswith(BEAT_PREFIX)


def status_badge(status: str, late: bool = False) -> str:
    bg, fg = LATE_COLOUR if late else STATUS_COLOURS.get(status, ("#eee", "#333"))  # type: ignore[call-overload]
    label = "late" if late else Status(status).label.lower() if status in Status.values else status
    return format_html('<span class="cas-status cas-status-{}" style="background:{};color:{};padding:1px 7px;'
                       'border-radius:9px;white-space:nowrap;font-weight:600">{}</span>',
                       "late" if late else status, bg, fg, label)


class LateReasons:
    """Why due jobs wait, worked out once per page and only for a page that shows one: the held
    broker queues (``backpressure.survey``) and the dispatchers alive, as ``cron_status`` says them."""

    def __init__(self):
        self._queues: dict[str, tuple[str, bool]] | None = None
        self._alive = 0

    def __call__(self, job: Job) -> str:
        if self._queues is None:
            from cron_at_scale.dispatcher.backpressure import survey

            self._queues = {q.queue: (q.state, q.held) for q in survey()}
            self._alive = opstatus.dispatchers_alive()
        return opstatus.why_late(job.task, job.queue, self._queues, self._alive)


def late_seconds(job: Job) -> float | None:
    """Seconds a pending job is past its fire time (database clock: the ``db_now`` annotation of
    the admin's queryset); None when it is not late."""
    now = getattr(job, "db_now", None)
    if job.status != Status.PENDING or now is None or job.fire_at is None or job.fire_at > now:
        return None
    return (now - job.fire_at).total_seconds()


def schedule_text(job: Job) -> str:
    """``once``, ``cron <expr> (<zone>)`` or ``every <n> s``."""
    if job.schedule_type == ScheduleType.CRON:
        return f"cron {job.cron_expr} ({job.timezone})"
    if job.schedule_type == ScheduleType.INTERVAL:
        return f"every {job.interval:g} s"
    return "once"


def next_fires_text(job: Job, n: int = NEXT_FIRES_SHOWN) -> list[str]:
    """A cron job's pending occurrence and the ``n - 1`` after it, each as ``"<local> (<UTC>)"``
    (``cron.next_fire_times``, as the dispatcher's claim computes them); ``[]`` for other jobs."""
    if job.schedule_type != ScheduleType.CRON or job.occurrence_at is None:
        return []
    zone = cronlib.check_zone(job.timezone)
    fires = cronlib.next_fire_times(job.cron_expr, job.timezone, job.occurrence_at - timedelta(microseconds=1), n)
    return [f"{t.astimezone(zone):%a %Y-%m-%d %H:%M:%S %Z} ({t:%Y-%m-%d %H:%M:%S} UTC)" for t in fires]


def run_now(job_ids) -> int:
    """Make pending jobs due now; returns how many. A one-off fires at once; a recurring job fires
    one extra run now and keeps its schedule (its ``occurrence_at`` stays where it was)."""
    return Job.objects.filter(id__in=list(job_ids), status=Status.PENDING, fire_at__gt=Now()).update(
        occurrence_at=Coalesce(F("occurrence_at"), F("fire_at")), fire_at=Now(), updated_at=Now()
    ) if job_ids else 0


# The change form's fields and the reschedule() arguments they are.
SCHEDULE_FORM_FIELDS = {"cron_expr": "cron", "timezone": "tz", "interval": "every"}
RESUME_CHOICES = (
    ("", "as the job's catch-up policy says (its catchup and catchup_window)"),
    ("skip", "skip them: wait for the next future occurrence"),
    ("latest", "run the latest of them once (within the job's catch-up window)"),
    ("all", "run each of them (within the job's catch-up window)"),
)


def allowed_retries(job: Job) -> str:
    """The retries ``job`` may use after its first attempt, as text, for an error its task
    autoretries: the job's own limit (its ``retry_kwargs["max_retries"]``, else its ``max_retries``),
    else its task's (``"3 (task's)"``; ``"? (task's)"`` when the task is not registered in this
    process); ``"-"`` for a recurring job, whose runs never retry (the next occurrence does)."""
    if job.schedule_type != ScheduleType.ONCE:
        return "-"
    own = (job.options or {}).get("retry_kwargs")
    if isinstance(own, dict) and "max_retries" in own:
        return str(own["max_retries"])
    if job.max_retries is not None:
        return str(job.max_retries)
    from cron_at_scale.celery_app import get_app
    from cron_at_scale.policy import retry

    task = get_app().tasks.get(job.task)
    return f"{'?' if task is None else retry.max_retries_for(task, None, None, job_options=job.options)} (task's)"


def editable_schedule_fields(job: Job | None) -> tuple[str, ...]:
    """The schedule fields the change form edits for ``job``: none unless it is live and recurring,
    and none for a ``beat:`` job (the beat schedule owns it: the next beat start would undo an edit)."""
    if job is None or job.status not in LIVE_STATUSES or is_beat_job(job):
        return ()
    return {ScheduleType.CRON: ("cron_expr", "timezone"), ScheduleType.INTERVAL: ("interval",)}.get(
        job.schedule_type, ())  # type: ignore[call-overload]


class RescheduleForm(forms.ModelForm):
    """A recurring job's schedule, checked as ``reschedule()`` checks it (nothing written here)."""

    class Meta:
        model = Job
        fields: list[str] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in self.fields:
            self.fields[name].required = name != "timezone" or "cron_expr" in self.fields

    def changes(self) -> dict:
        """``reschedule()`` arguments for the fields changed."""
        return {SCHEDULE_FORM_FIELDS[f]: self.cleaned_data[f] for f in self.changed_data if f in SCHEDULE_FORM_FIELDS}

    def clean(self):
        data = super().clean()
        changes = self.changes()
        if changes and not self.errors:
            from cron_at_scale.api.schedule import changed_job

            stored = Job.objects.get(pk=self.instance.pk)
            try:
                changed_job(stored, changes)
            except ValidationError as e:
                field = {v: k for k, v in SCHEDULE_FORM_FIELDS.items()}.get(e.field)
                self.add_error(field if field in self.fields else None, str(e))
        return data


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("short_id", "name", "task", "queue_name", "status_colour", "schedule", "next_fire",
                    "late_by", "retries_used", "attempts", "lease")
    list_display_links = ("short_id", "name")
    list_filter = ("status", DueFilter, "schedule_type", TaskFilter, QueueFilter, OverdueFilter, LeaseFilter,
                   MissedFilter)
    search_fields = ("=id", "key")  # only to show the search box: get_search_results does the lookups
    search_help_text = ("A job id, its start, or the part the list shows (the end); a Celery task id "
                        "<job id>:<attempt>; or a key or the start of one (beat:… for the beat schedule's jobs).")
    ordering = None  # get_ordering: what needs attention first, or the column clicked ("next fire")
    sortable_by = ("next_fire",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100
    actions = ("cancel_jobs", "run_jobs_now", "requeue_jobs", "pause_jobs", "resume_jobs")
    change_list_template = "admin/cron_at_scale/job/change_list.html"
    change_form_template = "admin/cron_at_scale/job/change_form.html"
    form = RescheduleForm
    fieldsets = (
        (None, {"fields": ("summary", "id", "task", "status", "schedule", "fire_at", "key", "queue_name", "payload",
                           "options")}),
        ("Attempts", {"fields": ("attempt_history",)}),
        ("Retries", {"fields": ("retries", "retries_allowed", "attempts", "lost_attempts", "expired_runs")}),
        ("Lease", {"fields": ("locked_by", "locked_until", "cancel_requested")}),
        ("Recurring", {"classes": ("collapse",), "fields": (
            "occurrence_at", "next_fires", "catchup", "catchup_window", "overlap", "jitter", "buffered_at",
            "missed_occurrences", "skipped_occurrences", "pause_note")}),
        ("Has it run? (overdue: no success within grace)", {"classes": ("collapse",), "fields": (
            "grace", "last_success_at", "last_success_occurrence", "due_since", "resumed_at", "overdue_since")}),
        ("Times", {"fields": ("created_at", "updated_at")}),
    )

    # -- the list ---------------------------------------------------------------------------------

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(db_now=Now())

    # -- SHARD_DATABASES: a list reads one database (?database=), a job's pages its own -------------

    def get_list_filter(self, request):
        filters = super().get_list_filter(request)
        return (DatabaseFilter, *filters) if conf.shard_map() is not None else filters

    def changelist_view(self, request, extra_context=None):
        if conf.shard_map() is None:
            return super().changelist_view(request, extra_context)
        with conf.using(database_of(request.GET.get(DatabaseFilter.parameter_name))):
            return _rendered(super().changelist_view(request, extra_context))

    def get_ordering(self, request):
        if ORDER_VAR in request.GET:
            return ()  # the changelist orders by the column clicked
        return attention_rank()  # what needs attention first (AttentionPaginator reads pages of it by index)

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        merged = merged_in_fire_order(request.GET)
        if ORDER_VAR in request.GET:  # the "next fire" column: a filter's index, or the status ranges merged
            return FireOrderPaginator(queryset, per_page, orphans, allow_empty_first_page, merged=merged,
                                      pending=pending_in_fire_order_only(request.GET))
        # Segments are ranges of the (status, fire_at, id) index: right for the whole list and its status
        # or due filters. Under another filter (task, queue, a search) the planner takes that filter's
        # index for a segment and may read every row of it (seconds at 10M rows: it cannot know that few
        # pending jobs are past due): beyond EXACT_COUNT_LIMIT rows such a list is ordered by fire time.
        segments = not set(request.GET) - {"p", "status__exact", "due", "_changelist_filters", "database"}
        return AttentionPaginator(queryset, per_page, orphans, allow_empty_first_page, segments=segments,
                                  merged=merged)

    @admin.display(description="late by")
    def late_by(self, job: Job) -> str:
        """How late a pending job is ("-" if not late); the list's own column, made per request by
        ``get_list_display``, adds why. Defined here too so that Django's admin checks see it."""
        late = late_seconds(job)
        return "-" if late is None else duration_text(late)

    def get_list_display(self, request):
        reasons = LateReasons()  # per request: the broker is asked once, and only for a page with a late job

        @admin.display(description="late by")
        def late_by(job: Job) -> str:
            late = late_seconds(job)
            if late is None:
                return "-"
            return format_html('<strong style="color:#ba2121">{}</strong><br><small>{}</small>',
                               duration_text(late), reasons(job))

        return [late_by if name == "late_by" else name for name in self.list_display]

    @admin.display(description="id")
    def short_id(self, job: Job) -> str:
        text = str(job.id)
        return format_html('<span title="{}" style="font-family:monospace;white-space:nowrap">…{}</span>', text, text[-ID_TAIL:])

    @admin.display(description="key")
    def name(self, job: Job) -> str:
        if not job.key:
            return "-"
        if is_beat_job(job):
            return format_html('<span class="cas-beat" title="owned by the beat schedule (beat_schedule in '
                               'code): edits are refused" style="background:#444;color:#fff;padding:0 5px;'
                               'border-radius:3px;font-size:11px">beat</span> {}', job.key[len(BEAT_PREFIX):])
        return job.key

    @admin.display(description="queue")
    def queue_name(self, job: Job) -> str:
        return job.queue or "(default)"

    @admin.display(description="status")
    def status_colour(self, job: Job) -> str:
        badge = status_badge(job.status)
        return format_html("{} {}", badge, status_badge(job.status, late=True)) if late_seconds(job) is not None \
            else badge

    @admin.display(description="next fire", ordering="fire_at")
    def next_fire(self, job: Job) -> str:
        if job.status not in (Status.PENDING, Status.PAUSED):
            return format_html('<span title="last fire time">({} UTC)</span>', f"{job.fire_at:%Y-%m-%d %H:%M:%S}")
        return f"{job.fire_at:%Y-%m-%d %H:%M:%S} UTC"

    @admin.display(description="schedule")
    def schedule(self, job: Job) -> str:
        return schedule_text(job)

    @admin.display(description="retries")
    def retries_used(self, job: Job) -> str:
        """Retries used / allowed: the job's own limit, else its task's (``retry.max_retries_for``,
        Celery's meaning; ``?`` for a task this process does not know)."""
        allowed = allowed_retries(job)
        return "-" if allowed == "-" else f"{job.retries}/{allowed}"

    @admin.display(description="lease")
    def lease(self, job: Job) -> str:
        if not job.locked_by and job.locked_until is None:
            return "-"
        until = job.locked_until.strftime("%H:%M:%S") if job.locked_until else "?"
        return f"{job.locked_by or '?'} until {until}"

    def get_search_results(self, request, queryset, search_term):
        """An exact id (or ``<id>:<attempt>``) or an exact key; the start of an id (a primary-key
        range); a key prefix (``cron_job_key_prefix``); any other part of an id among the latest
        ``PARTIAL_ID_SCAN`` jobs only (a bounded walk of the primary key, said on the page)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = _uuid(term)
        if job_id is not None:
            return queryset.filter(Q(id=job_id) | Q(key=term)), False
        match = Q(key__startswith=term)
        digits = id_part(term)
        if digits is not None:  # the ids first (bounded reads of the primary key), then one indexed OR
            lo, hi = id_prefix_range(digits)
            ids = list(Job.objects.filter(id__gte=lo, id__lte=hi).order_by("id").values_list("id", flat=True)[
                :SEARCH_IDS])
            latest = Job.objects.order_by("-id").values("id")[:PARTIAL_ID_SCAN]
            ids += Job.objects.filter(id__in=latest).annotate(
                hex=Replace(Cast("id", TextField()), Value("-"), Value(""), output_field=TextField())
            ).filter(hex__contains=digits).order_by().values_list("id", flat=True)[:SEARCH_IDS]
            if ids:
                match |= Q(id__in=ids)
            self.message_user(request, f"A part of an id is looked for among the latest {PARTIAL_ID_SCAN:,} jobs "
                                       "only (the start of an id, or a whole one, searches them all).",
                              messages.INFO)
        return queryset.filter(match), False

    # -- one job ------------------------------------------------------------------------------------

    def get_readonly_fields(self, request, obj=None):
        editable = editable_schedule_fields(obj) if self.has_change_permission(request, obj) else ()
        return [f.name for f in Job._meta.fields if f.name not in editable] + [
            "summary", "schedule", "next_fires", "attempt_history", "queue_name", "retries_allowed"]

    @admin.display(description="max retries")
    def retries_allowed(self, job: Job) -> str:
        """The job's own limit, else its task's, said so."""
        return allowed_retries(job)

    @admin.display(description="at a glance")
    def summary(self, job: Job) -> str:
        """Status, late by and why, next fire, who owns the schedule."""
        parts = [status_badge(job.status)]
        late = late_seconds(job) if hasattr(job, "db_now") else None
        if late is not None:
            parts.append(format_html('{} <strong style="color:#ba2121">late by {}</strong>: {}',
                                     status_badge(job.status, late=True), duration_text(late), LateReasons()(job)))
        elif job.status in (Status.PENDING, Status.PAUSED):
            parts.append(format_html("next fire {} UTC", f"{job.fire_at:%Y-%m-%d %H:%M:%S}"))
        if job.status == Status.FAILED:
            error = (JobAttempt.objects.filter(job_id=job.id).order_by("-attempt").values_list("error", flat=True)
                     .first() or "").strip().splitlines()
            parts.append(format_html("failed after {} attempt{} ({} retries){}{}", job.attempts,
                                     "s" if job.attempts != 1 else "", job.retries, ": " if error else "",
                                     error[-1] if error else ""))
        if job.status == Status.PAUSED and job.pause_note:
            parts.append(format_html("paused: {}", job.pause_note))
        if job.overdue_since is not None:
            parts.append(format_html('<strong style="color:#ba2121">overdue (no success within grace) since {} UTC'
                                     "</strong>", f"{job.overdue_since:%Y-%m-%d %H:%M:%S}"))
        if is_beat_job(job):
            parts.append(format_html(
                '<span class="cas-beat-owned">Owned by the beat schedule (entry <code>{}</code> of '
                "<code>beat_schedule</code>): its schedule is changed there, in code, and copied at every beat "
                "start, so it is not editable here. Pause stays (the beat sync keeps a job paused by hand); a "
                "cancelled beat job is created again at the next beat start.</span>", job.key[len(BEAT_PREFIX):]))
        return format_html_join(mark_safe("<br>"), "{}", ((p,) for p in parts))

    def get_fieldsets(self, request, obj=None):
        editable = editable_schedule_fields(obj) if self.has_change_permission(request, obj) else ()
        if not editable:
            return self.fieldsets
        first = list(self.fieldsets[0][1]["fields"])
        first[first.index("schedule") + 1:first.index("schedule") + 1] = editable
        return ((None, {"fields": tuple(first), "description":
                        "Changing the schedule reschedules the job in place (cron_at_scale.reschedule): it runs "
                        "from the new schedule's next occurrence, no run lost or doubled."}),
                *self.fieldsets[1:])

    def save_model(self, request, obj, form, change):
        changes = form.changes()
        if changes:
            cron_at_scale.reschedule(obj.pk, **changes)

    @admin.display(description=f"next {NEXT_FIRES_SHOWN} fires")
    def next_fires(self, job: Job) -> str:
        try:
            lines = next_fires_text(job)
        except ValidationError as exc:  # a row written around the API: say why instead of failing the page
            return str(exc)
        return format_html_join("", "{}<br>", ((line,) for line in lines)) if lines else "-"

    @admin.display(description=f"latest {ATTEMPTS_SHOWN} attempts")
    def attempt_history(self, job: Job) -> str:
        attempts = list(JobAttempt.objects.filter(job_id=job.id).order_by("-attempt")[:ATTEMPTS_SHOWN])
        if not attempts:
            return "none yet"
        results = _task_results([a.task_id for a in attempts])
        rows = format_html_join(
            "\n", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                  "<td><pre style='white-space:pre-wrap;margin:0'>{}</pre></td></tr>",
            ((a.attempt, _t(a.scheduled_at), _t(a.started_at), _t(a.finished_at), a.worker or "-", a.outcome,
              results.get(a.task_id, "-"), a.error or "") for a in attempts),
        )
        more = JobAttempt.objects.filter(job_id=job.id).count() > ATTEMPTS_SHOWN if len(attempts) == ATTEMPTS_SHOWN \
            else False
        link = ""
        if more:
            url = reverse("admin:cron_at_scale_jobattempt_changelist") + f"?job__id__exact={job.id}"
            link = format_html('<p><a href="{}">all attempts</a></p>', url)
        return format_html(
            "<table><thead><tr><th>#</th><th>scheduled</th><th>started</th><th>finished</th><th>worker</th>"
            "<th>outcome</th><th>task result</th><th>error</th></tr></thead><tbody>{}</tbody></table>{}",
            rows, link,
        )

    def has_add_permission(self, request):
        return False  # jobs are scheduled through the API or ``manage.py cron_schedule`` (validated)

    def has_change_permission(self, request, obj=None):
        # the row is the scheduler's state: change it with the actions, or a live recurring job's
        # schedule through reschedule() (Django's change_job permission)
        if not request.user.has_perm("cron_at_scale.change_job"):
            return False
        return obj is None or bool(editable_schedule_fields(obj))

    def has_delete_permission(self, request, obj=None):
        return False  # cancel, and let retention (cron_purge) delete finished jobs

    # -- actions ------------------------------------------------------------------------------------

    def has_cancel_permission(self, request) -> bool:
        return request.user.has_perm("cron_at_scale.cancel_job")

    def has_run_permission(self, request) -> bool:
        return request.user.has_perm("cron_at_scale.run_job")

    def has_requeue_permission(self, request) -> bool:
        return request.user.has_perm("cron_at_scale.requeue_job")

    def has_pause_permission(self, request) -> bool:
        return request.user.has_perm("cron_at_scale.pause_job")

    def _ids(self, request, queryset) -> list | None:
        ids = list(queryset.order_by().values_list("id", flat=True)[: MAX_ACTION_JOBS + 1])
        if len(ids) > MAX_ACTION_JOBS:
            self.message_user(request, f"More than {MAX_ACTION_JOBS} jobs selected: narrow the selection, or use "
                                       "manage.py cron_cancel / cron_requeue.", messages.ERROR)
            return None
        return ids

    def _report(self, request, verb: str, done: int, total: int, why: str) -> None:
        level = messages.SUCCESS if done else messages.WARNING
        text = f"{verb} {done} of {total} selected job{'s' if total != 1 else ''}."
        if done < total:
            text += f" The others {why}."
        self.message_user(request, text, level)

    @admin.action(description="Cancel selected jobs", permissions=["cancel"])
    def cancel_jobs(self, request, queryset):
        ids = self._ids(request, queryset)
        if ids is not None:
            done = sum(cron_at_scale.cancel(i) for i in ids)
            self._report(request, "Cancelled", done, len(ids), "had already finished")

    @admin.action(description="Run selected jobs now", permissions=["run"])
    def run_jobs_now(self, request, queryset):
        ids = self._ids(request, queryset)
        if ids is not None:
            done = run_now(ids)
            self._report(request, "Made due now", done, len(ids), "were not pending with a future fire time")

    @admin.action(description="Requeue selected failed jobs", permissions=["requeue"])
    def requeue_jobs(self, request, queryset):
        ids = self._ids(request, queryset)
        if ids is not None:
            done = sum(cron_at_scale.requeue(i) for i in ids)
            self._report(request, "Requeued", done, len(ids), "were not failed (or their key is live again)")

    @admin.action(description="Pause selected recurring jobs", permissions=["pause"])
    def pause_jobs(self, request, queryset):
        ids = self._ids(request, queryset)
        if ids is not None:
            note = f"paused in the admin by {request.user.get_username()}"
            done = sum(cron_at_scale.pause(i, note) for i in ids)
            self._report(request, "Paused", done, len(ids), "are not pending recurring jobs")

    @admin.action(description="Resume selected paused jobs…", permissions=["pause"])
    def resume_jobs(self, request, queryset):
        """An intermediate page asks what to do with the occurrences missed while paused; its
        POST (``post=yes``, ``missed``) resumes them with ``resume(missed=...)``."""
        ids = self._ids(request, queryset)
        if ids is None:
            return None
        missed = request.POST.get("missed")
        if request.POST.get("post") and missed in {value for value, _ in RESUME_CHOICES}:
            try:
                done = sum(cron_at_scale.resume(i, missed=missed or None) for i in ids)
            except ValidationError as e:
                self.message_user(request, str(e), messages.ERROR)
                return None
            self._report(request, "Resumed", done, len(ids), "were not paused")
            return None
        context = {**self.admin_site.each_context(request), "title": "Resume paused jobs",
                   "opts": self.model._meta, "jobs": Job.objects.filter(id__in=ids).order_by("-fire_at"),
                   "paused": Job.objects.filter(id__in=ids, status=Status.PAUSED).count(),
                   "choices": RESUME_CHOICES, "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME}
        return TemplateResponse(request, "admin/cron_at_scale/job/resume_confirmation.html", context)

    # -- the dashboard ------------------------------------------------------------------------------

    # -- the job page's buttons -----------------------------------------------------------------------

    # (action, button label, the statuses it applies to, recurring only)
    JOB_BUTTONS = (
        ("run_jobs_now", "Run now", (Status.PENDING,), False),
        ("pause_jobs", "Pause", (Status.PENDING,), True),
        ("resume_jobs", "Resume…", (Status.PAUSED,), True),
        ("requeue_jobs", "Requeue", (Status.FAILED,), False),
        ("cancel_jobs", "Cancel", LIVE_STATUSES, False),
    )

    def job_buttons(self, request, job: Job) -> list[dict]:
        """The actions the job page offers for ``job``: those that apply to its state and that
        ``request.user`` may run (the changelist's own action permissions)."""
        allowed = self.get_actions(request)
        out = []
        for name, label, statuses, recurring in self.JOB_BUTTONS:
            if name not in allowed or job.status not in statuses:
                continue
            if recurring and job.schedule_type == ScheduleType.ONCE:
                continue
            if name == "run_jobs_now" and late_seconds(job) is not None:
                continue  # already due
            out.append({"name": name, "label": label,
                        "url": reverse("admin:cron_at_scale_job_act", args=[job.pk, name])})
        return out

    def job_action_view(self, request, object_id, action):
        """POST: run the changelist action ``action`` on this one job (its permission checked as the
        changelist checks it) and come back to the job page; Resume's question page posts here too."""
        job_id = _uuid(object_id)
        if conf.shard_map() is not None and job_id:
            with conf.using(conf.alias_of_job(job_id)):  # the job's own database
                return _rendered(self._job_action_view(request, object_id, action))
        return self._job_action_view(request, object_id, action)

    def _job_action_view(self, request, object_id, action):
        from django.core.exceptions import PermissionDenied
        from django.http import Http404, HttpResponseNotAllowed

        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        actions = self.get_actions(request)
        if action not in actions:
            raise PermissionDenied
        job_id = _uuid(object_id)
        queryset = self.get_queryset(request).filter(pk=job_id) if job_id else Job.objects.none()
        if not queryset.exists():
            raise Http404("no such job")
        func = actions[action][0]
        response = func(self, request, queryset)
        if response is not None:
            return response
        return HttpResponseRedirect(reverse("admin:cron_at_scale_job_change", args=[job_id]))

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["job_buttons"] = self.job_buttons(request, obj) if obj is not None else []
        return super().render_change_form(request, context, add, change, form_url, obj)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """A job that has moved to the history (``HISTORY_AFTER`` after it finished): its history page."""
        job_id = _uuid(object_id)
        if conf.shard_map() is not None and job_id:
            with conf.using(conf.alias_of_job(job_id)):  # the job's own database
                return _rendered(self._change_view(request, job_id, object_id, form_url, extra_context))
        return self._change_view(request, job_id, object_id, form_url, extra_context)

    def _change_view(self, request, job_id, object_id, form_url, extra_context):
        if job_id and not Job.objects.filter(id=job_id).exists() and JobHistory.objects.filter(id=job_id).exists():
            messages.info(request, "This job finished and moved to the history.")
            return HttpResponseRedirect(reverse("admin:cron_at_scale_jobhistory_change", args=[job_id]))
        return super().change_view(request, object_id, form_url, extra_context)

    def get_urls(self):
        view = self.admin_site.admin_view(self.dashboard_view)
        act = self.admin_site.admin_view(self.job_action_view)
        return [path("dashboard/", view, name="cron_at_scale_job_dashboard"),
                path("<path:object_id>/act/<str:action>/", act, name="cron_at_scale_job_act"), *super().get_urls()]

    def dashboard_view(self, request):
        from django.core.exceptions import PermissionDenied

        if not self.has_view_permission(request):
            raise PermissionDenied
        from cron_at_scale.views import dashboard_context

        context = {**self.admin_site.each_context(request), **dashboard_context(),
                   "opts": self.model._meta, "title": "Scheduler dashboard"}
        return TemplateResponse(request, "admin/cron_at_scale/dashboard.html", context)


class _LogAdmin(admin.ModelAdmin):
    """A read-only log at 10M rows: no sorting but its ordering, an estimated count, no facets."""

    sortable_by = ()
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(JobAttempt)
class JobAttemptAdmin(_LogAdmin):
    """The attempt log, read only. Open it from a job's page (``?job__id__exact=<job id>``)."""

    list_display = ("job_id", "attempt", "outcome", "scheduled_at", "started_at", "finished_at", "worker")
    ordering = ("-id",)
    search_fields = ("=job__id",)
    search_help_text = "An exact job id."

    def get_search_results(self, request, queryset, search_term):
        return _attempts_of(queryset, search_term), False

    def lookup_allowed(self, lookup, value, request=None):
        return lookup in ("job__id__exact", "job__id", "job_id") or super().lookup_allowed(lookup, value, request)


@admin.register(JobHistory)
class JobHistoryAdmin(_LogAdmin):
    """Finished jobs that left the live table (``HISTORY_AFTER`` after they finished), newest first,
    read only, until their partition is dropped (``RETENTION``). Search: an exact job id or key."""

    list_display = ("id", "task", "status", "schedule_type", "fire_at", "attempts", "archived_at")
    ordering = ("-archived_at",)
    list_filter = ("status",)
    search_fields = ("=id", "=key")
    search_help_text = "An exact job id or key."

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = _uuid(term)
        return (queryset.filter(id=job_id) if job_id else queryset.filter(key=term)), False

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "attempt_log"]

    @admin.display(description="attempts")
    def attempt_log(self, obj) -> str:
        url = reverse("admin:cron_at_scale_attempthistory_changelist")
        return format_html('<a href="{}?job_id={}">the attempt log</a>', url, obj.id)


@admin.register(AttemptHistory)
class AttemptHistoryAdmin(_LogAdmin):
    """Finished attempts that left the live attempt log with their job; ``?job_id=<job id>``."""

    list_display = ("job_id", "attempt", "outcome", "scheduled_at", "started_at", "finished_at", "worker")
    ordering = ("-archived_at",)
    search_fields = ("=job_id",)
    search_help_text = "An exact job id."

    def get_search_results(self, request, queryset, search_term):
        return _attempts_of(queryset, search_term), False

    def lookup_allowed(self, lookup, value, request=None):
        return lookup == "job_id" or super().lookup_allowed(lookup, value, request)


def _attempts_of(queryset, search_term: str):
    """The attempt-log search: an exact job id (anything else finds nothing; empty: all)."""
    if not search_term.strip():
        return queryset
    job_id = _uuid(search_term.strip())
    return queryset.filter(job_id=job_id) if job_id else queryset.none()


def _t(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if value else "-"


def _task_results(task_ids: list[str]) -> dict[str, str]:
    """``{task id: link to its TaskResult in the admin}`` for the ids django-celery-results holds."""
    if not apps.is_installed("django_celery_results"):
        return {}
    from django_celery_results.models import TaskResult

    found = dict(TaskResult.objects.filter(task_id__in=task_ids).values_list("task_id", "pk"))
    out = {}
    for task_id, pk in found.items():
        try:
            url = reverse("admin:django_celery_results_taskresult_change", args=[pk])
        except NoReverseMatch:
            out[task_id] = task_id
        else:
            out[task_id] = format_html('<a href="{}">{}</a>', url, task_id)
    return out
