"""What every message the dispatcher publishes carries, on each broker path: the ``cron_at_scale``
header naming the run, and the parts of Celery's protocol 2 the fast paths write themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery.utils.saferepr import saferepr

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


def _plain(v: Any, levels: int) -> bool:
    """Whether saferepr writes ``v`` as ``repr`` does: lists and dicts at most ``levels`` deep, and
    strings without quotes, backslashes or unprintable characters (saferepr quotes and escapes
    strings in a container its own way)."""
    if isinstance(v, str):
        return v.isprintable() and "'" not in v and '"' not in v and "\\" not in v
    if isinstance(v, (list, tuple)):
        return levels > 0 and all(_plain(x, levels - 1) for x in v)
    if isinstance(v, dict):
        return levels > 0 and all(_plain(k, 0) and _plain(x, levels - 1) for k, x in v.items())
    return True


def argrepr(v: Any, maxlevels: int) -> str:
    """Celery's ``argsrepr``/``kwargsrepr`` of ``v`` (``celery.utils.saferepr.saferepr`` at
    ``REPR_MAX`` characters and ``task_repr_maxlevels`` levels, as ``send_task`` writes them): plain
    ``repr`` when it is the same (short, shallow, plain strings: ~1 µs against saferepr's ~12)."""
    r = repr(v)
    if len(r) <= REPR_MAX and _plain(v, maxlevels):
        return r
    return saferepr(v, REPR_MAX, maxlevels=maxlevels)
