import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

# The one line cron_at_scale needs: every task runs inside its worker middleware.
app = Celery("example_project", task_cls="cron_at_scale.worker:JobTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
