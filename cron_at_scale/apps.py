from __future__ import annotations

from django.apps import AppConfig


class CronAtScaleConfig(AppConfig):
    name = "cron_at_scale"
    verbose_name = "Scheduled jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from cron_at_scale import checks  # noqa: F401 (registers the system checks)
