"""The workload of a nemesis run: jobs inserted every second, cancels at random times.

Jobs are written straight into the Job table (the columns ``schedule()``
writes) as ``tests/faults/faultkit.py`` does. What was scheduled and every
cancel that committed is appended to ``workload.jsonl`` in the run directory,
outside the jobs' database: the checker's record of intent.

With a second database (``second_url``: shards 32-63, ``tests.settings_sharded``) each job is
inserted on its shard's database, each database's rows of a tick in a transaction of their own,
and a cancel goes to its job's database; the two crons are one on each.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psycopg2
import psycopg2.extras

from cron_at_scale.sql import QUERIES

# What each kind schedules: (task, kwargs, max_retries).
KINDS = {
    "now": ("demo.ledger.record", {}, 3),
    "delayed": ("demo.ledger.record", {}, 3),
    "retry": ("demo.ledger.fail_then_ok", {"times": 2}, 3),
    "always_fail": ("demo.ledger.always_fail", {}, 2),
    "long": ("demo.ledger.long", {"seconds": 8}, 3),
    "cancel": ("demo.ledger.record", {}, 3),
}
CRONS = {"cron2": "*/2 * * * * *", "cron1": "* * * * * *"}
HALF = 32  # shards 0-31 on the first database, 32-63 on the second (tests/settings_sharded.py)


def database_of(job: str) -> int:
    """0: the first database, 1: the second (with two); the shard is the id's low 6 bits."""
    return int(int(uuid.UUID(job)) & 63 >= HALF)


class Workload:
    def __init__(self, db_url: str, run_dir: Path, seed: int, second_url: str | None = None):
        self.db_urls = [db_url] + ([second_url] if second_url else [])
        self.path = run_dir / "workload.jsonl"
        self.rng = random.Random(seed + 1)
        self.conns: list = [None] * len(self.db_urls)
        self.cancels: list[tuple[float, str]] = []  # (real time to cancel at, job id)
        self.cron_ids: list[str] = []
        self.ticks = self.skipped = 0
        self.per_tick = 3  # one-off jobs due now, per second
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _log(self, **rec) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def _db(self, job: str) -> int:
        return database_of(job) if len(self.db_urls) > 1 else 0

    def _cursor(self, db: int = 0):
        if self.conns[db] is None or self.conns[db].closed:
            self.conns[db] = psycopg2.connect(self.db_urls[db])
        return self.conns[db].cursor()

    def _reset(self, db: int = 0):
        try:
            self.conns[db].close()
        except Exception:  # noqa: BLE001
            pass
        self.conns[db] = None

    def _insert(self, specs: list[tuple[str, float]]) -> None:
        """Insert ``(kind, seconds from now)`` jobs, each database's in one transaction; log them once it committed."""
        rows = []
        for kind, off in specs:
            task, kw, max_retries = KINDS[kind]
            rows.append((str(uuid.uuid4()), kind, float(off), task, json.dumps({"args": [], "kwargs": kw}), max_retries))
        for db in range(len(self.db_urls)):
            mine = [r for r in rows if self._db(r[0]) == db]
            if mine:
                self._insert_on(db, mine)

    def _insert_on(self, db: int, rows: list[tuple]) -> None:
        try:
            with self._cursor(db) as cur:
                cur.execute("SELECT statement_timestamp()")
                (now,) = cur.fetchone()
                psycopg2.extras.execute_values(cur, """
                    INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, task, payload, options, status, max_retries)
                    VALUES %s""", [(r[0], "once", now + timedelta(seconds=r[2]), r[3], r[4], "{}", "pending", r[5])
                                   for r in rows])
            self.conns[db].commit()
        except psycopg2.Error as e:
            self._reset(db)
            self.skipped += 1
            # The commit may have happened: the checker accepts these jobs whether or not they exist.
            self._log(ev="ambiguous", jobs=[r[0] for r in rows], error=str(e)[:200])
            return
        base = now.timestamp()
        for r in rows:
            self._log(ev="job", job=r[0], kind=r[1], fire_at=base + r[2], max_retries=r[5])
            if r[1] == "cancel":
                self.cancels.append((time.time() + self.rng.uniform(0.0, r[2] + 3.0), r[0]))

    def add_crons(self) -> None:
        for i, (kind, expr) in enumerate(CRONS.items()):
            job = str(uuid.uuid4())
            while len(self.db_urls) > 1 and database_of(job) != i:  # cron2 on the first, cron1 on the second
                job = str(uuid.uuid4())
            db = self._db(job)
            step = 2 if expr.startswith("*/2") else 1
            with self._cursor(db) as cur:
                cur.execute("""
                    INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, cron_expr, timezone, task, payload, options,
                                                   status, overlap, catchup)
                    VALUES (%s, 'cron', to_timestamp((floor(extract(epoch FROM statement_timestamp()) / %s) + 2) * %s),
                            %s, 'UTC', 'demo.ledger.record', '{"args": [], "kwargs": {}}', '{}', 'pending', 'allow', 'all')
                    RETURNING extract(epoch FROM fire_at)""", (job, step, step, expr))
                (first,) = cur.fetchone()
            self.conns[db].commit()
            self.cron_ids.append(job)
            self._log(ev="job", job=job, kind=kind, fire_at=float(first), step=step, max_retries=3)

    def cancel(self, job: str) -> bool | None:
        """Run the cancel statement; log the real time right after its commit. None: not done (database down)."""
        db = self._db(job)
        try:
            with self._cursor(db) as cur:
                cur.execute(QUERIES["cancel"], {"job_id": job})
                done = cur.fetchone() is not None
            self.conns[db].commit()
        except psycopg2.Error:
            self._reset(db)
            return None
        self._log(ev="cancel", job=job, cancelled=done, wall=time.time())
        return done

    def _tick(self, k: int) -> None:
        specs = [("now", self.rng.uniform(0.0, 1.0)) for _ in range(self.per_tick)]
        specs.append(("delayed", self.rng.uniform(3.0, 30.0)))
        if k % 3 == 0:
            specs.append(("retry", self.rng.uniform(0.0, 5.0)))
            specs.append(("cancel", self.rng.uniform(2.0, 12.0)))
        if k % 4 == 0:
            specs.append(("long", self.rng.uniform(0.0, 3.0)))
        if k % 5 == 0:
            specs.append(("always_fail", self.rng.uniform(0.0, 3.0)))
        self._insert(specs)
        now = time.time()
        due = [c for c in self.cancels if c[0] <= now]
        for c in due:
            if self.cancel(c[1]) is not None:
                self.cancels.remove(c)

    def _loop(self) -> None:
        k = 0
        t0 = time.monotonic()
        while not self._stop.is_set():
            self._tick(k)
            k += 1
            self.ticks = k
            self._stop.wait(max(0.0, t0 + k - time.monotonic()))

    def start(self) -> None:
        self.add_crons()
        self._thread = threading.Thread(target=self._loop, name="workload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        for _, job in list(self.cancels):  # what is left is cancelled now
            while self.cancel(job) is None:
                time.sleep(0.5)
        self.cancels.clear()

    def cancel_crons(self) -> None:
        for job in self.cron_ids:
            while self.cancel(job) is None:
                time.sleep(0.5)
