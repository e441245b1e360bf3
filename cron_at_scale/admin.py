"""The Django admin for jobs, built for a table of ten million rows.

What keeps every page under a second at that size:

* no exact ``COUNT(*)``: :class:`EstimatedCountPaginator` counts at most
  ``EXACT_COUNT_LIMIT + 1`` rows and, beyond, takes the planner's estimate
  (``pg_class.reltuples`` when unfiltered); ``show_full_result_count = False``;
  facets off; at most ``MAX_PAGES`` pages (deep ``OFFSET`` is a table scan:
  narrow with a filter or a search instead);
* the default ordering (``-fire_at, -id``) and each filter (status, schedule
  type, task, queue) walk an index (migration 0003); the task and queue
  filters list their values with a skip scan of that index, not ``SELECT
  DISTINCT`` over the table; only ``fire_at`` is sortable;
* search is an index lookup: an exact job id (or a Celery task id
  ``<job id>:<attempt>``), else a key prefix; never ``LIKE '%…%'``;
* the change page shows the latest ``ATTEMPTS_SHOWN`` attempts (an index
  range) and their django-celery-results ``TaskResult`` in one query. A cron
  job's page also previews its next ``NEXT_FIRES_SHOWN`` fires (no query).

Actions (cancel, run now, requeue, pause, resume) call the public API and
need custom permissions (``cancel_job``, ``run_job``, ``requeue_job``,
``pause_job``): without them the action is not offered, and a forged POST
naming it is refused by the action form. Resume asks, on an intermediate page,
what to do with the occurrences missed while paused (``resume(missed=...)``).

The change form edits only a live recurring job's schedule (cron expression and
zone, or interval), with Django's ``change_job`` permission; saving calls
``cron_at_scale.reschedule`` (the one path that changes a job in place), and
its validation errors show on the field.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from functools import cached_property

from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.paginator import Paginator
from django.db.models import F, Q
from django.db.models.functions import Coalesce, Now
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html, format_html_join

import cron_at_scale
from cron_at_scale import cron as cronlib
from cron_at_scale import sql as db
from cron_at_scale.exceptions import ValidationError
from cron_at_scale.models import LIVE_STATUSES, Job, JobAttempt, ScheduleType, Status
from cron_at_scale.ops.status import planner_estimate, table_estimate

EXACT_COUNT_LIMIT = 10_000  # results counted exactly up to here (bounded: LIMIT); beyond, the planner's estimate
MAX_PAGES = 200  # deepest page offered: OFFSET 20,000 rows at 100 per page stays fast
ATTEMPTS_SHOWN = 50  # latest attempts on a job's page
NEXT_FIRES_SHOWN = 5  # a cron job's pending occurrence and the ones after it, on its page
MAX_ACTION_JOBS = 10_000  # an action over more rows is refused (use the commands, which batch)


class EstimatedCountPaginator(Paginator):
    """A paginator that never counts more than ``EXACT_COUNT_LIMIT + 1`` rows."""

    @cached_property
    def count(self) -> int:
        qs = self.object_list
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


class OverdueFilter(admin.SimpleListFilter):
    """Recurring jobs overdue now (:mod:`cron_at_scale.maintenance.overdue`): the rule's ids (a walk of the
    recurring jobs' partial index, at most ``MAX_ACTION_JOBS``), then a primary-key lookup."""

    title = "overdue"
    parameter_name = "overdue"

    def lookups(self, request, model_admin):
        return [("yes", "overdue now")]

    def queryset(self, request, queryset):
        if self.value() != "yes":
            return queryset
        from cron_at_scale.maintenance.overdue import overdue_jobs

        jobs, _total = overdue_jobs(limit=MAX_ACTION_JOBS)
        return queryset.filter(id__in=[j.id for j in jobs])


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text.split(":", 1)[0])
    except ValueError:
        return None


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


def editable_schedule_fields(job: Job | None) -> tuple[str, ...]:
    """The schedule fields the change form edits for ``job``: none unless it is live and recurring."""
    if job is None or job.status not in LIVE_STATUSES:
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
    list_display = ("short_id", "task", "status", "schedule", "fire_at", "retries_used", "attempts", "lease")
    list_display_links = ("short_id",)
    list_filter = ("status", "schedule_type", TaskFilter, QueueFilter, OverdueFilter)
    search_fields = ("=id", "key")  # only to show the search box: get_search_results does the lookups
    search_help_text = "An exact job id (or a task id <job id>:<attempt>), or a key or the start of one."
    ordering = ("-fire_at",)
    sortable_by = ("fire_at",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100
    actions = ("cancel_jobs", "run_jobs_now", "requeue_jobs", "pause_jobs", "resume_jobs")
    change_list_template = "admin/cron_at_scale/job/change_list.html"
    form = RescheduleForm
    fieldsets = (
        (None, {"fields": ("id", "task", "status", "schedule", "fire_at", "key", "queue", "payload", "options")}),
        ("Attempts", {"fields": ("attempt_history",)}),
        ("Retries", {"fields": ("retries", "max_retries", "attempts", "lost_attempts", "expired_runs")}),
        ("Lease", {"fields": ("locked_by", "locked_until", "cancel_requested")}),
        ("Recurring", {"classes": ("collapse",), "fields": (
            "occurrence_at", "next_fires", "catchup", "catchup_window", "overlap", "jitter", "buffered_at",
            "missed_occurrences", "skipped_occurrences", "pause_note")}),
        ("Has it run?", {"classes": ("collapse",), "fields": (
            "grace", "last_success_at", "last_success_occurrence", "due_since", "resumed_at", "overdue_since")}),
        ("Times", {"fields": ("created_at", "updated_at")}),
    )

    # -- the list ---------------------------------------------------------------------------------

    @admin.display(description="id")
    def short_id(self, job: Job) -> str:
        return format_html('<span title="{}" style="font-family:monospace">{}…</span>', job.id, str(job.id)[:8])

    @admin.display(description="schedule")
    def schedule(self, job: Job) -> str:
        return schedule_text(job)

    @admin.display(description="retries")
    def retries_used(self, job: Job) -> str:
        return f"{job.retries}/{'task' if job.max_retries is None else job.max_retries}"  # None: the task's

    @admin.display(description="lease")
    def lease(self, job: Job) -> str:
        if not job.locked_by and job.locked_until is None:
            return "-"
        until = job.locked_until.strftime("%H:%M:%S") if job.locked_until else "?"
        return f"{job.locked_by or '?'} until {until}"

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = _uuid(term)
        if job_id is not None:
            return queryset.filter(Q(id=job_id) | Q(key=term)), False
        return queryset.filter(key__startswith=term), False

    # -- one job ------------------------------------------------------------------------------------

    def get_readonly_fields(self, request, obj=None):
        editable = editable_schedule_fields(obj) if self.has_change_permission(request, obj) else ()
        return [f.name for f in Job._meta.fields if f.name not in editable] + ["schedule", "next_fires", "attempt_history"]

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

    def get_urls(self):
        view = self.admin_site.admin_view(self.dashboard_view)
        return [path("dashboard/", view, name="cron_at_scale_job_dashboard"), *super().get_urls()]

    def dashboard_view(self, request):
        from django.core.exceptions import PermissionDenied

        if not self.has_view_permission(request):
            raise PermissionDenied
        from cron_at_scale.views import dashboard_context

        context = {**self.admin_site.each_context(request), **dashboard_context(),
                   "opts": self.model._meta, "title": "Scheduler dashboard"}
        return TemplateResponse(request, "admin/cron_at_scale/dashboard.html", context)


@admin.register(JobAttempt)
class JobAttemptAdmin(admin.ModelAdmin):
    """The attempt log, read only. Open it from a job's page (``?job__id__exact=<job id>``)."""

    list_display = ("job_id", "attempt", "outcome", "scheduled_at", "started_at", "finished_at", "worker")
    ordering = ("-id",)
    sortable_by = ()
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100
    search_fields = ("=job__id",)
    search_help_text = "An exact job id."

    def get_search_results(self, request, queryset, search_term):
        job_id = _uuid(search_term.strip())
        if not search_term.strip():
            return queryset, False
        return (queryset.filter(job_id=job_id) if job_id else queryset.none()), False

    def lookup_allowed(self, lookup, value, request=None):
        return lookup in ("job__id__exact", "job__id", "job_id") or super().lookup_allowed(lookup, value, request)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in JobAttempt._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


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
