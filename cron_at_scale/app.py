from .celery_app import _configured_app, get_app, is_registered  # noqa: F401 (the old name: celery_app.py)
