"""The fault schedule: a pure function of the seed, the run length, the nodes and the fault kinds."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

NODE_KINDS = ("kill", "stop", "clock", "partition_pg", "partition_broker")
SERVER_KINDS = {"pg_restart": "pg", "failover": "pg", "broker_restart": "broker"}
ALL_KINDS = ("kill", "stop", "pg_restart", "broker_restart", "clock", "partition_pg", "partition_broker", "failover")
# Scenarios, "kind" or "kind:role" (role: worker or dispatcher): what a run must contain to reach every
# promise's main scenario (docs/faults.md, "Nemesis"). A short run schedules these first.
REQUIRED = ("stop:worker", "kill:worker", "partition_pg:worker", "pg_restart", "failover", "broker_restart",
            "kill:dispatcher", "stop:dispatcher", "partition_broker:dispatcher", "clock")
# The faults with bounds of their own (docs/guarantees.md): a dispatcher stalled inside its claim
# transaction, the database host's clock stepped, a worker's link to PostgreSQL slowed. Not in
# ALL_KINDS (the seeds' schedules stay as they were): --kinds names them, "all" is every kind.
BOUND_KINDS = ("claim_stall", "db_clock", "slow_link")
# With the shards on two clusters (run(databases=2)): the second cluster's primary crashed and
# restarted. Only a two-cluster run schedules it; REQUIRED_SHARDED is what such a run covers.
SHARDED_KINDS = ("pg2_restart",)
REQUIRED_SHARDED = REQUIRED + SHARDED_KINDS
EVERY_KIND = ALL_KINDS + BOUND_KINDS + SHARDED_KINDS
ONLY_ON = {"claim_stall": "d", "slow_link": "w"}  # node kinds for dispatchers or workers only
SERVER_KINDS["db_clock"] = "pg"
SERVER_KINDS["pg2_restart"] = "pg2"
SLOW_LINK_DELAY = 0.3  # seconds a chunk waits, each way (the review's figure)
# The kinds a two-cluster run leaves out: their proxies and faked clock are the first cluster's alone
# (the checker would read the second's times through the first's clock).
SINGLE_CLUSTER_KINDS = ("db_clock", "slow_link")


def unavailable(kind: str, databases: int) -> str:
    """Why ``kind`` cannot run with ``databases`` clusters ('' when it can)."""
    if kind in SHARDED_KINDS and databases < 2:
        return "one database (--databases 2 adds the second cluster)"
    if kind in SINGLE_CLUSTER_KINDS and databases > 1:
        return "single-cluster only"
    return ""


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
    if kind in ("pg_restart", "pg2_restart"):
        return rng.uniform(1.0, 6.0)
    if kind == "broker_restart":
        return rng.uniform(1.0, 5.0)
    return 0.0  # failover


def role(target: str) -> str:
    """``worker``, ``dispatcher``, or the server's own name (``pg``, ``broker``)."""
    return {"w": "worker", "d": "dispatcher"}.get(target[:1], target)


def scenario(kind: str, target: str) -> str:
    """The scenario a fault is: ``kind:role`` for a node fault, ``kind`` for a server fault."""
    return kind if kind in SERVER_KINDS else f"{kind}:{role(target)}"


def covers(faults, want) -> list[str]:
    """The scenarios of ``want`` that no fault of ``faults`` (``Fault``s or fault records) is."""
    have = {scenario(f.kind, f.target) if isinstance(f, Fault) else scenario(f["kind"], f["target"]) for f in faults}
    return [w for w in want if w not in have and not (":" not in w and any(h.split(":")[0] == w for h in have))]


def make_schedule(seed: int, minutes: float, nodes: list[str], kinds: list[str], gap: tuple[float, float] = (4.0, 9.0),
                  warmup: float = 6.0, leases: float = 6.0, cover: tuple[str, ...] = (),
                  first: tuple[str, ...] = ()) -> list[Fault]:
    """One fault every ``gap`` seconds over ``minutes``; a node or server is never hurt twice at once.

    A failover keeps PostgreSQL busy for 30 s (the new standby's base backup), so nothing else
    touches PostgreSQL meanwhile. ``cover``: scenarios (:data:`REQUIRED`) scheduled first, in a
    seeded order, each as soon as its target is free; those also in ``first`` before the others (a
    failover early enough that a restart of PostgreSQL still fits after it in a short run). Same
    arguments, same schedule.
    """
    rng = random.Random(seed)
    todo = [c for c in cover if c.split(":")[0] in kinds]
    rng.shuffle(todo)
    todo.sort(key=lambda c: c not in first)
    free_at: dict[str, float] = {}
    out: list[Fault] = []
    t = warmup
    end = minutes * 60.0 - 4.0
    while t < end:
        want = _next_scenario(todo, nodes, free_at, t)
        kind = want.split(":")[0] if want else rng.choice(kinds)
        duration = _duration(rng, kind, leases)
        if kind in SERVER_KINDS:
            candidates = [SERVER_KINDS[kind]]
        else:
            candidates = [n for n in nodes if n.startswith(ONLY_ON.get(kind, ""))
                          and (not want or ":" not in want or role(n) == want.split(":")[1])]
        candidates = [c for c in candidates if free_at.get(c, 0.0) <= t]
        if want and candidates:
            todo.remove(want)
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


def _next_scenario(todo: list[str], nodes: list[str], free_at: dict[str, float], t: float) -> str | None:
    """The first scenario still to cover whose target is free at ``t`` (None: draw at random)."""
    for want in todo:
        kind, _, r = want.partition(":")
        targets = [SERVER_KINDS[kind]] if kind in SERVER_KINDS else [n for n in nodes if not r or role(n) == r]
        if any(free_at.get(c, 0.0) <= t for c in targets):
            return want
    return None
