from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Celery's autodiscovery imports only demo.tasks; the nemesis run's ledger tasks register here.
        from . import ledger, signals  # noqa: F401 (signals: the overdue signals' test receivers)
