"""What every message the dispatcher publishes carries, on each broker path: the ``cron_at_scale``
header naming the run, and the parts of Celery's protocol 2 the fast paths write themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cron_at_scale.dispatcher.claimed import Claimed

HEADER = "cron_at_scale"
EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
REPR_MAX = 1024  # Celery's argsrepr_maxsize


def header(c: Claimed) -> dict:
    """The ``cron_at_scale`` message header: which run this is. ``fire_at``: when it was due;
    ``occurrence``: the schedule's nominal time of a recurring run (``fire_at`` without jitter)."""
    return {"job_id": str(c.job_id), "attempt": c.attempt, "fire_at": c.fire_at.isoformat(),
            "occurrence": (c.occurrence or c.fire_at).isoformat()}
