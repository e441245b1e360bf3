"""Django's Tasks framework through cron_at_scale: enqueue, run_after, priority, results."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

try:
    import django.tasks  # noqa: F401  (Django 6)
except ImportError:
    pytest.importorskip("django_tasks", reason="Django < 6 without the django-tasks backport")

from cron_at_scale.broker.publish import HEADER, header
from cron_at_scale.celery_app import get_app
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job

pytestmark = pytest.mark.django_db

TASKS = {"default": {"BACKEND": "cron_at_scale.django_tasks.CronAtScaleBackend"}}


@pytest.fixture(autouse=True)
def tasks_backend(settings):
    settings.TASKS = TASKS


def run_due_jobs():
    """Claim what is due and run it in this process through the worker middleware."""
    app = get_app()
    for run in Dispatcher(name="t", lookahead=0).claim():
        app.tasks[run.task].apply(args=run.payload["args"], kwargs=run.payload["kwargs"],
                                  task_id=f"{run.job_id}:{run.attempt}", headers={HEADER: header(run)})


def test_enqueue_run_and_get_the_result():
    from integration.django_task_funcs import add

    result = add.enqueue(2, 3)
    assert result.status == "READY" and not result.is_finished
    job = Job.objects.get(id=result.id)
    assert job.task == "cron_at_scale.run_django_task"
    run_due_jobs()
    done = add.get_result(result.id)
    assert done.status == "SUCCESSFUL" and done.return_value == 5
    assert done.started_at is not None and done.finished_at is not None and done.worker_ids


def test_a_result_is_still_found_after_its_job_moved_to_the_history():
    from cron_at_scale.maintenance import archive
    from integration.django_task_funcs import add

    archive.keep_partitions(86400, None)
    result = add.enqueue(20, 22)
    run_due_jobs()
    assert archive.move(0) == (1, False) and not Job.objects.filter(id=result.id).exists()
    done = add.get_result(result.id)
    assert done.status == "SUCCESSFUL" and done.return_value == 42 and done.worker_ids


def test_run_after_and_priority_map_onto_the_job():
    from integration.django_task_funcs import add

    when = datetime(2031, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    result = add.using(run_after=when, priority=100).enqueue(1, 1)
    job = Job.objects.get(id=result.id)
    assert job.fire_at == when
    from cron_at_scale.django_tasks import _broker_serves_low_first

    assert job.options == {"priority": 0 if _broker_serves_low_first() else 9}  # first in the broker's order
    assert add.using(priority=-100).enqueue(1, 1).status == "READY"


def test_a_failing_task_reports_its_error():
    from integration.django_task_funcs import explode

    result = explode.enqueue()
    run_due_jobs()
    failed = explode.get_result(result.id)
    assert failed.status == "FAILED"
    assert failed.errors[0].exception_class_path == "builtins.ValueError"
    assert "boom" in failed.errors[0].traceback


def test_context_tasks_see_their_attempt():
    from integration.django_task_funcs import which_attempt

    result = which_attempt.enqueue()
    run_due_jobs()
    assert which_attempt.get_result(result.id).return_value == 1


def test_unknown_result_id():
    from integration.django_task_funcs import add

    with pytest.raises(Exception, match="DoesNotExist|does not exist|not-a-job"):
        add.get_result("not-a-job")
