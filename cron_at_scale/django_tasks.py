"""A backend for Django's Tasks framework (``django.tasks``, Django 6; the ``django-tasks``
backport on 5.2): ``@task`` functions go through the job store and run on Celery workers.

    TASKS = {"default": {"BACKEND": "cron_at_scale.django_tasks.CronAtScaleBackend"}}

``task.enqueue(...)`` schedules a job of the Celery task
``cron_at_scale.run_django_task``; ``run_after`` becomes the job's ``at``;
``priority`` (-100..100, higher first) maps onto Celery's 0..9 in the
broker's own order (Redis serves 0 first, RabbitMQ 9); ``queue_name`` is the
Celery queue (``"default"`` meaning Celery's default). The result id is the
job id; ``get_result()`` reads the job and its attempts: pending -> READY,
started -> RUNNING, completed -> SUCCESSFUL (with the return value),
failed or cancelled -> FAILED (with each attempt's error).
"""

from __future__ import annotations

import json
import uuid

try:  # Django 6
    from django.tasks import DEFAULT_TASK_QUEUE_NAME
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import DEFAULT_TASK_QUEUE_NAME  # type: ignore[no-redef]
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import TaskContext, TaskError, TaskResult, TaskResultStatus  # type: ignore[no-redef]
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]

from django.utils.module_loading import import_string

from cron_at_scale import sql as db

TASK_MIN_PRIORITY, TASK_MAX_PRIORITY = -100, 100


def celery_priority(priority: int, lower_first: bool) -> int:
    """Django's -100..100 (higher runs first) onto Celery's 0..9. ``lower_first``: the broker serves
    lower numbers first (kombu's Redis transport does; RabbitMQ serves higher first)."""
    step = round((priority - TASK_MIN_PRIORITY) * 9 / (TASK_MAX_PRIORITY - TASK_MIN_PRIORITY))
    return 9 - step if lower_first else step


def _broker_serves_low_first() -> bool:
    from cron_at_scale.celery_app import get_app

    with get_app().connection_for_write() as conn:
        return conn.transport.driver_type == "redis"


class CronAtScaleBackend(BaseTaskBackend):
    """Django Tasks backend storing tasks as cron_at_scale jobs, executed by Celery workers."""

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = False

    def __init__(self, alias, params):
        super().__init__(alias, params)
        self.queues = set(params.get("QUEUES", [])) or set()  # any queue name: they are Celery queues

    def enqueue(self, task, args, kwargs):
        from cron_at_scale.api.schedule import schedule
        from cron_at_scale.tasks import RUN_DJANGO_TASK

        self.validate_task(task)
        job = schedule(
            RUN_DJANGO_TASK,
            args=[task.module_path, list(args), dict(kwargs)],
            at=task.run_after,
            queue=None if task.queue_name == DEFAULT_TASK_QUEUE_NAME else task.queue_name,
            priority=celery_priority(task.priority, _broker_serves_low_first()),
            max_retries=0,
        )
        return self._result(task, job, [])

    def get_result(self, result_id):
        """The job's result, from the live table or, once it moved there (``HISTORY_AFTER``), the
        history; ``TaskResultDoesNotExist`` for an unknown id (or one dropped with its partition)."""
        from cron_at_scale.models import AttemptHistory, Job, JobHistory
        from cron_at_scale.tasks import RUN_DJANGO_TASK

        try:
            job_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        job = Job.objects.filter(id=job_id, task=RUN_DJANGO_TASK).first()
        if job is not None:
            attempts = list(job.attempt_log.order_by("attempt"))
        else:
            job = JobHistory.objects.filter(id=job_id, task=RUN_DJANGO_TASK).first()
            if job is None:
                raise TaskResultDoesNotExist(result_id)
            attempts = list(AttemptHistory.objects.filter(job_id=job_id).order_by("attempt"))
        task = import_string(job.payload["args"][0])
        return self._result(task, job, attempts)

    def _result(self, task, job, attempts) -> TaskResult:
        started = [a for a in attempts if a.started_at]
        last = attempts[-1] if attempts else None
        if job.status == "completed":
            status = TaskResultStatus.SUCCESSFUL
        elif job.status in ("failed", "cancelled"):
            status = TaskResultStatus.FAILED
        elif last is not None and last.outcome == "running":
            status = TaskResultStatus.RUNNING
        else:
            status = TaskResultStatus.READY
        errors = [TaskError(exception_class_path=a.error.split(":", 1)[0], traceback=a.traceback)
                  for a in attempts if a.error]
        args = job.payload.get("args", [None, [], {}])
        result = TaskResult(
            task=task, id=str(job.id), status=status,
            enqueued_at=job.created_at if not hasattr(job.created_at, "resolve_expression") else None,
            started_at=started[0].started_at if started else None,
            finished_at=last.finished_at if last is not None and status in (TaskResultStatus.SUCCESSFUL,
                                                                             TaskResultStatus.FAILED) else None,
            last_attempted_at=started[-1].started_at if started else None,
            args=list(args[1]), kwargs=dict(args[2]), backend=self.alias, errors=errors,
            worker_ids=[a.worker for a in started],
        )
        if status == TaskResultStatus.SUCCESSFUL and last is not None and last.result is not None:
            object.__setattr__(result, "_return_value", last.result)
        return result


def execute(module_path: str, args: list, kwargs: dict):
    """Run the Django task at ``module_path`` inside a scheduled run; keep its JSON return value."""
    from cron_at_scale.worker.task import current_job

    task = import_string(module_path)
    if task.takes_context:
        job = current_job()
        backend = CronAtScaleBackend("default", {})
        context_result = backend.get_result(job.job_id) if job else None
        value = task.call(TaskContext(task_result=context_result), *args, **kwargs)
    else:
        value = task.call(*args, **kwargs)
    job = current_job()
    if job is not None:
        db.run("keep_result", {"job_id": str(job.job_id), "attempt": job.attempt,
                               "result": json.dumps(value)}, fetch="count")
    return value
