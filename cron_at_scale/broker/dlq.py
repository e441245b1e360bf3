"""The dead-letter queue: failed jobs announced on a Celery queue for whoever consumes it.

The job row (status ``failed``, its attempts with errors and tracebacks) is
the record; the message is a notification: JSON
``{"job_id", "attempt", "task", "error"}`` on queue ``DLQ_QUEUE``
(default ``cron_at_scale.dlq``).
"""

from __future__ import annotations

import logging

from kombu import Queue

from cron_at_scale import conf

log = logging.getLogger(__name__)


def announce(app, job_id, attempt: int, task_name: str, error: str) -> None:
    """Publish a dead-letter message for attempt ``attempt`` of job ``job_id``.

    Never raises: the job row (status ``failed``) is the record.
    """
    name = conf.get("DLQ_QUEUE")
    body = {"job_id": str(job_id), "attempt": attempt, "task": task_name, "error": error}
    try:
        with app.producer_or_acquire() as producer:
            queue = Queue(name, routing_key=name)
            producer.publish(body, exchange="", routing_key=name, declare=[queue], serializer="json", retry=True)
    except Exception:
        log.exception("could not announce failed job %s on the dead-letter queue", job_id)
