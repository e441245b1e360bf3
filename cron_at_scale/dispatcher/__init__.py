"""The dispatcher: the loop that claims due jobs from PostgreSQL and publishes them.

``loop`` (the :class:`Dispatcher`: claim, publish, pre-load, wake-ups), ``shards``
(shard leases and heads), ``floors`` (the earliest pending ``fire_at`` per shard),
``backpressure`` (queues that are full or have no consumer), ``timers`` (runs held
until their ``fire_at``), ``wakeup`` (LISTEN/NOTIFY), ``advance`` (a recurring job's
next occurrence), ``preload`` (claiming a burst ahead), ``failpoints`` (the fault suite's
places to die). Its statements are in ``cron_at_scale/sql/dispatcher.sql``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Dispatcher"]


def __getattr__(name: str) -> Any:
    # Lazy: ``cron_at_scale.dispatcher.shards`` and its kin import without the loop.
    if name in ("Dispatcher", "Publisher"):
        return getattr(importlib.import_module("cron_at_scale.dispatcher.loop"), name)
    raise AttributeError(f"module 'cron_at_scale.dispatcher' has no attribute {name!r}")
