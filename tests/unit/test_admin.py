"""The admin's pure helpers: which text is a part of a job id, and the primary-key range of an id's start."""

from __future__ import annotations

import uuid

from cron_at_scale import admin as jobadmin


def test_a_part_of_an_id_is_hex_digits_dashes_dropped():
    assert jobadmin.id_part("01A2-3b") == "01a23b"
    assert jobadmin.id_part("abc") is None  # too short to mean anything
    assert jobadmin.id_part("order-17") is None  # a key, not an id
    assert jobadmin.id_part("f" * 33) is None


def test_the_start_of_an_id_is_a_primary_key_range():
    job_id = uuid.UUID("01a23cbb-020f-790a-b85f-24460c920284")
    lo, hi = jobadmin.id_prefix_range("01a23cbb020f")
    assert lo <= job_id <= hi
    assert not (lo <= uuid.UUID("01a23cbc-0000-7000-8000-000000000000") <= hi)


def test_the_admin_passes_djangos_own_system_checks():
    """``manage.py check`` (and so ``migrate``) of a project with ``django.contrib.admin`` runs the
    admin's checks on every ``ModelAdmin``: a column only made per request fails admin.E108."""
    from django.core import checks

    errors = [m for m in checks.run_checks(tags=[checks.Tags.admin]) if m.is_serious()]
    assert errors == [], errors


def test_the_retries_a_job_may_use_are_its_own_then_its_tasks_and_none_for_a_recurring_job():
    from cron_at_scale.celery_app import get_app
    from cron_at_scale.models import Job, ScheduleType

    name = "unit_admin.flaky"

    def flaky():
        return None

    get_app().task(name=name, autoretry_for=(ValueError,), retry_kwargs={"max_retries": 2}, max_retries=7,
                   shared=False)(flaky)
    job = Job(task=name, schedule_type=ScheduleType.ONCE, options={}, retries=1)
    assert jobadmin.allowed_retries(job) == "2 (task's)"  # Celery's autoretry: retry_kwargs over max_retries
    job.max_retries = 5
    assert jobadmin.allowed_retries(job) == "5"
    job.options = {"retry_kwargs": {"max_retries": 4}}
    assert jobadmin.allowed_retries(job) == "4"  # the job's retry_kwargs, as Celery orders them
    assert jobadmin.JobAdmin.retries_used(None, job) == "1/4"
    assert jobadmin.allowed_retries(Job(task="unit_admin.unknown", schedule_type=ScheduleType.ONCE)) == "? (task's)"
    cron = Job(task=name, schedule_type=ScheduleType.CRON, options={}, max_retries=5)
    assert jobadmin.allowed_retries(cron) == "-" and jobadmin.JobAdmin.retries_used(None, cron) == "-"
