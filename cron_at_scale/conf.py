"""Settings: one dict, ``CRON_AT_SCALE`` in Django's settings, merged over DEFAULTS."""

from __future__ import annotations

from typing import Any

# Defaults, each with why. Times are seconds.
DEFAULTS: dict[str, Any] = {
    # Jobs claimed per statement: big enough that one round trip carries many
    # jobs, small enough that a batch is published well under a lease.
    "BATCH_SIZE": 1000,
    # Idle poll of the dispatcher; a full batch loops again without sleeping.
    "POLL_INTERVAL": 0.1,
    # Lease of a claimed attempt until a worker starts it (lost message => re-fire after this).
    "DISPATCH_LEASE": 30.0,
    # Lease of a running attempt; the worker's heartbeat renews it.
    "RUN_LEASE": 60.0,
    # Heartbeat period: a third of the run lease, so two missed beats still keep it.
    "HEARTBEAT_INTERVAL": 20.0,
    # How often a dispatcher looks for expired leases.
    "REAPER_INTERVAL": 1.0,
    # Lost attempts (lease expired, nobody finished) after which a job goes to the DLQ:
    # a poison job that kills its worker must not loop forever.
    "MAX_LOST_ATTEMPTS": 5,
    # Check at schedule() time that the task name is registered with the Celery app.
    "VALIDATE_TASK_NAMES": True,
    # Payload (args + kwargs as JSON) size limit, bytes.
    "MAX_PAYLOAD_BYTES": 64 * 1024,
    # Retry every exception, not only RetryableError / autoretry_for / self.retry().
    "RETRY_ALL_EXCEPTIONS": False,
    # Dead-letter queue: where failed jobs are announced.
    "DLQ_QUEUE": "cron_at_scale.dlq",
    # Celery app path ("module:attr"); None => celery.current_app.
    "CELERY_APP": None,
}


def get(name: str) -> Any:
    """Return setting ``name`` from ``settings.CRON_AT_SCALE`` or its default."""
    from django.conf import settings

    user = getattr(settings, "CRON_AT_SCALE", None) or {}
    if name in user:
        return user[name]
    return DEFAULTS[name]
