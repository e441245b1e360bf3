"""The fault schedule: a pure function of the seed, the run length, the nodes and the fault kinds."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

NODE_KINDS = ("kill", "stop", "clock", "partition_pg", "partition_broker")
SERVER_KINDS = {"pg_restart": "pg", "failover": "pg", "broker_restart": "broker"}
ALL_KINDS = ("kill", "stop", "pg_restart", "broker_restart", "clock", "partition_pg", "partition_broker", "failover")
# The faults with bounds of their own (docs/guarantees.md): a dispatcher stalled inside its claim
# transaction, the database host's clock stepped, a worker's link to PostgreSQL slowed. Not in
# ALL_KINDS (the seeds' schedules stay as they were): --kinds names them, "all" is every kind.
BOUND_KINDS = ("claim_stall", "db_clock", "slow_link")
EVERY_KIND = ALL_KINDS + BOUND_KINDS
ONLY_ON = {"claim_stall": "d", "slow_link": "w"}  # node kinds for dispatchers or workers only
SERVER_KINDS["db_clock"] = "pg"
SLOW_LINK_DELAY = 0.3  # seconds a chunk waits, each way (the review's figure)


@dataclass
class Fault:
    at: float  # seconds after the workload started
    kind: str
    target: str  # a node name, "pg" or "broker"
    duration: float  # seconds until healed (failover: until a new standby streams, not chosen)
    offset: float = 0.0  # clock faults: the fake clock's offset, seconds

    def describe(self) -> str:
        extra = f" offset {self.offset:+.0f}s" if self.kind in ("clock", "db_clock") else ""
        return f"t={self.at:6.1f}s  {self.kind:<16} {self.target:<6} for {self.duration:4.1f}s{extra}"

    def as_dict(self) -> dict:
        return asdict(self)


def _duration(rng: random.Random, kind: str, leases: float) -> float:
    if kind == "kill":
        return rng.uniform(0.5, 4.0)  # down until the supervisor restarts it
    if kind == "stop":
        return rng.uniform(leases + 1.0, leases + 8.0)  # longer than every lease
    if kind == "clock":
        return rng.uniform(10.0, 25.0)
    if kind.startswith("partition"):
        return rng.uniform(4.0, 12.0)
    if kind == "claim_stall":
        return rng.uniform(leases + 1.0, leases + 14.0)  # well past the shard lease
    if kind in ("db_clock", "slow_link"):
        return rng.uniform(10.0, 25.0)
    if kind == "pg_restart":
        return rng.uniform(1.0, 6.0)
    if kind == "broker_restart":
        return rng.uniform(1.0, 5.0)
    return 0.0  # failover


def make_schedule(seed: int, minutes: float, nodes: list[str], kinds: list[str], gap: tuple[float, float] = (4.0, 9.0),
                  warmup: float = 6.0, leases: float = 6.0) -> list[Fault]:
    """One fault every ``gap`` seconds over ``minutes``; a node or server is never hurt twice at once.

    A failover keeps PostgreSQL busy for 30 s (the new standby's base backup), so nothing else
    touches PostgreSQL meanwhile. Same arguments, same schedule.
    """
    rng = random.Random(seed)
    free_at: dict[str, float] = {}
    out: list[Fault] = []
    t = warmup
    end = minutes * 60.0 - 4.0
    while t < end:
        kind = rng.choice(kinds)
        duration = _duration(rng, kind, leases)
        if kind in SERVER_KINDS:
            candidates = [SERVER_KINDS[kind]]
        else:
            candidates = [n for n in nodes if n.startswith(ONLY_ON.get(kind, ""))]
        candidates = [c for c in candidates if free_at.get(c, 0.0) <= t]
        target = rng.choice(candidates) if candidates else None
        offset = rng.choice((-3600.0, 3600.0)) if kind == "clock" else 0.0
        if kind == "db_clock":  # a step of the database host's clock, either way
            offset = round(rng.choice((-1.0, 1.0)) * rng.uniform(15.0, 45.0))
        if target is not None:
            busy = 30.0 if kind == "failover" else duration + 1.0
            free_at[target] = t + busy
            out.append(Fault(round(t, 2), kind, target, round(duration, 2), offset))
        t += rng.uniform(*gap)
    return out
