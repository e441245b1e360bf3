"""The steady-state soak: a stream of due jobs held for minutes beside N pending ones.

    python bench/soak.py --pending 10000000 --rate 10000 --minutes 10
    python bench/soak.py --pending 100000 --rate 2000 --minutes 1              # a quick check
    python bench/soak.py --scenario blocked-vacuum --pending 10000000 --minutes 10
    python bench/soak.py --scenario dead-dispatcher --pending 1000000 --minutes 2
    python bench/soak.py --scenario workers --pending 100000 --rate 300 --minutes 1
    python bench/soak.py --scenario recurring --recurring 200000
    python bench/soak.py --draw a.json b.json c.json --png-dir docs      # the PNGs from saved runs

Scenarios:

steady           ``--pending`` future jobs (a day to a month ahead) bulk-loaded as bench/run.py's
                 W3 does (``schedule_many`` for the first 200,000, then ``INSERT ... SELECT
                 generate_series`` with the secondary indexes rebuilt after it), then a feeder
                 process inserts, with ``schedule_many`` (COPY), ``--rate`` jobs per second of
                 fire time spread evenly, ``--lead`` seconds ahead of them, for ``--minutes``.
                 One ``manage.py cron_dispatcher`` fires them to Redis; a consumer process
                 takes the messages off the broker as fast as they come (``BRPOP`` then
                 ``RPOP`` of up to 5,000), so no worker's speed enters the figures.
blocked-vacuum   the same, with a transaction (``BEGIN ISOLATION LEVEL REPEATABLE READ``, a
                 snapshot and ``txid_current()``, then idle) held open in another connection for
                 ``--block-minutes`` in the middle.
lifecycle        the blocked-vacuum run with each job's whole life in PostgreSQL: the consumer
                 starts and finishes every message it takes with the workers' own statement
                 (``start_attempt``, which also carries the previous one's success), all of a
                 batch in one transaction (standing in for Celery workers, whose speed is not
                 measured here), and ``RETENTION`` of ``--retention`` seconds, so that the
                 dispatcher's purge deletes finished jobs at the fire rate throughout; with
                 ``--history-after`` they move to the partitioned history instead
                 (``HISTORY_AFTER``, ``--history-partition``) and ``RETENTION`` drops its partitions.
dead-dispatcher  two dispatchers sharing the 64 shards; one is killed -9 in the middle: the
                 lateness of its shards' jobs until the other takes them over.
workers          the same stream fired to real ``celery worker`` processes (``--workers``, a
                 lower ``--rate``): start lateness from the attempt log (database clock).
recurring        ``--recurring`` idle recurring jobs (daily and weekly cron) in the table or not,
                 in turns (``--rounds`` each): firing ``--due`` due jobs, and ``cancel``,
                 ``pause`` and a new ``schedule``, each timed with and without them.

Dispatch lateness = (the message on the broker) - fire_at. fire_at is database time
(``statement_timestamp()`` arithmetic, written by the feeder) and travels in the message's
``cron_at_scale`` header; the consumer stamps each message with ``time.time()``
(CLOCK_REALTIME) right after the Redis call that took it returns. The database, the
dispatcher and the consumer run on this one host, so both ends read the same clock. The
stamp is an upper bound of the moment the message reached the broker: it adds the
consumer's own delay (the Redis round trip and the parsing of the previous batch, about
a few ms at 10,000 messages/s). The dispatcher claims up to ``LOOKAHEAD`` (1 s) early and
publishes at fire_at from a timer, so a lateness is never negative except by that clock's
resolution.

Every 10 s (``--every``) and overall: lateness p50/p95/p99/max by fire time; jobs fired; WAL
bytes (``pg_current_wal_lsn()``; with ``pg_walinspect``, split by resource manager and full
page images); the job and attempt tables' heap and index sizes, live and dead tuples,
autovacuum runs, HOT share of updates (``pg_stat_user_tables``); CPU seconds per second of
each process from /proc/<pid>/stat (utime + stime): the dispatcher(s), the feeder, the
consumer, redis-server, this database's backends, autovacuum (live workers, plus the
exited children the postmaster reaped: its cutime + cstime) and PostgreSQL's background
processes. Use a private PostgreSQL cluster (``DATABASE_URL`` on its own port) for WAL and
PostgreSQL CPU figures that are yours alone: on a shared server both count the other
databases' work too. The soak TRUNCATEs the job tables: never point it at a database you
care about.

Prints a table on stderr and one JSON line on stdout (``--out`` also writes it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "example_project"), str(ROOT / "bench")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
os.environ.setdefault("CRON_AT_SCALE_DATA_DIR", str(ROOT / ".demo-data"))

import run as benchrun  # noqa: E402  (bench/run.py: the W3 load, /proc readers)

TASK = benchrun.TASK
QUEUE = "celery"
RECEIVED = "soak:received"  # the consumer's running count (a Redis key), read by the orchestrator
SCENARIOS = ("steady", "blocked-vacuum", "dead-dispatcher", "workers", "recurring", "lifecycle")
FINISHED = "soak:finished"  # lifecycle: attempts the consumer started and finished (a Redis key)
CPU_KEYS = ("dispatcher", "feeder", "consumer", "broker", "pg_backends", "autovacuum", "pg_aux", "workers", "bench")
TABLES = ("cron_at_scale_job", "cron_at_scale_jobattempt")
# Every table a fire, a batch or a heartbeat updates in place: the single-row counters and leases
# whose dead versions pile up while a held-open transaction keeps vacuum from reclaiming them.
SMALL_TABLES = {"cron_at_scale_shardlease": "shardlease", "cron_at_scale_dispatcherheartbeat": "dispatcherheartbeat",
                "cron_at_scale_workerhealth": "workerhealth"}
WAIT_KEYS = ("dispatcher", "pg_backends", "feeder", "consumer")  # their time runnable but waiting for a CPU too


def run_delay(pid: int) -> float:
    """Seconds process ``pid`` spent runnable, waiting for a CPU (/proc/<pid>/schedstat); 0.0 when unknown."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
say = benchrun.say


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--scenario", choices=SCENARIOS, default="steady")
    p.add_argument("--pending", type=int, default=100_000, help="future jobs in the table (100000)")
    p.add_argument("--rate", type=int, default=10_000, help="due jobs per second of the stream (10000)")
    p.add_argument("--minutes", type=float, default=1.0, help="minutes of stream (1)")
    p.add_argument("--lead", type=float, default=3.0, help="seconds the feeder inserts ahead of fire time (3)")
    p.add_argument("--every", type=float, default=10.0, help="seconds per row of the time series (10)")
    p.add_argument("--after", type=float, default=60.0, help="seconds sampled after the stream ends (60)")
    p.add_argument("--block-minutes", type=float, help="blocked-vacuum: minutes the transaction stays open "
                   "(default 5, at most half the stream)")
    p.add_argument("--batch-size", type=int, help="dispatcher batch size (default: the setting, 1000)")
    p.add_argument("--retention", type=float, default=60.0,
                   help="lifecycle: RETENTION seconds, finished jobs purged after this (60)")
    p.add_argument("--history-after", type=float,
                   help="lifecycle: HISTORY_AFTER seconds, finished jobs move to the partitioned history after "
                        "this, and RETENTION drops its partitions (default: off, RETENTION deletes rows)")
    p.add_argument("--history-partition", type=float, default=60.0,
                   help="lifecycle with --history-after: HISTORY_PARTITION seconds (60)")
    p.add_argument("--lifecycle", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--autovacuum-scale-factor", type=float, help="the job table's autovacuum_vacuum_scale_factor "
                   "for this run (default: PostgreSQL's, 0.2)")
    p.add_argument("--workers", type=int, default=2, help="workers scenario: celery worker processes (2)")
    p.add_argument("--concurrency", type=int, default=1, help="workers scenario: prefork children each (1)")
    p.add_argument("--recurring", type=int, default=200_000, help="recurring scenario: idle cron jobs (200000)")
    p.add_argument("--rounds", type=int, default=3, help="recurring scenario: rounds with and without (3)")
    p.add_argument("--due", type=int, default=10_000, help="recurring scenario: due jobs fired per round (10000)")
    p.add_argument("--ops", type=int, default=300, help="recurring scenario: cancel/pause/schedule calls per round (300)")
    p.add_argument("--reuse", action="store_true", help="keep the loaded table when it already holds --pending "
                   "future jobs and nothing else (skips a 10M load)")
    p.add_argument("--load-only", action="store_true", help="load --pending future jobs, then exit (a template "
                   "database to copy for each run: CREATE DATABASE run TEMPLATE loaded STRATEGY file_copy)")
    p.add_argument("--label", help="name of this run in the table and the PNG")
    p.add_argument("--png-dir", default=str(ROOT / "bench" / "results"), help="where the PNGs go")
    p.add_argument("--out", help="also write the JSON line to this file")
    p.add_argument("--draw", nargs="+", metavar="JSON", help="only draw the PNGs from these saved runs (--out files)")
    p.add_argument("--role", choices=("feeder", "consumer"), help=argparse.SUPPRESS)
    p.add_argument("--base", type=float, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.block_minutes is None:
        args.block_minutes = min(5.0, args.minutes / 2)
    return args


def pct(values, qs=(50, 95, 99)) -> dict:
    """p50/p95/p99/max (ms, 1 decimal) and n of ``values`` (a numpy array of ms)."""
    import numpy as np

    if len(values) == 0:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    ps = np.percentile(values, qs)
    out = {"n": int(len(values))}
    out.update({f"p{q}": round(float(v), 1) for q, v in zip(qs, ps, strict=True)})
    out["max"] = round(float(values.max()), 1)
    return out


# -- the feeder and the consumer (child processes) ---------------------------------------------


def feeder(args) -> int:
    """Insert ``--rate`` jobs per second of fire time from ``--base`` (epoch seconds) for
    ``--minutes``, each second's jobs ``--lead`` seconds before the first of them is due."""
    import django

    django.setup()
    import cron_at_scale
    from cron_at_scale.celery_app import get_app

    get_app().loader.import_default_modules()
    seconds = int(round(args.minutes * 60))
    inserted, late, slowest = 0, 0, 0.0
    ahead = []  # seconds each second's jobs were committed before the first of them was due
    for k in range(seconds):
        start = args.base + k
        wait = start - args.lead - time.time()
        if wait > 0:
            time.sleep(wait)
        t0 = time.time()
        base = datetime.fromtimestamp(start, timezone.utc)
        cron_at_scale.schedule_many([{"task": TASK, "at": base + timedelta(microseconds=round(1e6 * j / args.rate))}
                                     for j in range(args.rate)])
        inserted += args.rate
        done = time.time()
        slowest = max(slowest, done - t0)
        ahead.append(start - done)
        if done > start - 1.0:  # committed after the dispatcher's look-ahead reached them: a late feeder
            late += 1
    ahead.sort()
    Path(args.result).write_text(json.dumps({
        "inserted": inserted, "late_seconds": late, "slowest_insert_s": round(slowest, 3),
        "committed_ahead_s": {"min": round(ahead[0], 3), "p1": round(ahead[len(ahead) // 100], 3),
                              "p50": round(ahead[len(ahead) // 2], 3)} if ahead else None,
        "committed_after_due": sum(1 for x in ahead if x < 0)}))
    return 0


def redis_client(url: str):
    """A redis-py client for a Celery broker URL, through kombu, which also reads the embedded
    broker's ``redis+socket://`` URLs (as bench/run.py does)."""
    from kombu import Connection

    broker = Connection(url)
    broker.ensure_connection(max_retries=3)
    return broker.default_channel.client


def consumer(args) -> int:
    """Take messages off the broker as they come until SIGTERM; save (fire_at, lateness ms, shard) of each."""
    import numpy as np

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    client = redis_client(os.environ["CELERY_BROKER_URL"])
    fire_ats, lates, shards = [], [], []
    key_f, key_j, key_a = b'"fire_at": "', b'"job_id": "', b'"attempt": '
    parse = datetime.fromisoformat
    received = 0
    live = None
    if args.lifecycle:  # start and finish each message with the workers' statement, a batch per transaction
        import uuid

        import django

        django.setup()
        import queue
        import threading

        from django.db import transaction

        from cron_at_scale.worker.attempts import write

        # The database work on a thread of its own: the messages are stamped as they come off the
        # broker, not after the previous batch's statements (the stamp is the dispatcher's lateness).
        todo: queue.Queue = queue.Queue()

        def work():
            while True:
                pairs = todo.get()
                if pairs is None:
                    return
                while len(pairs) < 1000:
                    try:
                        more = todo.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        todo.put(None)
                        break
                    pairs += more
                done, finished = [], 0
                with transaction.atomic():
                    for jid, att in pairs:
                        row = write(jid, att, "soak-consumer", str(uuid.uuid4()), done)
                        finished += len(done)
                        done = [(jid, att)] if row is not None and row.outcome == "running" else []
                    if done:
                        write(None, 0, "", None, done)
                        finished += len(done)
                client.incrby(FINISHED, finished)

        worker = threading.Thread(target=work, name="soak-lifecycle")
        worker.start()

        def live(pairs):
            todo.put(pairs)
    try:
        while not stop:
            got = client.brpop(QUEUE, timeout=0.2)
            if got is None:
                continue
            batch = [got[1]]
            now = time.time()
            more = client.rpop(QUEUE, 999 if live is not None else 5000)  # lifecycle: short transactions
            if more:
                batch += more
                now2 = time.time()
            else:
                now2 = now
            f = np.empty(len(batch))
            s = np.empty(len(batch), dtype=np.int8)
            pairs = []
            for i, m in enumerate(batch):
                a = m.index(key_f) + len(key_f)
                f[i] = parse(m[a:m.index(b'"', a)].decode()).timestamp()
                b = m.index(key_j) + len(key_j)
                s[i] = (int(m[b + 28:b + 36], 16) & 0x7FFFFFFF) % 64  # the job's shard, as models.Job.shard
                if live is not None:
                    c = m.index(key_a) + len(key_a)
                    pairs.append((m[b:b + 36].decode(), int(m[c:m.index(b",", c)])))
            late = np.full(len(batch), now2)
            late[0] = now
            fire_ats.append(f)
            lates.append((late - f) * 1000.0)
            shards.append(s)
            received += len(batch)
            client.incrby(RECEIVED, len(batch))
            if live is not None:
                live(pairs)
    finally:
        if live is not None:
            todo.put(None)
            worker.join()
        client.close()

        def cat(xs, dt):
            return np.concatenate(xs) if xs else np.empty(0, dtype=dt)

        np.savez(args.result, fire_at=cat(fire_ats, float), late_ms=cat(lates, float), shard=cat(shards, np.int8))
    return 0


# -- the orchestrator ----------------------------------------------------------------------------


class Soak:
    def __init__(self, args):
        self.args = args
        self.connection, self.broker_url, self.app = benchrun.django_up()

        self.redis = redis_client(self.broker_url)
        (backend,), = self.q("SELECT pg_backend_pid()")
        self.backend = backend  # this process's own connection: its samples are not the dispatcher's load
        stat = benchrun.proc_stat(backend)
        self.postmaster = stat[0] if stat and "postgres" in stat[3] else None
        redis_pid = int(self.redis.info("server")["process_id"])
        stat = benchrun.proc_stat(redis_pid)
        self.redis_pid = redis_pid if stat and "redis" in stat[3] else None
        self.db = self.connection.settings_dict["NAME"]
        try:
            self.q("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            self.walinspect = True
        except Exception:  # not installed, or not allowed: the WAL total only
            self.walinspect = False
        self.children: dict[str, subprocess.Popen] = {}
        self.procs = None
        self.tmp = ROOT / "bench" / "results" / f"soak-{os.getpid()}"
        self.tmp.mkdir(parents=True, exist_ok=True)

    def q(self, sql: str, params=()):
        with self.connection.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def env(self, **settings) -> dict:
        from demo.runner import child_env, database_url

        return child_env(database_url(self.connection.settings_dict), self.broker_url,
                         CRON_AT_SCALE_SETTINGS=json.dumps(settings))

    # -- the table ---------------------------------------------------------------------------

    def load(self, n: int) -> dict:
        """``n`` future jobs and nothing else in the job tables (W3's bulk load); VACUUM ANALYZE."""
        if self.args.reuse:
            (total, future), = self.q("SELECT count(*), count(*) FILTER (WHERE status = 'pending' AND fire_at > "
                                      "statement_timestamp() + interval '1 hour') FROM cron_at_scale_job")
            if total == future == n:
                self.q("TRUNCATE cron_at_scale_jobattempt")
                self.q("VACUUM ANALYZE cron_at_scale_job")
                say(f"load: reusing {n:,} future jobs")
                return {"jobs": n, "seconds": 0.0, "reused": True}
        self.q("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_job")
        t0 = time.monotonic()
        if n:
            import cron_at_scale

            many = min(200_000, n)
            (now,), = self.q("SELECT statement_timestamp()")
            base = now + timedelta(days=1)
            for start in range(0, many, 50_000):
                cron_at_scale.schedule_many([{"task": TASK, "args": [i], "at": base + timedelta(milliseconds=i)}
                                             for i in range(start, min(many, start + 50_000))])
            benchrun.load_future_rows(self.q, base, many, n - many)
        self.q("VACUUM ANALYZE cron_at_scale_job")
        self.q("VACUUM ANALYZE cron_at_scale_jobattempt")
        s = time.monotonic() - t0
        say(f"load: {n:,} future jobs in {s:.0f}s")
        return {"jobs": n, "seconds": round(s, 1), "reused": False}

    # -- samples -----------------------------------------------------------------------------

    def cpu_now(self) -> dict[str, dict[int, float]]:
        """CPU seconds so far by group and pid; exited postgres children are in ``autovacuum`` under
        the postmaster's negated pid (its cutime + cstime)."""
        out: dict[str, dict[int, float]] = {k: {} for k in CPU_KEYS}
        roles = {p.pid: name for name, p in self.children.items()}
        workers = {p.pid for p in self.procs.procs} if self.procs else set()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = benchrun.proc_stat(pid)
            if stat is None:
                continue
            ppid, cpu, reaped, cmdline = stat
            if pid == self.backend or pid == os.getpid():
                out["bench"][pid] = cpu
            elif pid in roles:
                role = roles[pid]
                out["dispatcher" if role.startswith("dispatcher") else role][pid] = cpu
            elif pid in workers or ppid in workers:
                out["workers"][pid] = cpu + (reaped if pid in workers else 0.0)
            elif pid == self.redis_pid:
                out["broker"][pid] = cpu
            elif self.postmaster and pid == self.postmaster:
                out["pg_aux"][pid] = cpu
                out["autovacuum"][-pid] = reaped
            elif self.postmaster and ppid == self.postmaster:
                words = cmdline.split()
                if "autovacuum" in cmdline and "worker" in cmdline:
                    out["autovacuum"][pid] = cpu
                elif self.db in words:
                    out["pg_backends"][pid] = cpu
                elif not any("(" in w for w in words):
                    out["pg_aux"][pid] = cpu
        out["wait"] = {pid: run_delay(pid) for g in WAIT_KEYS for pid in out[g]}
        out["wait_group"] = {pid: g for g in WAIT_KEYS for pid in out[g]}  # type: ignore[misc]
        return out

    @staticmethod
    def cpu_delta(before: dict, after: dict, seconds: float) -> dict[str, float]:
        """CPU cores busy (CPU s per s) by group between two samples. A postgres child that exited in
        between moved into the postmaster's reaped total: its CPU seen before is taken off that."""
        out = {}
        for g in CPU_KEYS:
            total = sum(cpu - before[g].get(pid, 0.0) for pid, cpu in after[g].items())
            if g == "autovacuum":  # the reaped total holds every exited postgres child's whole life
                total -= sum(cpu for pg in ("autovacuum", "pg_backends", "pg_aux")
                             for pid, cpu in before[pg].items() if pid > 0 and pid not in after[pg])
            out[g] = round(total / seconds, 3) if seconds > 0 else 0.0
        out["total"] = round(sum(out.values()), 3)
        # runnable but waiting for a CPU, in CPUs (s per s): a share of the box other processes held
        waits: dict[str, float] = {}
        for pid, w in after.get("wait", {}).items():
            g = after["wait_group"][pid]
            waits[g] = waits.get(g, 0.0) + w - before.get("wait", {}).get(pid, 0.0)
        for g in WAIT_KEYS:
            out[f"wait_{g}"] = round(waits.get(g, 0.0) / seconds, 3) if seconds > 0 else 0.0
        return out

    def tables(self) -> dict:
        rows = self.q("""SELECT s.relname, pg_relation_size(s.relid), pg_indexes_size(s.relid), s.n_live_tup,
                                s.n_dead_tup, s.autovacuum_count, s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del,
                                s.last_autovacuum
                         FROM pg_stat_user_tables s WHERE s.relname = ANY(%s)""", [[*TABLES, *SMALL_TABLES]])
        # the history tables: the sums over their partitions (pg_partition_tree: PostgreSQL 12+)
        rows += self.q("""SELECT t.parent, sum(pg_relation_size(s.relid))::bigint, sum(pg_indexes_size(s.relid))::bigint,
                                 sum(s.n_live_tup)::bigint, sum(s.n_dead_tup)::bigint, sum(s.autovacuum_count)::bigint,
                                 sum(s.n_tup_ins)::bigint, sum(s.n_tup_upd)::bigint, sum(s.n_tup_hot_upd)::bigint,
                                 count(*)::bigint, max(s.last_autovacuum)
                          FROM (VALUES ('cron_at_scale_jobhistory'), ('cron_at_scale_attempthistory')) AS t(parent)
                          CROSS JOIN LATERAL pg_partition_tree(t.parent::regclass) AS p
                          JOIN pg_stat_user_tables s ON s.relid = p.relid
                          WHERE p.isleaf GROUP BY t.parent""")
        out = {}
        for name, heap, idx, live, dead, av, ins, upd, hot, dele, last in rows:
            if name.endswith("history"):  # "del" is the partitions' count here: nothing is deleted from them
                out[name.removeprefix("cron_at_scale_")] = {
                    "heap_bytes": heap, "index_bytes": idx, "live": live, "dead": dead, "autovacuum_count": av,
                    "ins": ins, "partitions": dele, "last_autovacuum": str(last) if last else None}
                continue
            out[SMALL_TABLES.get(name) or ("job" if name == TABLES[0] else "attempt")] = {
                "heap_bytes": heap, "index_bytes": idx, "live": live, "dead": dead, "autovacuum_count": av,
                "ins": ins, "upd": upd, "hot_upd": hot, "del": dele, "last_autovacuum": str(last) if last else None}
        return out

    def sample(self) -> dict:
        self.q("SELECT pg_stat_clear_snapshot()")
        (lsn, backlog, oldest), = self.q("""
            SELECT pg_current_wal_lsn()::text,
                   (SELECT count(*) FROM cron_at_scale_job WHERE status = 'pending' AND fire_at <= statement_timestamp()),
                   (SELECT extract(epoch FROM statement_timestamp() - min(fire_at)) FROM cron_at_scale_job
                    WHERE status = 'pending' AND fire_at <= statement_timestamp())""")
        if self.args.scenario == "workers":  # started by a worker (the soak's jobs only: the table held none before)
            (received,), = self.q("SELECT count(*) FROM cron_at_scale_jobattempt WHERE started_at IS NOT NULL")
        else:
            received = int(self.redis.get(RECEIVED) or 0)
        return {"t": time.time(), "lsn": lsn, "due_unclaimed": backlog, "oldest_due_s": float(oldest or 0.0),
                "broker_depth": self.redis.llen(QUEUE), "received": received,
                "finished": int(self.redis.get(FINISHED) or 0),
                "tables": self.tables(), "cpu": self.cpu_now()}

    def wal_bytes(self, a: str, b: str) -> int:
        (n,), = self.q("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", [b, a])
        return int(n)

    def wal_split(self, a: str, b: str) -> dict:
        """WAL bytes between two LSNs by resource manager, and full-page images (pg_walinspect)."""
        if not self.walinspect:
            return {}
        try:
            rows = self.q("""SELECT "resource_manager/record_type", count, record_size, fpi_size, combined_size
                             FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn, true) WHERE count > 0""", [a, b])
        except Exception as e:  # the WAL was recycled meanwhile, or no permission
            say(f"  pg_walinspect: {str(e).strip()[:120]}")
            return {}
        # ... and by relation (the first block a record touches; a history partition as its table)
        rels = self.q(r"""SELECT coalesce(regexp_replace(pg_filenode_relation(0,
                                 substring(block_ref from 'rel \d+/\d+/(\d+)')::oid)::regclass::text, '_p[0-9]{8}(t[0-9]{6})?', ''), '-'),
                                 count(*), sum(record_length)::bigint
                          FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn) GROUP BY 1""", [a, b])
        return {"by_record": {r[0]: {"records": r[1], "bytes": r[4], "fpi_bytes": r[3]} for r in rows},
                "by_relation": {r[0]: {"records": r[1], "bytes": int(r[2])} for r in rels},
                "fpi_bytes": sum(r[3] for r in rows), "record_bytes": sum(r[2] for r in rows)}

    # -- processes ---------------------------------------------------------------------------

    def spawn(self, name: str, argv: list[str], env: dict) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "w")  # noqa: SIM115  (closed in stop())
        proc = subprocess.Popen(argv, cwd=ROOT / "example_project", env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        proc.log = log  # type: ignore[attr-defined]
        self.children[name] = proc
        return proc

    def start_dispatcher(self, name: str, env: dict) -> subprocess.Popen:
        extra = ["--batch-size", str(self.args.batch_size)] if self.args.batch_size else []
        # No ETA_LEAD: the raw consumer does not hold a message until its eta as a worker does, and
        # lateness here is the message on the broker - fire_at, which a lead would make negative.
        extra += ["--eta-lead", "0"]
        return self.spawn(name, [sys.executable, "manage.py", "cron_dispatcher", "--name", name, "-v", "0", *extra], env)

    def start_role(self, role: str, env: dict, **extra) -> subprocess.Popen:
        argv = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--result", str(self.tmp / f"{role}.out"),
                "--rate", str(self.args.rate), "--minutes", str(self.args.minutes), "--lead", str(self.args.lead)]
        for k, v in extra.items():
            argv += [f"--{k}"] if v == "" else [f"--{k}", str(v)]  # "": a flag
        return self.spawn(role, argv, env)

    def stop_child(self, name: str, sig=signal.SIGTERM, timeout: float = 30.0) -> None:
        proc = self.children.get(name)
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        proc.log.close()  # type: ignore[attr-defined]

    def stop(self) -> None:
        for name in list(self.children):
            self.stop_child(name)
        if self.procs is not None:
            self.procs.stop()
            self.procs = None

    def wait_received(self, want: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        got = 0
        while time.monotonic() < deadline:
            got = int(self.redis.get(RECEIVED) or 0)
            if got >= want:
                break
            time.sleep(0.05)
        return got

    # -- the soak ----------------------------------------------------------------------------

    def soak(self) -> dict:
        a = self.args
        sc = a.scenario
        out: dict = {"scenario": sc, "pending": a.pending, "rate": a.rate, "minutes": a.minutes,
                     "label": a.label or f"{sc}, {a.pending:,} pending, {a.rate:,}/s"}
        out["load"] = self.load(a.pending)
        (autovacuum,), = self.q("SHOW autovacuum")
        out["autovacuum"] = autovacuum
        if autovacuum != "on":  # a test server's setting, say: the dead-tuple figures then mean nothing
            say("soak: autovacuum is off on this server: dead tuples are never reclaimed here; "
                "use a cluster with PostgreSQL's default settings for those figures")
        (options,), = self.q("SELECT reloptions FROM pg_class WHERE relname = 'cron_at_scale_job'")
        out["job_table_options"] = options
        if a.autovacuum_scale_factor is not None:  # a per-table setting, to weigh against the default
            self.q(f"ALTER TABLE cron_at_scale_job SET (autovacuum_vacuum_scale_factor = {a.autovacuum_scale_factor:g})")
            out["autovacuum_vacuum_scale_factor"] = a.autovacuum_scale_factor
        self.redis.delete(QUEUE, RECEIVED, FINISHED)
        self.q("DELETE FROM cron_at_scale_shardlease")
        self.q("DELETE FROM cron_at_scale_dispatcherheartbeat")
        # Partitions left by an earlier run (or bench/history_move.py's days) would hold this run's
        # history until they end: a new HISTORY_PARTITION applies from the last one's end.
        for parent, name in self.q("""SELECT p.relname, c.relname FROM pg_inherits i
                                      JOIN pg_class p ON p.oid = i.inhparent JOIN pg_class c ON c.oid = i.inhrelid
                                      WHERE p.relname IN ('cron_at_scale_jobhistory', 'cron_at_scale_attempthistory')"""):
            self.q(f'ALTER TABLE {parent} DETACH PARTITION "{name}"')
            self.q(f'DROP TABLE "{name}"')
        workers = sc == "workers"
        # No worker starts the attempts the consumer takes: a long dispatch lease keeps the reaper
        # from firing them again, and the consumed queue is not "unconsumed" (no worker health row).
        settings = {} if workers else {"HOLD_UNCONSUMED_QUEUES": False, "DISPATCH_LEASE": 3600.0}
        if sc == "lifecycle":
            settings["RETENTION"] = a.retention
            out["retention_s"] = a.retention
            settings["HISTORY_AFTER"] = a.history_after
            out["history_after_s"] = a.history_after
            if a.history_after is not None:
                settings["HISTORY_PARTITION"] = a.history_partition
                out["history_partition_s"] = a.history_partition
        from cron_at_scale import conf

        out["shard_lease"] = float(conf.get("SHARD_LEASE"))
        env = self.env(**settings)
        if workers:
            from demo.runner import Processes, wait_for_workers

            self.procs = Processes(env, log_dir=self.tmp / "logs")
            names = [f"soak-w{i}" for i in range(a.workers)]
            for name in names:
                self.procs.worker(name, concurrency=a.concurrency, extra=["--include", "bench.tasks"])
            wait_for_workers(self.app, names)
        else:
            self.start_role("consumer", env, **({"lifecycle": ""} if sc == "lifecycle" else {}))
        dispatchers = ["dispatcher-1", "dispatcher-2"] if sc == "dead-dispatcher" else ["dispatcher-1"]
        for name in dispatchers:
            self.start_dispatcher(name, env)
        # ready: each dispatcher holds its share of the shards, and one job went through
        deadline = time.monotonic() + 120
        want = math.ceil(64 / len(dispatchers))
        while time.monotonic() < deadline:
            held = dict(self.q("SELECT owner, count(*) FROM cron_at_scale_shardlease WHERE owner <> '' "
                               "AND expires_at > statement_timestamp() GROUP BY owner"))
            if len(held) == len(dispatchers) and sum(held.values()) == 64 and min(held.values()) >= want - 1:
                break
            time.sleep(0.2)
        benchrun.Bench.insert_due(self, 1)  # type: ignore[arg-type]
        if workers:
            self.wait_sql("SELECT count(*) FROM cron_at_scale_jobattempt WHERE finished_at IS NOT NULL", 1, 60)
        else:
            self.wait_received(1, 60)
        self.q("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_jobhistory, cron_at_scale_attempthistory")
        self.q("DELETE FROM cron_at_scale_job WHERE fire_at < statement_timestamp() + interval '1 hour'")
        self.q("VACUUM cron_at_scale_job")
        self.redis.delete(RECEIVED, FINISHED)
        self.q("CHECKPOINT")  # every run starts right after a checkpoint: its full-page images count alike

        seconds = int(round(a.minutes * 60))
        base = math.ceil(time.time() + a.lead + 1.0)
        end = base + seconds
        self.start_role("feeder", env, base=base)
        samples = [self.sample()]
        start_sample = samples[0]
        events: list[dict] = []
        block = None
        if sc in ("blocked-vacuum", "lifecycle"):
            block_s = a.block_minutes * 60
            block_from = base + (seconds - block_s) / 2
            block = {"from": block_from, "to": block_from + block_s}
        kill_at = base + seconds / 2 if sc == "dead-dispatcher" else None
        holder = None
        wal_windows: list[dict] = []
        next_t = time.time() + a.every
        stream_end_sample = None
        after_end = None
        say(f"soak: {out['label']}: stream {seconds}s from {datetime.fromtimestamp(base, timezone.utc):%H:%M:%S}")
        expected = a.rate * seconds
        while True:
            now = time.time()
            if block and holder is None and now >= block["from"]:
                holder = self.hold_transaction()
                events.append({"event": "transaction held open", "t": time.time()})
                say(f"  {now - base:6.0f}s: a transaction is held open (xid {holder[1]})")
            if block and holder is not None and holder[0] is not None and now >= block["to"]:
                holder[0].rollback()
                holder[0].close()
                holder = (None, holder[1])
                events.append({"event": "transaction ended", "t": time.time()})
                say(f"  {now - base:6.0f}s: the transaction ended")
            if kill_at and now >= kill_at:
                out["killed"] = self.kill_dispatcher("dispatcher-2")
                events.append({"event": "dispatcher-2 killed -9", "t": out["killed"]["t"]})
                say(f"  {now - base:6.0f}s: dispatcher-2 killed -9 ({len(out['killed']['shards'])} shards)")
                kill_at = None
            if now >= next_t:
                s = self.sample()
                samples.append(s)
                prev = samples[-2]
                c = self.cpu_delta(prev["cpu"], s["cpu"], s["t"] - prev["t"])
                say(f"  {s['t'] - base:6.0f}s: received {s['received']:,}, due unclaimed {s['due_unclaimed']:,}, "
                    f"broker {s['broker_depth']:,}, WAL {self.wal_bytes(prev['lsn'], s['lsn']) / 2**20:.1f} MiB, "
                    f"finished {s['finished'] - prev['finished']:,}, job dead {s['tables']['job']['dead']:,} "
                    f"live {s['tables']['job']['live']:,}, attempt dead {s['tables']['attempt']['dead']:,}; cores: dispatcher {c['dispatcher']:.2f} "
                    f"postgres {c['pg_backends']:.2f} autovacuum {c['autovacuum']:.2f} feeder {c['feeder']:.2f} "
                    f"consumer {c['consumer']:.2f}; waiting for a CPU: dispatcher {c['wait_dispatcher']:.2f} "
                    f"postgres {c['wait_pg_backends']:.2f} (load {os.getloadavg()[0]:.1f})")
                if stream_end_sample is None and len(samples) % 6 == 3:  # one window a minute: decoding costs CPU
                    split = self.wal_split(prev["lsn"], s["lsn"])
                    if split:
                        wal_windows.append({"received": s["received"] - prev["received"], **split})
                next_t += a.every
            if stream_end_sample is None and now >= end:
                # drained: every job fired and taken (or the workers started them), or 60 s more
                if workers:
                    self.wait_sql("SELECT count(*) FROM cron_at_scale_jobattempt WHERE started_at IS NOT NULL",
                                  expected, 60)
                else:
                    self.wait_received(expected, 60)
                if sc == "lifecycle":  # and finished
                    deadline = time.monotonic() + 60
                    while int(self.redis.get(FINISHED) or 0) < expected and time.monotonic() < deadline:
                        time.sleep(0.1)
                stream_end_sample = self.sample()
                samples.append(stream_end_sample)
                after_end = time.time() + a.after
                next_t = time.time() + a.every
                say(f"  stream ended; drained at +{stream_end_sample['t'] - end:.1f}s; sampling {a.after:.0f}s more")
            if after_end and now >= after_end:
                break
            time.sleep(0.05)
        if holder is not None and holder[0] is not None:
            holder[0].rollback()
            holder[0].close()
        feeder = self.children["feeder"]
        feeder.wait(60)
        self.stop()
        feed = json.loads((self.tmp / "feeder.out").read_text()) if (self.tmp / "feeder.out").exists() else {}
        out["feeder"] = feed
        out["expected"] = expected  # streamed; "fired" is how many reached the broker (or started) by the end
        out["events"] = [{**e, "s": round(e["t"] - base, 1)} for e in events]
        out.update(self.figures(base, end, samples, start_sample, stream_end_sample, block))
        out["wal_split"] = merge_wal(wal_windows)
        if workers:
            out["lateness"] = self.worker_lateness(base)
        else:
            out["lateness"] = self.consumer_lateness(base, end, block, out.get("killed"))
        out["targets"] = targets(out)
        return out

    def wait_sql(self, sql: str, want: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        got = 0
        while time.monotonic() < deadline:
            (got,), = self.q(sql)
            if got >= want:
                break
            time.sleep(0.2)
        return got

    def hold_transaction(self):
        """A connection of its own: a REPEATABLE READ transaction that took its snapshot (an analytics
        query's, a forgotten BEGIN's) and an xid, then idle: it holds back every vacuum's horizon."""
        from django.db import connections

        conn = connections.create_connection("default")  # a second connection, as Django's backend makes it
        conn.set_autocommit(False)
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SELECT count(*) FROM (SELECT 1 FROM cron_at_scale_job LIMIT 1000) AS s")
            cur.execute("SELECT txid_current()")
            (xid,) = cur.fetchone()
        return conn, xid

    def kill_dispatcher(self, name: str) -> dict:
        shards = [r[0] for r in self.q("SELECT shard FROM cron_at_scale_shardlease WHERE owner = %s ORDER BY shard", [name])]
        proc = self.children[name]
        t = time.time()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return {"t": t, "shards": shards}

    def figures(self, base, end, samples, first, last, block) -> dict:
        """WAL, tables, CPU: over the stream (start to drained), per sample, and after it."""
        if last is None:
            last = samples[-1]
        received = last["received"]
        wal = self.wal_bytes(first["lsn"], last["lsn"])
        span = last["t"] - first["t"]
        finished = samples[-1].get("finished", 0)  # the consumer's writes trail its receipts: counted at the very end
        out: dict = {"fired": received, "wal_bytes": wal, "finished": finished,
                     "wal_bytes_per_finished_job": round(wal / finished, 1) if finished else None,
                     "wal_bytes_per_job": round(wal / received, 1) if received else None,
                     "cpu_cores": self.cpu_delta(first["cpu"], last["cpu"], span),
                     "cpu_ms_per_job": {k: round(v * span * 1000 / received, 4) if received else None
                                        for k, v in self.cpu_delta(first["cpu"], last["cpu"], span).items()
                                        if not k.startswith("wait_")},
                     "tables_start": first["tables"], "tables_stream_end": last["tables"],
                     "tables_after": samples[-1]["tables"], "after_s": round(samples[-1]["t"] - last["t"], 1)}
        for name in ("job", "attempt"):
            a, b = first["tables"][name], last["tables"][name]
            upd = b["upd"] - a["upd"]
            out.setdefault("hot_share", {})[name] = round((b["hot_upd"] - a["hot_upd"]) / upd, 3) if upd else None
            out.setdefault("autovacuum_runs", {})[name] = b["autovacuum_count"] - a["autovacuum_count"]
            out.setdefault("autovacuum_runs_after", {})[name] = (samples[-1]["tables"][name]["autovacuum_count"]
                                                                 - b["autovacuum_count"])
        series = []
        for prev, s in zip(samples, samples[1:], strict=False):
            dt = s["t"] - prev["t"]
            if dt <= 0.5:
                continue
            j = s["tables"]["job"]
            series.append({"s": round(s["t"] - base, 1), "received": s["received"] - prev["received"],
                           "wal_bytes": self.wal_bytes(prev["lsn"], s["lsn"]), "due_unclaimed": s["due_unclaimed"],
                           "oldest_due_s": round(s["oldest_due_s"], 3), "broker_depth": s["broker_depth"],
                           "job_dead": j["dead"], "job_live": j["live"], "job_heap": j["heap_bytes"],
                           "job_index": j["index_bytes"], "attempt_dead": s["tables"]["attempt"]["dead"],
                           "finished": s.get("finished", 0) - prev.get("finished", 0),
                           "tables": {k: {f: v.get(f) for f in ("live", "dead", "heap_bytes", "index_bytes",
                                                                "autovacuum_count", "upd", "del", "partitions")}
                                      for k, v in s["tables"].items()},
                           "autovacuum_job": j["autovacuum_count"],
                           "autovacuum_attempt": s["tables"]["attempt"]["autovacuum_count"],
                           "cpu": self.cpu_delta(prev["cpu"], s["cpu"], dt)})
        out["samples"] = series
        return out

    def consumer_lateness(self, base, end, block, killed) -> dict:
        import numpy as np

        path = self.tmp / "consumer.out.npz"
        if not path.exists():
            return {"overall": pct(np.empty(0))}
        with np.load(path) as data:
            keep = data["fire_at"] >= base  # not the one job that showed the dispatchers ready
            f, late, shard = data["fire_at"][keep], data["late_ms"][keep], data["shard"][keep]
        path.unlink()  # ~17 bytes a job: 100 MB after a 10-minute run at 10,000/s
        every = self.args.every
        out: dict = {"overall": pct(late), "duplicates_or_extra": None}
        rows = []
        idx = np.floor((f - base) / every).astype(int)
        for k in range(int(math.ceil((end - base) / every))):
            sel = late[idx == k]
            rows.append({"s": k * every, **pct(sel)})
        out["series"] = rows
        if block:
            for name, lo, hi in (("before", base, block["from"]), ("blocked", block["from"], block["to"]),
                                 ("first_minute_after", block["to"], block["to"] + 60), ("after", block["to"] + 60, end)):
                out[name] = pct(late[(f >= lo) & (f < hi)])
        if killed:
            dead = np.isin(shard, killed["shards"])
            t = killed["t"]
            after = dead & (f >= t)
            out["dead_shards_after_kill"] = pct(late[after & (f < t + 30)])
            out["live_shards_after_kill"] = pct(late[~dead & (f >= t) & (f < t + 30)])
            # the first job of the dead shards due after the kill fired by the survivor: when it took over
            sel = np.where(after)[0]
            if len(sel):
                # The killed one publishes nothing more: the first of its shards' jobs on the broker after
                # the kill came from the survivor, which had taken the shards over by then.
                arrived = f[sel] + late[sel] / 1000
                out["takeover_s"] = round(float(arrived.min() - t), 2)
            # claimed by the killed dispatcher (its look-ahead) and never published: its attempts wait
            # for their dispatch lease to run out, then the reaper fires them again (not within this run)
            expected = self.args.rate * int(round(self.args.minutes * 60))
            out["missing"] = int(expected - len(f))
        return out

    def worker_lateness(self, base) -> dict:
        """Start lateness (attempt started_at - fire_at) and claim lateness (dispatched_at - fire_at:
        negative within the look-ahead), database clock."""
        def stats(expr):
            (n, p, mx), = self.q(f"""SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY v), max(v)
                                     FROM (SELECT extract(epoch FROM {expr}) * 1000 AS v FROM cron_at_scale_jobattempt
                                           WHERE started_at IS NOT NULL) s""")
            return {"n": n, "p50": round(p[0], 1), "p95": round(p[1], 1), "p99": round(p[2], 1),
                    "max": round(float(mx), 1)} if n else {"n": 0}
        out = {"overall": stats("started_at - scheduled_at"), "claim": stats("dispatched_at - scheduled_at")}
        rows = self.q("""SELECT floor((extract(epoch FROM scheduled_at) - %s) / %s)::int * %s, count(*),
                                percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - scheduled_at) * 1000),
                                max(extract(epoch FROM started_at - scheduled_at) * 1000)
                         FROM cron_at_scale_jobattempt WHERE started_at IS NOT NULL GROUP BY 1 ORDER BY 1""",
                      [base, self.args.every, self.args.every])
        out["series"] = [{"s": float(s), "n": n, "p50": round(p[0], 1), "p95": round(p[1], 1), "p99": round(p[2], 1),
                          "max": round(float(mx), 1)} for s, n, p, mx in rows]
        return out

    # -- idle recurring jobs -----------------------------------------------------------------

    def recurring(self) -> dict:
        """Firing and per-job changes with ``--recurring`` idle cron jobs in the table and without,
        in turns; the ``--pending`` future one-off jobs stay throughout."""
        import statistics

        import cron_at_scale

        a = self.args
        out: dict = {"scenario": "recurring", "recurring": a.recurring, "pending": a.pending,
                     "label": a.label or f"recurring: {a.recurring:,} idle cron jobs"}
        out["load"] = self.load(a.pending)
        self.redis.delete(QUEUE)
        crons = ("0 3 * * *", "30 4 * * 1", "@daily", "15 2 * * 0")  # daily and weekly, hours ahead

        def add_recurring():
            t0 = time.monotonic()
            for start in range(0, a.recurring, 10_000):
                cron_at_scale.schedule_many([{"task": TASK, "cron": crons[i % len(crons)], "args": [i]}
                                             for i in range(start, min(a.recurring, start + 10_000))])
            self.q("VACUUM ANALYZE cron_at_scale_job")
            return time.monotonic() - t0

        def drop_recurring():
            self.q("DELETE FROM cron_at_scale_job WHERE schedule_type <> 'once'")
            self.q("VACUUM ANALYZE cron_at_scale_job")

        bench = benchrun.Bench.__new__(benchrun.Bench)  # its firing helpers on this process's connection
        bench.args = argparse.Namespace(batch_size=a.batch_size)
        bench.connection = self.connection

        def measure() -> dict:
            # one-off jobs of this round: due now (fired) and a few for cancel; recurring ones to pause
            (now,), = self.q("SELECT statement_timestamp()")
            later = now + timedelta(hours=2)
            ones = cron_at_scale.schedule_many([{"task": TASK, "at": later}] * a.ops)
            recs = cron_at_scale.schedule_many([{"task": TASK, "cron": "0 5 * * *"}] * a.ops)
            r = {}

            def backend_cpu() -> float:  # this connection's backend: its CPU (ns-precise), not the box's wait
                try:
                    return int(Path(f"/proc/{self.backend}/schedstat").read_text().split()[0]) / 1e9
                except (OSError, IndexError, ValueError):
                    return 0.0

            for name, calls in (("cancel", [lambda j=j: cron_at_scale.cancel(j.id) for j in ones]),
                                ("pause", [lambda j=j: cron_at_scale.pause(j.id) for j in recs]),
                                ("schedule", [lambda i=i: cron_at_scale.schedule(TASK, at=later, args=[i])
                                              for i in range(a.ops)])):
                c0, t0 = backend_cpu(), time.perf_counter()
                for call in calls:
                    call()
                r[f"{name}_ms"] = (time.perf_counter() - t0) * 1000 / a.ops
                r[f"{name}_pg_cpu_ms"] = (backend_cpu() - c0) * 1000 / a.ops
            bench.insert_due(a.due)
            c0, own0 = backend_cpu(), sum(os.times()[:2])
            n, s = bench.fire_in_process(a.due)
            self.redis.delete(QUEUE)
            r["fire_jobs_per_s"] = n / s
            # CPU per fired job: the claim's backend + this process (the in-process dispatcher)
            r["fire_cpu_ms_per_job"] = (backend_cpu() - c0 + sum(os.times()[:2]) - own0) * 1000 / max(1, n)
            # the round's own rows go: the next round starts from the same table
            self.q("TRUNCATE cron_at_scale_jobattempt")
            self.q("DELETE FROM cron_at_scale_job WHERE fire_at < statement_timestamp() + interval '3 hours' "
                   "AND (schedule_type = 'once' OR status = 'paused' OR cron_expr = '0 5 * * *')")
            self.q("VACUUM ANALYZE cron_at_scale_job")
            return r

        rounds: dict[str, list] = {"without": [], "with": []}
        for i in range(a.rounds):
            for side in ("without", "with") if i % 2 == 0 else ("with", "without"):
                if side == "with":
                    s = add_recurring()
                    say(f"  {a.recurring:,} recurring jobs added in {s:.0f}s")
                r = measure()
                rounds[side].append(r)
                say(f"recurring round {i + 1} {side:7}: fire {r['fire_jobs_per_s']:,.0f} jobs/s; per call (ms, and "
                    f"PostgreSQL CPU ms): cancel {r['cancel_ms']:.2f} ({r['cancel_pg_cpu_ms']:.3f}), pause "
                    f"{r['pause_ms']:.2f} ({r['pause_pg_cpu_ms']:.3f}), schedule {r['schedule_ms']:.2f} "
                    f"({r['schedule_pg_cpu_ms']:.3f})")
                if side == "with":
                    drop_recurring()
        out["rounds"] = rounds
        out["median"] = {side: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]}
                         for side, rs in rounds.items()}
        out["ratio_with_to_without"] = {k: round(out["median"]["with"][k] / out["median"]["without"][k], 3)
                                        for k in out["median"]["with"] if out["median"]["without"][k]}
        out["targets"] = targets(out)
        return out


# -- output ----------------------------------------------------------------------------------


def merge_wal(windows: list[dict]) -> dict:
    """The WAL of the inspected windows by record type, in bytes per job fired in those windows."""
    jobs = sum(w["received"] for w in windows)
    if not jobs:
        return {}
    per: dict[str, dict] = {}
    for w in windows:
        for name, v in w["by_record"].items():
            d = per.setdefault(name, {"bytes": 0, "fpi_bytes": 0, "records": 0})
            for k in d:
                d[k] += v[k]
    total = sum(v["bytes"] for v in per.values())
    rels: dict[str, dict] = {}
    for w in windows:
        for name, v in w.get("by_relation", {}).items():
            d = rels.setdefault(name, {"bytes": 0, "records": 0})
            for k in d:
                d[k] += v[k]
    return {"windows": len(windows), "jobs": jobs, "bytes_per_job": round(total / jobs, 1),
            "by_relation_per_job": {k: {"bytes": round(v["bytes"] / jobs, 1), "records": round(v["records"] / jobs, 2)}
                                    for k, v in sorted(rels.items(), key=lambda kv: -kv[1]["bytes"])},
            "fpi_share": round(sum(v["fpi_bytes"] for v in per.values()) / total, 3) if total else None,
            "by_record_per_job": {k: {"bytes": round(v["bytes"] / jobs, 1), "fpi_bytes": round(v["fpi_bytes"] / jobs, 1),
                                      "records": round(v["records"] / jobs, 2)}
                                  for k, v in sorted(per.items(), key=lambda kv: -kv[1]["bytes"])}}


def targets(r: dict) -> list[dict]:
    """The issue's targets this run measured: figure, goal, met."""
    out = []

    def add(name, value, op, goal):
        if value is None:
            return
        met = value <= goal if op == "<=" else value < goal if op == "<" else value >= goal
        out.append({"target": name, "value": value, "goal": f"{op} {goal:,}", "met": bool(met)})

    lat = r.get("lateness") or {}
    sc = r.get("scenario")
    if sc == "recurring":
        ratio = r["ratio_with_to_without"]
        add("firing with / without recurring (x)", ratio["fire_jobs_per_s"], ">=", 0.9)
        if "fire_cpu_ms_per_job" in ratio:
            add("firing: CPU per job with / without (x)", ratio["fire_cpu_ms_per_job"], "<=", 1.1)
        for k in ("cancel", "pause", "schedule"):
            add(f"{k}: wall time with / without recurring (x)", ratio[f"{k}_ms"], "<=", 1.1)
            if f"{k}_pg_cpu_ms" in ratio:
                add(f"{k}: PostgreSQL CPU with / without (x)", ratio[f"{k}_pg_cpu_ms"], "<=", 1.1)
        return out
    if sc in ("steady", "workers"):
        rows = [x["p99"] for x in lat.get("series") or [] if x.get("p99") is not None]
        add(f"p99 lateness, every {int(r.get('every', 10))} s window (ms)", max(rows) if rows else None, "<", 100)
        add("p99 lateness, whole run (ms)", (lat.get("overall") or {}).get("p99"), "<", 100)
    if sc == "lifecycle":
        rows = [x["p99"] for x in lat.get("series") or [] if x.get("p99") is not None]
        add(f"p99 lateness, every {int(r.get('every', 10))} s window, pin included (ms)", max(rows) if rows else None,
            "<", 100)
        if r.get("fired"):
            add("finished / fired (x)", round(r.get("finished", 0) / r["fired"], 4), ">=", 1.0)
        add("WAL bytes per job, whole life", r.get("wal_bytes_per_finished_job"), "<=", 1024)
    if sc == "blocked-vacuum":
        blocked = [x["p99"] for x in lat.get("series") or [] if x.get("p99") is not None]
        add("blocked: p99 lateness, worst 10 s window (ms)", max(blocked) if blocked else None, "<", 250)
        add("p99 in the first minute after it (ms)", (lat.get("first_minute_after") or {}).get("p99"), "<", 100)
    if sc == "dead-dispatcher":
        add("dead dispatcher: its shards taken over after (s)", lat.get("takeover_s"), "<=", r["shard_lease"] + 1)
    kept_up = r.get("expected") and r.get("fired", 0) >= 0.98 * r["expected"]
    if r.get("wal_bytes_per_job") is not None and sc != "workers" and kept_up:
        # only where every streamed job fired: behind, the WAL of inserts outnumbers the jobs fired
        add("WAL bytes per fired job", r["wal_bytes_per_job"], "<=", 1024)
    start, after = (r.get("tables_start") or {}).get("job"), (r.get("tables_after") or {}).get("job")
    if start and after:
        add(f"job dead tuples {r['after_s']:.0f} s after the end", after["dead"], "<=", max(start["dead"], 1000))
    return out


def table(r: dict) -> None:
    say("")
    say(f"== {r['label']}")
    if r.get("scenario") == "recurring":
        say(f"{'median per round':24}{'without':>12}{'with':>12}{'ratio':>8}")
        for k in r["median"]["with"]:
            say(f"{k:24}{r['median']['without'][k]:>12,.2f}{r['median']['with'][k]:>12,.2f}"
                f"{r['ratio_with_to_without'][k]:>8.2f}")
    else:
        lat = r["lateness"]
        say(f"{'s':>6}{'jobs':>8}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}  ms lateness by fire time")
        for row in lat.get("series") or []:
            if row["n"]:
                say(f"{row['s']:>6.0f}{row['n']:>8}{row['p50']:>9.1f}{row['p95']:>9.1f}{row['p99']:>9.1f}{row['max']:>9.1f}")
        o = lat["overall"]
        if o["n"]:
            say(f"{'all':>6}{o['n']:>8}{o['p50']:>9.1f}{o['p95']:>9.1f}{o['p99']:>9.1f}{o['max']:>9.1f}")
        for k in ("before", "blocked", "first_minute_after", "after", "dead_shards_after_kill", "live_shards_after_kill"):
            if lat.get(k) and lat[k]["n"]:
                x = lat[k]
                say(f"  {k:24} n {x['n']:>8}  p50 {x['p50']:.1f}  p99 {x['p99']:.1f}  max {x['max']:.1f} ms")
        for k in ("takeover_s", "missing"):
            if k in lat:
                say(f"  {k}: {lat[k]}")
        say(f"fired {r['fired']:,} of {r.get('expected', 0):,} by the end of the drain; WAL {r['wal_bytes'] / 2**20:,.1f} MiB = {r['wal_bytes_per_job']} bytes per fired job")
        w = r.get("wal_split")
        if w:
            say(f"  WAL of {w['windows']} inspected 10 s windows: {w['bytes_per_job']} bytes per job, full-page images "
                f"{w['fpi_share']:.0%}; by record, bytes (records) per job: " + ", ".join(
                    f"{k} {v['bytes']:.0f} ({v['records']:.2f})" for k, v in list(w["by_record_per_job"].items())[:8]))
            if w.get("by_relation_per_job"):
                say("  by relation, bytes (records) per job: " + ", ".join(
                    f"{k} {v['bytes']:.0f} ({v['records']:.2f})" for k, v in list(w["by_relation_per_job"].items())[:16]))
        for name in ("job", "attempt"):
            s, e, a = r["tables_start"][name], r["tables_stream_end"][name], r["tables_after"][name]
            say(f"  {name:8} heap+index MiB {(s['heap_bytes'] + s['index_bytes']) / 2**20:,.0f} -> "
                f"{(e['heap_bytes'] + e['index_bytes']) / 2**20:,.0f} -> {(a['heap_bytes'] + a['index_bytes']) / 2**20:,.0f}; "
                f"dead {s['dead']:,} -> {e['dead']:,} -> {a['dead']:,} ({r['after_s']:.0f} s after); autovacuum runs "
                f"{r['autovacuum_runs'][name]} (+{r['autovacuum_runs_after'][name]} after); HOT {r['hot_share'][name]}")
        c = r["cpu_cores"]
        say("  CPU cores busy (stream): " + ", ".join(f"{k} {v:.2f}" for k, v in c.items() if v and "wait" not in k))
        say("  waiting for a CPU (CPUs): " + ", ".join(f"{k[5:]} {v:.2f}" for k, v in c.items() if k.startswith("wait_")))
        say("  CPU ms per fired job:    " + ", ".join(f"{k} {v:.3f}" for k, v in r["cpu_ms_per_job"].items() if v))
    if r.get("feeder"):
        say(f"  feeder: {r['feeder']}")
    say("")
    say(f"{'target':48} {'measured':>14} {'goal':>10}  met")
    for t in r["targets"]:
        v = f"{t['value']:,}" if isinstance(t["value"], (int, float)) else str(t["value"])
        say(f"{t['target']:48} {v:>14} {t['goal']:>10}  {'yes' if t['met'] else 'NO'}")
    m = r["machine"]
    say(f"machine: {m['cpus']} cpus, load average {m['load_start']} at start, {m['load_end']} at the end")


def draw(runs: list[dict], png_dir: str) -> list[str]:
    """soak-lateness.png: p50/p99/max lateness per window over time, one panel per run, the due-but-unclaimed
    backlog on a second axis and events shaded; soak-p99-vs-pending.png: whole-run p99 against pending jobs."""
    try:
        import matplotlib
    except ImportError:
        say("matplotlib is not installed (pip install -e '.[bench]'): no PNG")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in runs if r.get("lateness", {}).get("series")]
    if not runs:
        return []
    Path(png_dir).mkdir(parents=True, exist_ok=True)
    paths = []
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.0 * len(runs)), squeeze=False)
    for ax, r in zip(axes[:, 0], runs, strict=True):
        rows = [x for x in r["lateness"]["series"] if x["n"]]
        x = [row["s"] for row in rows]
        for key, color, style in (("p50", "tab:blue", "-"), ("p99", "tab:red", "-"), ("max", "tab:gray", ":")):
            ax.plot(x, [max(1.0, row[key]) for row in rows], label=key, color=color, linestyle=style)
        ax.axhline(100, color="tab:red", linewidth=0.6, linestyle="--")
        ax.set_yscale("log")
        ax.set_ylim(bottom=1)
        ax.set_ylabel("lateness, ms")
        ax.set_title(r["label"], fontsize="medium")
        ax.grid(True, which="both", alpha=0.3)
        ev = {e["event"]: e["s"] for e in r.get("events") or []}
        if "transaction held open" in ev:
            ax.axvspan(ev["transaction held open"], ev.get("transaction ended", x[-1]), color="tab:orange", alpha=0.15,
                       label="vacuum blocked")
        for name, s in ev.items():
            if "killed" in name:
                ax.axvline(s, color="black", linewidth=1, label=name)
        ax2 = ax.twinx()
        samples = r.get("samples") or []
        ax2.plot([s["s"] for s in samples], [s["due_unclaimed"] for s in samples], color="tab:green", linewidth=0.8,
                 label="due, unclaimed (right)")
        ax2.set_ylabel("due jobs not claimed", color="tab:green")
        ax2.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize="small", loc="upper left")
    axes[-1, 0].set_xlabel("fire time, s into the stream (per 10 s window)")
    fig.tight_layout()
    path = str(Path(png_dir) / "soak-lateness.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    paths.append(path)
    steady = sorted((r for r in runs if r["scenario"] == "steady"), key=lambda r: r["pending"])
    if len(steady) >= 2:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for rate in sorted({r["rate"] for r in steady}):
            rs = [r for r in steady if r["rate"] == rate]
            ax.plot([max(r["pending"], 1) for r in rs], [r["lateness"]["overall"]["p99"] for r in rs], marker="o",
                    label=f"p99, whole run, {rate:,} jobs/s")
            ax.plot([max(r["pending"], 1) for r in rs],
                    [max(x["p99"] for x in r["lateness"]["series"] if x["n"]) for r in rs], marker="x",
                    linestyle="--", label=f"worst 10 s p99, {rate:,} jobs/s")
        ax.axhline(100, color="tab:red", linewidth=0.6, linestyle="--", label="target 100 ms")
        ax.set_xscale("symlog", linthresh=100_000)
        ax.set_xlim(0, 2 * max(r["pending"] for r in steady))
        ax.set_yscale("log")
        ax.set_xlabel("pending future jobs in the table")
        ax.set_ylabel("dispatch lateness p99, ms")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        path = str(Path(png_dir) / "soak-p99-vs-pending.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def draw_storage(runs: list[dict], png_dir: str) -> list[str]:
    """soak-storage.png, for lifecycle runs: over the run, the job table's live rows (the pending depth
    and what retention has not purged yet) and jobs finished per second; dead tuples of each table;
    heap + index size of the job and attempt tables. The pinned transaction is shaded."""
    runs = [r for r in runs if r.get("scenario") == "lifecycle" and r.get("samples")]
    if not runs:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for r in runs:
        samples = [s for s in r["samples"] if "tables" in s]
        x = [s["s"] / 60 for s in samples]
        fig, axes = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True)
        ev = {e["event"]: e["s"] / 60 for e in r.get("events") or []}
        for ax in axes:
            if "transaction held open" in ev:
                ax.axvspan(ev["transaction held open"], ev.get("transaction ended", x[-1]), color="tab:orange",
                           alpha=0.15, label="REPEATABLE READ held open")
            ax.grid(True, alpha=0.3)
        ax = axes[0]
        ax.plot(x, [s["tables"]["job"]["live"] for s in samples], color="tab:blue", label="job table: live rows")
        ax.set_ylabel("rows")
        ax2 = ax.twinx()
        ax2.plot(x, [s["finished"] / max(1e-9, r.get("every", 10.0)) for s in samples], color="tab:green",
                 linewidth=0.8, label="finished per s (right)")
        ax2.set_ylabel("jobs finished / s", color="tab:green")
        ax2.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize="small", loc="upper left")
        ax.set_title(r["label"], fontsize="medium")
        ax = axes[1]
        for name, color in (("job", "tab:blue"), ("attempt", "tab:purple"), ("shardlease", "tab:red"),
                            ("dispatcherheartbeat", "tab:gray")):
            ys = [s["tables"].get(name, {}).get("dead", 0) for s in samples]
            if any(ys):
                ax.plot(x, [max(1, y) for y in ys], color=color, label=f"{name}: dead tuples")
        ax.set_yscale("log")
        ax.set_ylabel("dead tuples")
        ax.legend(fontsize="small", loc="upper left")
        ax = axes[2]
        for name, color in (("job", "tab:blue"), ("attempt", "tab:purple"), ("jobhistory", "tab:green"),
                            ("attempthistory", "tab:olive")):
            if not any(s["tables"].get(name, {}).get("heap_bytes") for s in samples):
                continue  # the history tables: only with --history-after
            ax.plot(x, [((s["tables"][name]["heap_bytes"] or 0) + (s["tables"][name]["index_bytes"] or 0)) / 2**20
                        for s in samples], color=color, label=f"{name}: heap + indexes")
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small", loc="upper left")
        axes[-1].set_xlabel("minutes into the stream")
        fig.tight_layout()
        path = str(Path(png_dir) / "soak-storage.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def dur(ms: float | None) -> str:
    """A lateness for a reader: "87 ms", "1.2 s", "—"."""
    if ms is None:
        return "—"
    return f"{ms:,.0f} ms" if abs(ms) < 1000 else f"{ms / 1000:,.1f} s"


def markdown(runs: list[dict]) -> str:
    """One Markdown table row per saved run (docs/benchmarks.md)."""
    head = ("| run | fired / streamed | lateness p50 / p99 / max | worst 10 s p99 | WAL B/job "
            "| job dead: start → end → +60 s | autovacuum runs (job) | CPU ms/job: dispatcher / postgres / autovacuum "
            "| CPUs waited: dispatcher / postgres | load avg |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        if r.get("scenario") == "recurring":
            continue
        o = r["lateness"]["overall"]
        worst = max((x["p99"] for x in r["lateness"]["series"] if x.get("n")), default=None)
        js, je, ja = (r[k]["job"]["dead"] for k in ("tables_start", "tables_stream_end", "tables_after"))
        c, m = r["cpu_ms_per_job"], r["cpu_cores"]
        lines.append(
            f"| {r['label']} | {r['fired']:,} / {r.get('expected', 0):,} | {dur(o['p50'])} / {dur(o['p99'])} / "
            f"{dur(o['max'])} | {dur(worst)} | {r['wal_bytes_per_job']:,.0f} | {js:,} → {je:,} → {ja:,} "
            f"| {r['autovacuum_runs']['job']} (+{r['autovacuum_runs_after']['job']}) "
            f"| {c['dispatcher']:.3f} / {c['pg_backends']:.3f} / {c['autovacuum']:.3f} "
            + (f"| {m['wait_dispatcher']:.2f} / {m['wait_pg_backends']:.2f} " if "wait_dispatcher" in m else "| — ")
            + f"| {r['machine']['load_start'][0]:.1f}–{r['machine']['load_end'][0]:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.role == "feeder":
        return feeder(args)
    if args.role == "consumer":
        return consumer(args)
    if args.draw:
        runs = [json.loads(Path(p).read_text().strip().splitlines()[-1]) for p in args.draw]
        for p in draw(runs, args.png_dir) + draw_storage(runs, args.png_dir):
            say(f"wrote {p}")
        print(markdown(runs))
        return 0
    machine = {"cpus": os.cpu_count(), "load_start": [round(x, 2) for x in os.getloadavg()],
               "host": socket.gethostname()}
    code = benchrun.code_version()  # at the start: the processes it starts run this code
    soak = Soak(args)
    if args.load_only:
        soak.load(args.pending)
        return 0
    try:
        result = soak.recurring() if args.scenario == "recurring" else soak.soak()
    finally:
        soak.stop()
    machine["load_end"] = [round(x, 2) for x in os.getloadavg()]
    result["machine"] = machine
    result["every"] = args.every
    result["code"] = code
    result["png"] = draw([result], args.png_dir) + draw_storage([result], args.png_dir) \
        if args.scenario != "recurring" else []
    table(result)
    line = json.dumps(result, default=str)
    print(line, flush=True)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
