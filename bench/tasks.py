"""The benchmark's own Celery task, loaded by its workers with ``celery worker --include bench.tasks``.

``bench.stamp(i, eta)`` writes one ``demo_execution`` row: ``attempt = i``,
``occurrence = eta`` (the ETA the message was sent with) and ``executed_at``
from the database clock, so ``executed_at - occurrence`` is Celery ETA's
start lag on the same clock as the scheduler's own figures.
"""

from __future__ import annotations

import os

from celery import shared_task


@shared_task(name="bench.stamp", ignore_result=True)
def stamp(i: int, eta: str) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("INSERT INTO demo_execution (attempt, occurrence, pid, executed_at) "
                    "VALUES (%s, %s, %s, statement_timestamp())", [i, eta, os.getpid()])
