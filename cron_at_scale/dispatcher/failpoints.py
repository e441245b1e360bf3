"""Failpoints: named places where a process can be made to die, for the fault-injection suite.

``CRON_AT_SCALE_FAILPOINTS="dispatcher.after_claim"`` (comma-separated) makes
the process ``os._exit(137)`` (what ``kill -9`` looks like) when it reaches
that point. Unset in production: ``hit()`` is then one dict lookup.

Points: ``dispatcher.after_claim`` (claim committed, nothing published yet).
"""

from __future__ import annotations

import os

_ACTIVE = frozenset(filter(None, os.environ.get("CRON_AT_SCALE_FAILPOINTS", "").split(",")))


def hit(name: str) -> None:
    if name in _ACTIVE:
        os._exit(137)
