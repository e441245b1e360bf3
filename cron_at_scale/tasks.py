"""Celery tasks cron_at_scale itself registers (found by ``app.autodiscover_tasks()``)."""

from __future__ import annotations

from celery import shared_task

RUN_DJANGO_TASK = "cron_at_scale.run_django_task"


@shared_task(name=RUN_DJANGO_TASK)
def run_django_task(module_path: str, args: list, kwargs: dict):
    """Run a Django Tasks framework task (``@task`` function at ``module_path``) on a Celery worker.

    Its return value (JSON) is kept on the attempt, for ``get_result()``.
    """
    from cron_at_scale.django_tasks import execute

    return execute(module_path, args, kwargs)
