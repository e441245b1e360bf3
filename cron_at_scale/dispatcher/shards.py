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

The claim reads the head of each shard held (its first due rows, from the
(shard, fire_at) index); :class:`ShardHeads` says how many rows of each, and
:class:`cron_at_scale.dispatcher.floors.ShardFloors` where in the index each head starts.
"""

from __future__ import annotations

import json
import logging
import math

from cron_at_scale import conf
from cron_at_scale import sql as db
from cron_at_scale.dispatcher.floors import ShardFloors
from cron_at_scale.models import NUM_SHARDS

log = logging.getLogger(__name__)


class ShardHeads:
    """How many due rows the claim takes from the head of each shard it holds (``per_shard``).

    The claim reads each held shard's first ``per_shard`` due rows from the (shard, fire_at)
    index and keeps the earliest ``batch_size`` of them, so what it reads never grows with
    other shards' backlog. ``per_shard`` starts at ``ceil(batch_size / shards held)`` (due
    rows spread evenly over the shards, as random ids spread them); when a batch came back
    short while a shard gave all it was allowed (its backlog is larger than its share), it
    doubles, up to ``batch_size``, and the next claim runs at once; a full batch keeps the most
    any shard gave, and a batch that leaves no shard at its limit sets it back. (So after one
    shard's backlog, a burst over every shard may lock up to shards x that share in one claim,
    once: the rows beyond the batch are let go at its commit.) A batch is the earliest of the
    shards' heads: each shard's jobs go out in ``fire_at`` order, and a job past its shard's
    share waits for the next claim (at once: the batch was full) even if older than the last
    one taken.
    """

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.per_shard = batch_size
        self._held = 0

    def params(self, shards: list[int]) -> dict:
        """The claim's ``per_shard`` for these shards held."""
        if len(shards) != self._held:
            self._held = len(shards)
            self.per_shard = self.base
        return {"per_shard": self.per_shard}

    @property
    def base(self) -> int:
        return min(self.batch_size, math.ceil(self.batch_size / max(1, self._held)))

    def learn(self, shards: list[int]) -> bool:
        """Adjust to a claim that returned rows of these shards (one entry per row); True when
        more may be due now (a full batch, or a shard at its limit)."""
        counts: dict[int, int] = {}
        for shard in shards:
            counts[shard] = counts.get(shard, 0) + 1
        most = max(counts.values(), default=0)
        if len(shards) >= self.batch_size:  # full: keep what this spread of shards needed
            self.per_shard = max(self.base, most)
            return True
        if most >= self.per_shard:  # a shard has more than its share: take more of it, now
            self.per_shard = min(self.batch_size, self.per_shard * 2)
            return True
        self.per_shard = self.base
        return False


class ShardLeases:
    """The shards one dispatcher holds; ``refresh()`` every ``ttl / 4`` seconds or so.
    ``batch_size``: the claim's (default ``BATCH_SIZE``), which ``heads`` shares out."""

    def __init__(self, name: str, ttl: float, batch_size: int | None = None):
        self.name = name
        self.ttl = ttl
        self.owned: set[int] = set()
        self._ensured = False
        self.heads = ShardHeads(int(batch_size or conf.get("BATCH_SIZE")))
        self.floors = ShardFloors()
        self.mine = conf.shards_of(conf.db_alias())  # this database's shards (SHARD_DATABASES), else all 64

    @property
    def all(self) -> bool:
        return len(self.owned) == NUM_SHARDS

    def claim_params(self) -> dict:
        """Parameters of the claim statement: the shards held (``[-1]``, no shard, when none), the
        rows it may take from the head of each (``per_shard``, see :class:`ShardHeads`) and
        where each head starts (``floors``, see :class:`ShardFloors`)."""
        shards = sorted(self.owned) or [-1]
        return {"shards": shards, **self.heads.params(shards), **self.floors.params(shards)}

    def refresh(self) -> set[int]:
        """Say we are alive, renew, then take or give back shards toward a fair share."""
        live = db.run("heartbeat_dispatcher", {"name": self.name, "ttl": self.ttl,
                                              "shards": json.dumps(sorted(self.owned))}, fetch="one").alive
        target = math.ceil(len(self.mine) / max(1, live))
        owned = {r.shard for r in db.run("renew_shards", {"name": self.name, "ttl": self.ttl})}
        if len(owned) > target:
            extra = sorted(owned)[target:]
            db.run("release_shards", {"name": self.name, "shards": extra}, fetch="count")
            owned -= set(extra)
        elif len(owned) < target:
            if not self._ensured:
                db.run("ensure_shards", {"shards": self.mine}, fetch="count")
                self._ensured = True
            got = db.run("acquire_shards", {"name": self.name, "ttl": self.ttl, "n": target - len(owned),
                                            "shards": self.mine})
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

    def __init__(self, batch_size: int | None = None):
        self.owned = set(conf.shards_of(conf.db_alias()))  # every shard of this database
        self.all = len(self.owned) == NUM_SHARDS
        self.heads = ShardHeads(int(batch_size or conf.get("BATCH_SIZE")))
        self.floors = ShardFloors()

    def claim_params(self) -> dict:
        shards = sorted(self.owned)
        return {"shards": shards, **self.heads.params(shards), **self.floors.params(shards)}

    def refresh(self) -> set[int]:
        return self.owned

    def release_all(self) -> None:
        pass
