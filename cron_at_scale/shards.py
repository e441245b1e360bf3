"""Shard leases: how several dispatchers split the jobs without contending.

Every job has a ``shard`` (0-63, from its id). Each dispatcher holds a fair
share of the 64 shard leases (``ShardLease``, database time): it renews them,
takes free or expired ones up to ``ceil(64 / live dispatchers)``, and gives
back the excess when another dispatcher joins, so the work rebalances within
a few renewals; a stopped dispatcher releases its shards at once, a dead
one's expire after ``SHARD_LEASE`` seconds.

Leases only spread the load (DESIGN.md, invariant 3): a job is claimed once
because its row is locked and its state changed in one statement, whatever
two dispatchers believe about their shards.
"""

from __future__ import annotations

import json
import logging
import math

from . import db
from .models import NUM_SHARDS

log = logging.getLogger(__name__)


class ShardLeases:
    """The shards one dispatcher holds; ``refresh()`` every ``ttl / 4`` seconds or so."""

    def __init__(self, name: str, ttl: float):
        self.name = name
        self.ttl = ttl
        self.owned: set[int] = set()
        self._ensured = False

    @property
    def all(self) -> bool:
        return len(self.owned) == NUM_SHARDS

    def claim_params(self) -> dict:
        """Parameters of the claim statement: the shards held (``[-1]``, no shard, when none)."""
        return {"shards": sorted(self.owned) or [-1]}

    def refresh(self) -> set[int]:
        """Say we are alive, renew, then take or give back shards toward a fair share."""
        live = db.run("heartbeat_dispatcher", {"name": self.name, "ttl": self.ttl,
                                              "shards": json.dumps(sorted(self.owned))}, fetch="one").alive
        target = math.ceil(NUM_SHARDS / max(1, live))
        owned = {r.shard for r in db.run("renew_shards", {"name": self.name, "ttl": self.ttl})}
        if len(owned) > target:
            extra = sorted(owned)[target:]
            db.run("release_shards", {"name": self.name, "shards": extra}, fetch="count")
            owned -= set(extra)
        elif len(owned) < target:
            if not self._ensured:
                db.run("ensure_shards", {"n": NUM_SHARDS}, fetch="count")
                self._ensured = True
            got = db.run("acquire_shards", {"name": self.name, "ttl": self.ttl, "n": target - len(owned)})
            owned |= {r.shard for r in got}
        if owned != self.owned:
            log.info("dispatcher %s holds %d shards (%d dispatchers alive)", self.name, len(owned), live)
        self.owned = owned
        return owned

    def release_all(self) -> None:
        """Give every shard back and leave (a clean stop hands over at once)."""
        db.run("release_shards", {"name": self.name, "shards": sorted(self.owned)}, fetch="count")
        db.run("forget_dispatcher", {"name": self.name}, fetch="count")
        self.owned = set()


class AllShards:
    """A dispatcher told to claim every shard (``--shards all``): no leases taken."""

    owned = set(range(NUM_SHARDS))
    all = True

    def claim_params(self) -> dict:
        return {"shards": sorted(self.owned)}

    def refresh(self) -> set[int]:
        return self.owned

    def release_all(self) -> None:
        pass
