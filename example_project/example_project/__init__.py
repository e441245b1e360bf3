# Load the Celery app when Django starts, so @shared_task uses it
# (Celery's "First steps with Django").
from .celery import app as celery_app

__all__ = ("celery_app",)
