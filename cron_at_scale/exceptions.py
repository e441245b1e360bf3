"""Exceptions raised by cron_at_scale's public API."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError


class ValidationError(DjangoValidationError, ValueError):
    """Bad input to the scheduling API; nothing was written.

    ``field`` names the argument at fault (``"cron"``, ``"tz"``, ``"at"`` ...).
    A subclass of Django's ``ValidationError`` (``message_dict`` is
    ``{field: [message]}``) and of ``ValueError``.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        self.text = f"{field}: {message}"
        super().__init__({field: [self.text]})

    def __str__(self) -> str:
        return self.text


class RetryableError(Exception):
    """Raise inside a scheduled task to ask for a retry under the job's policy."""


class Ignore(Exception):
    """Internal: a delivery that must not run (duplicate, superseded or cancelled)."""


class KeyConflict(ValidationError):
    """``schedule(key=K)`` while a live job holds ``K`` with a different schedule; nothing was written.

    ``field`` is the first differing column (``"cron_expr"``, ``"interval"`` ...),
    ``fields`` all of them, ``job`` the live job. Pass ``update=True`` to change
    that job in place (``reschedule``), or use another key.
    """

    def __init__(self, field: str, message: str, *, fields: list[str], job):
        super().__init__(field, message)
        self.fields = fields
        self.job = job


def show(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, never failing (a 5000-digit int's repr raises)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
