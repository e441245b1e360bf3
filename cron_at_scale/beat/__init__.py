"""The drop-in for ``celery beat``: ``celery -A proj beat -S cron_at_scale.beat:Scheduler``.

``scheduler`` (the Celery scheduler: each tick one dispatcher step), ``sync`` (a
``beat_schedule`` copied into keyed recurring jobs), ``mapping`` (one entry to a job's
spec), ``dst`` (where a crontab fires otherwise than Celery beat across a DST change).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Scheduler", "sync_beat_schedule"]


_WHERE = {
    "Scheduler": "scheduler",
    **dict.fromkeys(("SyncReport", "sync_beat_schedule", "upsert", "KEY_PREFIX", "REMOVED_NOTE", "COMPARED_FIELDS"),
                    "sync"),
    **dict.fromkeys(("Unmappable", "crontab_to_cron", "schedule_spec", "entry_spec", "unmapped", "zone_name",
                     "CARRIED_OPTIONS"), "mapping"),
}


def __getattr__(name: str) -> Any:
    # Lazy, as Celery resolves "cron_at_scale.beat:Scheduler"; a submodule's name never comes here.
    if name in _WHERE:
        return getattr(importlib.import_module(f"cron_at_scale.beat.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'cron_at_scale.beat' has no attribute {name!r}")
