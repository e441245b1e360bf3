"""System checks (``manage.py check``): settings that would break cron_at_scale's promises."""

from __future__ import annotations

from django.core.checks import Error, register

from . import conf


@register()
def check_settings(app_configs=None, **kwargs):
    """cron_at_scale.E001: a bad ``CRON_AT_SCALE`` setting (unknown key, wrong type, not > 0)."""
    return [
        Error(message, hint="See cron_at_scale/conf.py for every setting, its default and unit.",
              id="cron_at_scale.E001")
        for message in conf.problems()
    ]
