"""Where the claim starts reading each shard: a floor on ``fire_at``, carried between claims.

A claimed job leaves its pending version in the (shard, fire_at) index until vacuum removes
it, and while any transaction older than the claim is open (a long report, a session left
idle in a transaction) PostgreSQL can neither remove it nor mark it dead. A claim that starts
at the beginning of a shard's due rows re-reads every job claimed since that transaction
began: its cost grows with the transaction's age (3M rows after 5 minutes at 10,000 jobs/s),
not with the batch. Starting at its floor, it re-reads the last ``margin`` seconds of claims.

A floor can pass over a row written below it after the claim that set it: a job scheduled
into the past, a reaped run that keeps its expiring ``fire_at``, a row another transaction
held locked. :class:`FloorProbe` looks for such rows from a thread of its own and lowers the
floors over them; where no probe runs (a dispatcher stepped by Celery beat, tools, tests) a
claim with no floor at all does it every ``sweep`` seconds instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import ClassVar

from django.db import connections

from cron_at_scale import sql as db
from cron_at_scale.maintenance.loop import CONNECTION_ERRORS, Loop

log = logging.getLogger(__name__)


class ShardFloors:
    """A lower bound on ``fire_at`` per held shard (``floors``; none: read from the start).

    After a claim that took rows of a shard, its floor is the latest ``fire_at`` taken there
    (its unclaimed due rows come after it: each shard's head is read in ``fire_at`` order), but
    never later than ``margin`` seconds before the claim's database time (a job scheduled for
    "now" by a transaction that began up to ``margin`` seconds ago stays above it), nor later
    than the old ``fire_at`` of a recurring job taken there (its next occurrence comes after
    it). A shard that gave no row keeps its floor.

    Rows a floor passed over are found by a :class:`FloorProbe` (``probing``: its thread runs)
    or, without one, by a claim with no floor every ``sweep`` seconds, and also after a
    wake-up notification, a change of held queues or a reaper pass (``reset``). Either way a
    search that re-reads what vacuum has not removed grows behind a transaction held open, so
    the next one waits ``seconds / share`` (at most ``max_sweep``) instead of ``sweep``: it
    takes at most ``share`` of the time, and a row below a floor waits at most ``max_sweep``
    seconds more. A due job scheduled for now or later is never held back. Thread-safe: the
    dispatcher's loop claims and learns, the probe lowers.
    """

    def __init__(self, margin: float = 2.0, sweep: float = 5.0, max_sweep: float = 60.0, share: float = 0.05):
        self.margin = timedelta(seconds=margin)
        self.sweep = sweep
        self.max_sweep = max_sweep
        self.share = share
        self.floors: dict[int, datetime] = {}
        self.probing = False
        self._lock = threading.Lock()
        self._used: dict[int, datetime] = {}  # the floors the last claim was given
        self._swept: float | None = None  # monotonic time of the last claim with no floor
        self._sweeping = False  # the next claim learnt from is a sweep
        self._slow = 0.0  # seconds between searches that the last one's duration asks for

    @property
    def interval(self) -> float:
        """Seconds from one search for rows below the floors (a sweep, a probe) to the next."""
        return max(self.sweep, self._slow)

    def took(self, seconds: float) -> None:
        """A search for rows below the floors took ``seconds``: space out the next one."""
        self._slow = min(self.max_sweep, seconds / self.share)

    def params(self, shards: list[int]) -> dict:
        """The claim's ``floors``: one per shard of ``shards``, ``None`` where there is none."""
        if not self.probing and (self._swept is None or time.monotonic() - self._swept >= self.interval):
            self.reset()
        with self._lock:
            self._used = dict(self.floors)
            return {"floors": [self.floors.get(s) for s in shards]}

    def reset(self) -> None:
        """Let the next claim read every shard from the start of its due rows."""
        with self._lock:
            self.floors.clear()
            self._swept = time.monotonic()
            self._sweeping = not self.probing

    def learn(self, rows, db_now: datetime | None, seconds: float | None = None) -> None:
        """Move the floors after a claim; ``rows``: the claimed rows (``shard``, ``fire_at``,
        ``schedule_type``), ``db_now``: the claim's database time (aware UTC), ``seconds``: how
        long the claim statement took. A floor lowered (or cleared) since the claim was given
        it stays so: the claim did not look below the old one."""
        if self._sweeping and seconds is not None:
            self._sweeping = False
            self.took(seconds)
        if not rows or db_now is None:
            return
        cap = db_now - self.margin
        top: dict[int, datetime] = {}
        for r in rows:
            top[r.shard] = max(top.get(r.shard, r.fire_at), r.fire_at)
        for r in rows:
            if r.schedule_type != "once":
                top[r.shard] = min(top[r.shard], r.fire_at)
        with self._lock:
            for shard, fire_at in top.items():
                if self.floors.get(shard) == self._used.get(shard):
                    self.floors[shard] = min(fire_at, cap)

    def held(self) -> tuple[list[int], list[datetime]]:
        """The shards that have a floor, and their floors."""
        with self._lock:
            return list(self.floors), list(self.floors.values())

    def lower(self, found: dict[int, datetime]) -> None:
        """Lower floors to rows found below them (``shard: fire_at``)."""
        with self._lock:
            for shard, fire_at in found.items():
                if shard in self.floors and fire_at < self.floors[shard]:
                    self.floors[shard] = fire_at


class FloorProbe(Loop):
    """A thread of the dispatcher, on a database connection of its own, that finds due rows
    below the floors (``floor_probe``: the first one of each shard, no lock taken) every
    ``floors.interval`` seconds and lowers the floors to them; the next claim takes them.
    ``held``: the claim's held-queue parameters (rows the claim would skip are not looked for).

    It takes the shape of the maintenance loops (:class:`~cron_at_scale.maintenance.loop.Loop`)
    but keeps its thread: ``run_once()`` is one search (``probe``), ``interval`` is the floors'
    (``sweep`` seconds, longer while a search is slow), and the thread, not the dispatcher's
    loop, calls ``run_pass()`` every ``interval`` seconds under the loops' error policy: a
    database connection error is the thread's to handle (logged, the connection reset), any
    other is logged; the next search comes after the interval either way.
    """

    name = "floor probe"
    idle: ClassVar[dict[int, datetime]] = {}  # returned after a failed search: nothing found (not to be changed)

    def __init__(self, floors: ShardFloors, held: Callable[[], dict]):
        super().__init__()  # its interval is the floors'
        self.floors = floors
        self.held = held
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def interval(self) -> float:  # type: ignore[override]  # read-only: the floors decide
        """Seconds between two searches: the floors' (see :attr:`ShardFloors.interval`)."""
        return self.floors.interval

    def start(self) -> None:
        if self.thread is None:
            self.stopping.clear()
            self.floors.probing = True
            self.thread = threading.Thread(target=self._loop, name="cron_at_scale-floors", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        if self.thread is not None:
            self.stopping.set()
            self.thread.join()
            self.thread = None
            self.floors.probing = False

    def probe(self) -> dict[int, datetime]:
        """One search; returns what it found (``shard: fire_at``) after lowering the floors."""
        shards, floors = self.floors.held()
        if not shards:
            return {}
        t0 = time.monotonic()
        rows = db.run("floor_probe", {"shards": shards, "floors": floors, **self.held()}, retries=0)
        self.floors.took(time.monotonic() - t0)
        found = {r.shard: r.fire_at for r in rows}
        self.floors.lower(found)
        return found

    def run_once(self) -> dict[int, datetime]:
        return self.probe()

    def _loop(self) -> None:
        try:
            while not self.stopping.wait(self.interval):
                try:
                    self.run_pass()
                except CONNECTION_ERRORS as e:
                    log.warning("floor probe: database unavailable (%s)", str(e).strip()[:200])
                    db.reset_connection()
        finally:
            connections.close_all()  # this thread's own
