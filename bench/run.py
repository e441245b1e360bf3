"""The benchmark: firing speed, lag and worker overhead, side by side with the raw ceiling and Celery ETA.

    python bench/run.py                       # everything, default sizes (~10 min on 2 cores)
    python bench/run.py --size small          # tiny sizes: the CI smoke test
    python bench/run.py --only ceiling,w3 --future 10000000 --png-dir docs

Workloads (``--only`` takes a comma-separated subset, in this order):

ceiling   no workers. ``Dispatcher.claim()`` (the project's claim statement) of
          ``--jobs`` due jobs + a raw Redis ``LPUSH`` of small strings in one
          pipeline per batch: the ceiling. Then the project's firing path alone
          (``Dispatcher.tick()``: claim + ``Publisher.publish``), ``--jobs`` due
          at one instant and the ``--burst`` (100,000) burst: jobs claimed and on
          the broker per second, checked with ``LLEN``. And kombu's general
          path (``send_task`` in ``Producer.batch()``) on ``--general`` jobs.
          CPU ms per fired job of this process (the dispatcher), PostgreSQL and
          the broker, for the ceiling, the firing path and the burst.
          With ``--broker`` (default: ``CELERY_RABBITMQ_URL``), a RabbitMQ
          broker too: the firing path (its fast path, publisher confirms
          awaited once per batch) on ``--jobs`` jobs and kombu's general path
          (``send_task``, no confirms) on ``--general`` jobs, median of 3 each,
          counted on the broker (the ``celery`` queue's depth) after each.
w3        10M pending: ``schedule_many`` (COPY) rate on ``--many`` jobs; the
          rest of ``--future`` future jobs by ``INSERT ... SELECT generate_series``
          (secondary indexes built after the load); firing ``--due`` due jobs
          beside them vs an empty table (best of 3 each); the claim's plan
          (``EXPLAIN`` of the statement the dispatcher really sends).
overhead  two ``celery worker`` processes (prefork, 1 child each): ``--overhead``
          ``demo.tasks.noop`` messages pre-loaded on a queue the workers do not
          consume yet, then ``add_consumer``; completions/s until the queue and
          the unacked set are empty. As plain ``send_task`` messages, then
          claimed and published by the dispatcher (through the middleware), in
          turn, three rounds of each; the ratio of the medians. And CPU ms per
          completed task (the figure to trust when the box's speed drifts) of
          the worker parents, their pool children, PostgreSQL and the broker.
w1        the same workers + one ``cron_dispatcher`` process: ``--jobs`` jobs due
          at one instant (firing, completion, lag).
w2        steady stream: ``--rates`` jobs/s (default 500 and 2000) for
          ``--duration`` s (60; the other rates ``--duration-high``, 20 s),
          fire times spread evenly and scheduled beforehand;
          start lag (attempt ``started_at - fire_at``) and dispatch lag
          (``dispatched_at - fire_at``: the claim's time, negative when the
          dispatcher claims ahead with its look-ahead and publishes from a
          timer), database clock; a PNG of lag over time.
eta       Celery's own path on the same workers: ``--eta-jobs`` ``apply_async(eta=...)``
          due at one instant, and the first ``--rates`` rate spread over
          ``--duration`` s; start lag = the task's ``statement_timestamp()`` - its ETA
          (the ETA is computed from the database clock, the same machine's clock).
lag       steady start lag, ours against Celery's ETA path, in turns (``--turns``, 2):
          W2 at the first ``--rates`` rate for ``--duration`` s with each
          ``--eta-leads`` value (the dispatcher's ``--eta-lead``; default 0 and
          the setting's), then a plain ``apply_async(eta=...)`` stream at the same
          rate on the same workers (each message sent ``--stream-lead`` s, 1,
          before its ETA, from this process); per side the median of the turns'
          p50 and p99.

Services: ``DATABASE_URL`` / ``CELERY_BROKER_URL`` when set, embedded ones
otherwise (as the demo). The benchmark TRUNCATEs the job tables of that
database: never point it at one you care about. Prints a table on stderr and
one JSON line on stdout (``--out`` also writes it to a file).

CPU is read from /proc/<pid>/stat (user + system) before and after each measured
part, for the processes on this machine: ``postgres`` is this database's backends
and the backends that exited meanwhile (the postmaster's reaped children: a pool process
drops its connection every ``CELERY_DB_REUSE_MAX`` tasks, and a backend's CPU would go
with it; on a shared server other databases' exited backends count too), ``pg_aux``
the server's background processes (walwriter, checkpointer, ...), shared
with any other database of the server, as ``broker`` (redis-server) is with other
Redis dbs: on a shared server those two count others' work too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "example_project")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
os.environ.setdefault("CRON_AT_SCALE_DATA_DIR", str(ROOT / ".demo-data"))

WORKLOADS = ("ceiling", "w3", "overhead", "w1", "w2", "eta", "lag")
SIZES = {
    "default": {"jobs": 20_000, "burst": 100_000, "general": 5_000, "overhead": 6_000, "rates": "500,2000",
                "duration": 60.0, "duration_high": 20.0, "eta_jobs": 20_000, "future": 1_000_000, "many": 200_000, "due": 10_000, "turns": 2},
    "small": {"jobs": 300, "burst": 1_000, "general": 100, "overhead": 300, "rates": "50", "duration": 3.0, "duration_high": 3.0,
              "eta_jobs": 300, "future": 20_000, "many": 2_000, "due": 300, "turns": 1},
}
OVERHEAD_ROUNDS = 3  # plain and scheduled in turn, each this many times
OVERHEAD_QUEUES = ("bench_plain", "bench_scheduled")  # one each: a BRPOP in flight at cancel_consumer takes no message of the other
CEILING_LIST = "bench_ceiling"
TASK = "demo.tasks.noop"
# A UUIDv7 (RFC 9562) in SQL, as cron_at_scale.ids makes job ids: PostgreSQL 15 has no uuidv7().
UUID7_SQL = ("encode(set_byte(overlay(uuid_send(gen_random_uuid()) placing substring(int8send("
             "(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) FROM 1 FOR 6), 6, "
             "(get_byte(uuid_send(gen_random_uuid()), 6) & 15) | 112), 'hex')::uuid")


CLK_TCK = os.sysconf("SC_CLK_TCK")
# CPU groups: this process (the in-process dispatcher of ceiling), celery worker parents, their pool
# children, this database's PostgreSQL backends, the server's background processes (walwriter,
# checkpointer...: shared with the other databases of the server), the broker (redis-server).
CPU_GROUPS = ("dispatcher", "worker", "pool", "postgres", "pg_aux", "broker")


def proc_stat(pid: int) -> tuple[int, float, float, str] | None:
    """(ppid, CPU seconds used (user + system), CPU seconds of its reaped children, cmdline) of process
    ``pid`` from /proc; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # after "(comm)": field 3 on
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return (int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK,
            (int(fields[13]) + int(fields[14])) / CLK_TCK, cmdline)


def cpu_ms_per(before: dict, after: dict, n: int, groups=CPU_GROUPS) -> dict[str, float]:
    """CPU ms per item of each of ``groups`` (and their ``total``) between two ``Bench.cpu_now()``
    samples, ``n`` items done in between; {} when ``n`` is 0.
    A process started in between counts whole; one that exited in between counts through its parent's
    reaped children (a pool process's, PostgreSQL's backends under the postmaster), less what it had
    used before the window."""
    if not n:
        return {}
    def used(g: str) -> float:
        # A process that exited in between counts in its parent's reaped total (a negative pid) with its
        # whole life: take off what it had used before this window.
        # (The postmaster's reaped total is in "postgres"; its exited children were "postgres" or "pg_aux".)
        shares = ("postgres", "pg_aux") if g == "postgres" else (g,)
        gone = sum(cpu for h in shares if h in before for pid, cpu in before[h].items()
                   if pid > 0 and pid not in after[h])
        return sum(cpu - before[g].get(pid, 0.0) for pid, cpu in after[g].items()) - gone

    out = {g: round(1000 * used(g) / n, 3) for g in groups if after[g]}
    out["total"] = round(sum(out.values()), 3)
    return out


def cpu_text(cpu: dict) -> str:
    """The groups that used CPU, "group 0.123" in ms per item."""
    return "CPU ms each: " + ", ".join(f"{g} {v:.3f}" for g, v in cpu.items() if v) if cpu else ""


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def load_future_rows(q, base, first: int, n: int) -> bool:
    """Insert ``n`` future jobs of TASK (args ``[first]``…) by ``INSERT … SELECT``, one million a
    statement, due within 30 days of ``base``; from 500,000 rows on, as a bulk load does, the
    secondary indexes (not constraints) are dropped first and built after. ``q`` runs one
    statement. Returns whether the indexes were rebuilt."""
    t0 = time.perf_counter()
    indexes = []
    if n >= 500_000:
        indexes = q("""SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.tablename = 'cron_at_scale_job'
                       AND NOT EXISTS (SELECT 1 FROM pg_constraint c
                                       WHERE c.conindid = (quote_ident(i.indexname))::regclass)""")
        for name, _ in indexes:
            q(f'DROP INDEX "{name}"')
    try:
        for start in range(0, n, 1_000_000):
            chunk = min(1_000_000, n - start)
            q("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options)
                 SELECT """ + UUID7_SQL + """, %s + make_interval(secs => (i %% 2592000)),
                        %s, jsonb_build_object('args', jsonb_build_array(i), 'kwargs', '{}'::jsonb), '{}'
                 FROM generate_series(%s, %s) AS i""", [base, TASK, first + start, first + start + chunk - 1])
            say(f"  {first + start + chunk:,} future jobs ({time.perf_counter() - t0:.0f}s)")
    finally:
        if indexes:
            q("SET maintenance_work_mem = '256MB'")
            for _, definition in indexes:
                q(definition)
    return bool(indexes)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--size", choices=sorted(SIZES), default="default", help="preset sizes (flags below override)")
    p.add_argument("--only", help=f"comma-separated workloads among {','.join(WORKLOADS)} (default all)")
    p.add_argument("--jobs", type=int, help="W1 and ceiling: jobs due at one instant (20000)")
    p.add_argument("--burst", type=int, help="burst due at one instant, firing path alone (100000)")
    p.add_argument("--general", type=int, help="jobs through kombu's general publish path (5000)")
    p.add_argument("--overhead", type=int, help="jobs per side and round of the worker-overhead comparison (6000)")
    p.add_argument("--rates", help="W2 rates, jobs/s, comma-separated (500,2000)")
    p.add_argument("--duration", type=float, help="W2 (first rate) and ETA spread: seconds of steady stream (60)")
    p.add_argument("--duration-high", type=float, help="W2, the other rates: seconds of steady stream (20; two "
                   "workers cannot keep up with 2000/s, so a longer stream only measures their backlog)")
    p.add_argument("--eta-jobs", type=int, help="Celery ETA jobs due at one instant (20000)")
    p.add_argument("--eta-leads", help="lag: the dispatcher's ETA_LEAD values, comma-separated (0 and the setting's)")
    p.add_argument("--turns", type=int, help="lag: rounds of ours and Celery ETA in turn (2)")
    p.add_argument("--stream-lead", type=float, default=1.0,
                   help="lag: seconds before its ETA each apply_async(eta=...) of the stream is sent (1.0)")
    p.add_argument("--future", type=int, help="W3: future jobs in the table (1000000; the issue's figure is 10000000)")
    p.add_argument("--many", type=int, help="W3: jobs inserted with schedule_many to time it (200000)")
    p.add_argument("--due", type=int, help="W3: due jobs fired beside the future ones (10000)")
    p.add_argument("--broker", default=os.environ.get("CELERY_RABBITMQ_URL") or None,
                   help="ceiling: also fire to this RabbitMQ (amqp://...) beside the main broker "
                        "(default: CELERY_RABBITMQ_URL)")
    p.add_argument("--workers", type=int, default=2, help="celery worker processes (2)")
    p.add_argument("--concurrency", type=int, default=1, help="prefork children per worker (1)")
    p.add_argument("--batch-size", type=int, help="dispatcher batch size (default: the setting, 1000)")
    p.add_argument("--png-dir", default=str(ROOT / "bench" / "results"), help="where the lag PNG goes")
    p.add_argument("--out", help="also write the JSON line to this file")
    args = p.parse_args(argv)
    for key, value in SIZES[args.size].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.rates = [int(r) for r in str(args.rates).split(",") if r.strip()]
    args.eta_leads = [float(x) for x in args.eta_leads.split(",") if x.strip()] if args.eta_leads else None
    args.only = [w.strip() for w in args.only.split(",")] if args.only else list(WORKLOADS)
    unknown = set(args.only) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    return args


def rate(n: float, seconds: float | None) -> float | None:
    return round(n / seconds, 1) if seconds else None


def django_up():
    """``django.setup()``, ``migrate``, and the Celery app with its tasks loaded:
    ``(connection, broker URL, app)``."""
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from cron_at_scale.celery_app import get_app

    call_command("migrate", verbosity=0)
    app = get_app()
    app.loader.import_default_modules()
    return connection, settings.CELERY_BROKER_URL, app


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.connection, self.broker_url, self.app = django_up()
        self.broker = self.app.connection_for_write()
        self.broker.ensure_connection(max_retries=3)
        self.redis = self.broker.default_channel.client
        # The server processes whose CPU is read: none when the service runs on another machine.
        (backend,), = self.q("SELECT pg_backend_pid()")
        stat = proc_stat(backend)
        self.postmaster = stat[0] if stat and "postgres" in stat[3] else None
        redis_pid = int(self.redis.info("server")["process_id"])
        stat = proc_stat(redis_pid)
        self.redis_pid = redis_pid if stat and "redis" in stat[3] else None
        self.procs = None
        self.worker_names: list[str] = []
        self.dispatcher_running: float | None | bool = False  # False, or the --eta-lead it runs with

    # -- database helpers -------------------------------------------------------------------

    def q(self, sql: str, params=()):
        with self.connection.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def db_now(self):
        return self.q("SELECT statement_timestamp()")[0][0]

    def reset(self) -> None:
        """Empty the job tables and the bench's broker queues (workers idle, nothing in flight)."""
        from django.db import OperationalError

        # A worker's last completions may still be committing; TRUNCATE can lose a deadlock to them.
        for tries_left in range(20, -1, -1):
            try:
                self.q("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_job, demo_execution")
                break
            except OperationalError:
                if not tries_left:
                    raise
                time.sleep(0.25)
        self.redis.delete("celery", *OVERHEAD_QUEUES, CEILING_LIST)

    def insert_due(self, n: int, queue: str = "") -> None:
        """``n`` one-off jobs, all due at one instant (one statement, so one commit makes them all due)."""
        self.q("""INSERT INTO cron_at_scale_job (id, fire_at, task, payload, options, queue)
                  SELECT """ + UUID7_SQL + """, statement_timestamp() - interval '1 millisecond', %s,
                         jsonb_build_object('args', jsonb_build_array(i), 'kwargs', '{}'::jsonb), '{}', %s
                  FROM generate_series(1, %s) AS i""", [TASK, queue, n])

    def lag_stats(self, values_sql: str, params=()) -> dict:
        """p50/p95/p99/max (ms) of the one-column query ``values_sql`` (values in ms)."""
        (n, pcts, mx), = self.q(f"""SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY v),
                                          max(v) FROM ({values_sql}) AS s(v)""", params)
        if not n:
            return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
        return {"n": n, "p50": round(pcts[0], 1), "p95": round(pcts[1], 1), "p99": round(pcts[2], 1),
                "max": round(float(mx), 1)}

    def wait_for(self, sql: str, want: int, timeout: float, params=()) -> int:
        deadline = time.monotonic() + timeout
        got = 0
        while time.monotonic() < deadline:
            (got,), = self.q(sql, params)
            if got >= want:
                return got
            time.sleep(0.2)
        say(f"  timed out after {timeout:.0f}s waiting: {got}/{want}")
        return got

    def cpu_now(self) -> dict[str, dict[int, float]]:
        """CPU seconds (user + system) used so far by each process of ``CPU_GROUPS``, as {group: {pid:
        seconds}}; a worker parent's reaped children count in ``pool`` under its negated pid."""
        out: dict[str, dict[int, float]] = {g: {} for g in CPU_GROUPS}
        parents = {p.pid for p in self.procs.procs if p.name.startswith("bench-w")} if self.procs else set()
        others = {p.pid for p in self.procs.procs} - parents if self.procs else set()  # a cron_dispatcher
        db = self.connection.settings_dict["NAME"]
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = proc_stat(pid)
            if stat is None:
                continue
            ppid, cpu, reaped, cmdline = stat
            if pid == os.getpid() or pid in others:
                out["dispatcher"][pid] = cpu
            elif pid in parents:
                out["worker"][pid] = cpu
                out["pool"][-pid] = reaped
            elif ppid in parents:
                out["pool"][pid] = cpu
            elif pid == self.redis_pid:
                out["broker"][pid] = cpu
            elif pid == self.postmaster:  # backends that exited: a pool process reconnects every
                out["postgres"][-pid] = reaped  # CELERY_DB_REUSE_MAX tasks (any database's, on a shared server)
            elif ppid == self.postmaster and self.postmaster:
                words = cmdline.split()
                if db in words:  # a backend ("user db host(port) state") or an autovacuum worker of this database
                    out["postgres"][pid] = cpu
                elif not any("(" in w for w in words):  # not another database's backend
                    out["pg_aux"][pid] = cpu
        return out

    # -- the firing path in this process ------------------------------------------------------

    def dispatcher(self, app=None):
        from cron_at_scale.dispatcher import Dispatcher

        # no workers here: fire into queues nobody consumes (the ceiling is the claim + publish)
        return Dispatcher(name="bench-inproc", batch_size=self.args.batch_size, app=app, hold_unconsumed=False)

    def fire_in_process(self, n: int, send=None, app=None, seen=None) -> tuple[int, float]:
        """Claim (and publish, or ``send``) ``n`` due jobs with one in-process dispatcher (on ``app``'s
        broker); (claimed, seconds). ``seen(dispatcher)`` is called before it closes."""
        d = self.dispatcher(app)
        d.publisher._connection()  # connect before the clock starts
        done = 0
        t0 = time.perf_counter()
        while done < n:
            if send is None:
                got = d.tick(wait=False)  # as the dispatcher's loop: the next claim overlaps this publish
            else:
                batch = d.claim()
                got = len(batch)
                if batch:
                    send(d, batch)
            if not got:
                break
            done += got
        d.sender.wait()  # all published
        seconds = time.perf_counter() - t0
        if seen is not None:
            seen(d)
        self.close_dispatcher(d)
        return done, seconds

    def fire_measured(self, n: int, send=None) -> tuple[int, float, dict]:
        """``fire_in_process`` and the CPU ms per job it cost, by group (``cpu_ms_per``)."""
        before = self.cpu_now()
        got, seconds = self.fire_in_process(n, send=send)
        return got, seconds, cpu_ms_per(before, self.cpu_now(), got)

    @staticmethod
    def close_dispatcher(d) -> None:
        close = getattr(d, "close", None)  # gives back shard leases where the dispatcher has them
        close() if close else d.publisher.close()

    # -- processes -------------------------------------------------------------------------

    def start_workers(self) -> None:
        if self.procs is not None:
            return
        from demo.runner import Processes, child_env, database_url, wait_for_workers

        env = child_env(database_url(self.connection.settings_dict), self.broker_url)
        self.procs = Processes(env, log_dir=ROOT / "bench" / "results" / "logs")
        names = [f"bench-w{i}" for i in range(self.args.workers)]
        for name in names:
            self.procs.worker(name, concurrency=self.args.concurrency, extra=["--include", "bench.tasks"])
        wait_for_workers(self.app, names)
        host = socket.gethostname()
        self.worker_names = [f"{n}@{host}" for n in names]

    def start_dispatcher(self, eta_lead: float | None = None) -> None:
        """Start the ``cron_dispatcher`` process (again, if it runs with another ``--eta-lead``)."""
        if self.dispatcher_running is not False and self.dispatcher_running != eta_lead:
            for p in [p for p in self.procs.procs if p.name == "bench-d"]:
                p.terminate()
                p.wait(30)
                self.procs.procs.remove(p)
            self.dispatcher_running = False
        if self.dispatcher_running is False:
            extra = ["--batch-size", str(self.args.batch_size)] if self.args.batch_size else []
            if eta_lead is not None:
                extra += ["--eta-lead", str(eta_lead)]
            self.procs.dispatcher("bench-d", extra=extra)
            self.dispatcher_running = eta_lead
            # Ready when it has fired one job and a worker has run it.
            self.reset()
            self.insert_due(1)
            self.wait_for("SELECT count(*) FROM cron_at_scale_jobattempt WHERE finished_at IS NOT NULL", 1, 120)
            self.reset()

    def stop(self) -> None:
        if self.procs is not None:
            self.procs.stop()
            self.procs = None

    # -- workloads -------------------------------------------------------------------------

    def ceiling(self) -> dict:
        a = self.args
        out: dict = {}
        self.reset()
        self.insert_due(a.jobs)

        def lpush(d, batch):
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.lpush(CEILING_LIST, *[str(c.job_id) for c in batch])
                pipe.execute()

        n, s, cpu = self.fire_measured(a.jobs, send=lpush)
        out["ceiling"] = {"jobs": n, "seconds": round(s, 3), "jobs_per_s": rate(n, s), "cpu_ms_per_job": cpu}
        say(f"ceiling: claim + raw LPUSH       {n} jobs in {s:.2f}s = {n / s:,.0f} jobs/s; {cpu_text(cpu)}")

        self.reset()
        self.insert_due(a.jobs)
        n, s, cpu = self.fire_measured(a.jobs)
        on_broker = self.redis.llen("celery")
        out["firing"] = {"jobs": n, "seconds": round(s, 3), "jobs_per_s": rate(n, s), "on_broker": on_broker,
                         "cpu_ms_per_job": cpu}
        out["firing"]["ratio_to_ceiling"] = round(out["firing"]["jobs_per_s"] / out["ceiling"]["jobs_per_s"], 3)
        say(f"firing path: claim + publish     {n} jobs in {s:.2f}s = {n / s:,.0f} jobs/s ({on_broker} on the broker); "
            f"{cpu_text(cpu)}")

        self.reset()
        self.insert_due(a.burst)
        n, s, cpu = self.fire_measured(a.burst)
        on_broker = self.redis.llen("celery")
        out["burst"] = {"jobs": n, "seconds": round(s, 3), "jobs_per_s": rate(n, s), "on_broker": on_broker,
                        "cpu_ms_per_job": cpu}
        say(f"burst: {n} due at one instant    all on the broker after {s:.2f}s ({on_broker} messages); {cpu_text(cpu)}")

        self.reset()
        self.insert_due(a.general)
        n, s = self.fire_in_process(a.general, send=lambda d, batch: d.publisher._send_tasks(batch))
        out["general_path"] = {"jobs": n, "seconds": round(s, 3), "jobs_per_s": rate(n, s),
                               "on_broker": self.redis.llen("celery")}
        say(f"kombu general path (send_task)   {n} jobs in {s:.2f}s = {n / s:,.0f} jobs/s")
        self.reset()
        if a.broker:
            out["rabbitmq"] = self.ceiling_rabbitmq(a.broker)
        return out

    def ceiling_rabbitmq(self, url: str, rounds: int = 3) -> dict:
        """The firing path and kombu's general path to the RabbitMQ at ``url``: medians of ``rounds``."""
        from celery import Celery

        a = self.args
        app = Celery("bench-rabbitmq", set_as_current=False)
        app.config_from_object("django.conf:settings", namespace="CELERY")
        app.conf.broker_write_url = app.conf.broker_read_url = url  # CELERY_BROKER_URL would win over broker_url
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=3)
            app.amqp.default_queue(conn.default_channel).declare()

        def depth() -> int:
            with app.connection_for_write() as conn:
                return conn.default_channel.queue_declare("celery", passive=True).message_count

        def purge() -> None:
            with app.connection_for_write() as conn:
                conn.default_channel.queue_purge("celery")

        out: dict = {"url": re.sub(r"//[^@/]*@", "//", url)}
        for name, jobs, general in (("firing", a.jobs, False), ("general_path", a.general, True)):
            runs = []
            for _ in range(rounds):
                self.reset()
                purge()
                self.insert_due(jobs)
                waited: list[float] = []
                send = (lambda d, batch: d.publisher._send_tasks(batch)) if general else None
                amqp_fast = lambda d: waited.append(getattr(d.publisher._amqp, "confirm_seconds", 0.0))  # noqa: E731,B023
                n, s = self.fire_in_process(jobs, send=send, app=app, seen=amqp_fast)
                runs.append({"jobs": n, "seconds": round(s, 3), "jobs_per_s": rate(n, s), "on_broker": depth(),
                             "confirm_wait_seconds": None if general else round(waited[0], 3)})
            purge()
            best = sorted(runs, key=lambda r: r["jobs_per_s"] or 0)[len(runs) // 2]
            out[name] = {**best, "rounds_jobs_per_s": [r["jobs_per_s"] for r in runs]}
            label = "firing path (confirms)" if not general else "kombu general path (send_task)"
            extra = f", waiting for confirms {best['confirm_wait_seconds']:.2f}s" if not general else ""
            say(f"rabbitmq {label:30} {best['jobs']} jobs in {best['seconds']:.2f}s = {best['jobs_per_s']:,.0f} jobs/s "
                f"(median of {', '.join(f'{r:,.0f}' for r in out[name]['rounds_jobs_per_s'])}; "
                f"{best['on_broker']} on the broker{extra})")
        self.reset()
        return out

    def w3(self) -> dict:
        a = self.args
        out: dict = {"future": a.future, "due": a.due}

        def fire_due() -> float:
            self.insert_due(a.due)
            n, s = self.fire_in_process(a.due)
            self.redis.delete("celery")
            return n / s

        self.reset()
        empty = []
        for _ in range(3):
            self.q("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_job")
            empty.append(fire_due())
        out["empty_jobs_per_s"] = round(max(empty), 1)
        say(f"w3: {a.due} due, empty table         {max(empty):,.0f} jobs/s (best of 3: {', '.join(f'{x:,.0f}' for x in empty)})")

        # schedule_many (COPY) rate, into the table that then gets the rest of the future jobs.
        self.reset()
        import cron_at_scale

        many = min(a.many, a.future)
        base = self.db_now() + timedelta(days=1)
        t0 = time.perf_counter()
        for start in range(0, many, 50_000):
            cron_at_scale.schedule_many([{"task": TASK, "args": [i], "at": base + timedelta(milliseconds=i)}
                                         for i in range(start, min(many, start + 50_000))])
        s = time.perf_counter() - t0
        out["schedule_many"] = {"jobs": many, "seconds": round(s, 2), "jobs_per_s": rate(many, s)}
        say(f"w3: schedule_many                  {many} jobs in {s:.1f}s = {many / s:,.0f} jobs/s")

        t0 = time.perf_counter()
        rest = a.future - many
        rebuild = load_future_rows(self.q, base, many, rest)
        self.q("VACUUM ANALYZE cron_at_scale_job")
        s = time.perf_counter() - t0
        out["bulk_load"] = {"jobs": rest, "seconds": round(s, 1), "indexes_rebuilt": rebuild}
        (total,), = self.q("SELECT count(*) FROM cron_at_scale_job")
        out["rows"] = total
        say(f"w3: bulk load of {rest:,} more        {s:.0f}s (indexes rebuilt: {rebuild}); {total:,} pending rows")

        plan = self.explain_claim()
        out.update(plan)
        say(f"w3: claim plan                     {plan['claim_scan']} using {plan['claim_index']}")
        full = [fire_due() for _ in range(3)]
        out["full_jobs_per_s"] = round(max(full), 1)
        out["ratio"] = round(max(full) / max(empty), 3)
        say(f"w3: {a.due} due beside {total:,}    {max(full):,.0f} jobs/s (best of 3: "
            f"{', '.join(f'{x:,.0f}' for x in full)}) = {out['ratio']:.2f} x empty")
        self.reset()
        self.q("VACUUM ANALYZE cron_at_scale_job")
        return out

    def explain_claim(self) -> dict:
        """EXPLAIN the claim statement exactly as a dispatcher sends it (captured, explained, then run)."""
        plan: list[str] = []

        def capture(execute, sql, params, many, context):
            # the prepared claim's EXECUTE, or its text with PREPARED_STATEMENTS off (not the PREPARE)
            claim = "EXECUTE cas_claim(" in sql or (
                "SKIP LOCKED" in sql and re.search(r"FROM cron_at_scale_job\b", sql) and "PREPARE " not in sql)
            if not plan and claim:
                execute("EXPLAIN " + sql, params, many, context)
                plan.extend(r[0] for r in context["cursor"].fetchall())
            return execute(sql, params, many, context)

        self.insert_due(1)
        d = self.dispatcher()
        with self.connection.execute_wrapper(capture):
            d.claim()
        self.close_dispatcher(d)
        self.q("TRUNCATE cron_at_scale_jobattempt")
        self.q("DELETE FROM cron_at_scale_job WHERE status <> 'pending'")
        scan, index = "?", None
        for line in plan:  # the scan of the due rows: the jobs table without an alias
            m = re.search(r"((?:Index Only |Index |Bitmap Heap |Seq )Scan)(?: Backward)?(?: using (\S+))? on cron_at_scale_job\s+\(", line)
            if m:
                scan, index = m.group(1), m.group(2)
                break
        if index is None and scan == "Bitmap Heap Scan":
            m = re.search(r"Bitmap Index Scan on (\S+)", "\n".join(plan))
            index = m.group(1) if m else None
        return {"claim_scan": scan, "claim_index": index, "index_scan": scan.startswith("Index"), "claim_plan": plan}

    def overhead(self) -> dict:
        """Plain and scheduled rounds taken in turn (``OVERHEAD_ROUNDS`` of each), so a drift of the
        machine's speed over the minutes of the run weighs on both sides; ratio of the medians."""
        a = self.args
        self.start_workers()
        self.reset()
        out: dict = {"jobs": a.overhead, "workers": a.workers * a.concurrency, "rounds": OVERHEAD_ROUNDS}
        plain, scheduled, db_rates, completed = [], [], [], []
        cpu_plain, cpu_scheduled = [], []  # CPU ms per task by group, from the first message taken to the last done
        groups = [g for g in CPU_GROUPS if g != "dispatcher"]  # this process only polls the queue

        def cpu_since(before: dict, n: int) -> dict:
            return cpu_ms_per(before, self.cpu_now(), n, groups)

        for _ in range(OVERHEAD_ROUNDS):
            with self.app.producer_or_acquire() as producer:
                for _ in range(a.overhead):
                    self.app.send_task(TASK, queue=OVERHEAD_QUEUES[0], producer=producer)
            before = self.cpu_now()
            plain.append(self.consume(OVERHEAD_QUEUES[0], a.overhead))
            cpu_plain.append(cpu_since(before, a.overhead))

            self.insert_due(a.overhead, queue=OVERHEAD_QUEUES[1])
            self.fire_in_process(a.overhead)
            before = self.cpu_now()
            scheduled.append(self.consume(OVERHEAD_QUEUES[1], a.overhead))
            got = self.wait_for("SELECT count(*) FROM cron_at_scale_jobattempt WHERE finished_at IS NOT NULL",
                                a.overhead, 30)
            cpu_scheduled.append(cpu_since(before, got))
            (span,), = self.q("SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM cron_at_scale_jobattempt")
            db_rates.append(rate(got, float(span or 0)))
            completed.append(got)
            say(f"overhead: plain send_task noop {plain[-1]:,.0f}, scheduled noop {scheduled[-1]:,.0f} completions/s "
                f"(database clock: {db_rates[-1]}; {got} completed) = {scheduled[-1] / plain[-1]:.2f} x plain")
            say(f"  plain     {cpu_text(cpu_plain[-1])}")
            say(f"  scheduled {cpu_text(cpu_scheduled[-1])}")
            self.reset()
        out["plain_jobs_per_s"] = statistics.median(plain)
        out["scheduled_jobs_per_s"] = statistics.median(scheduled)
        out["rounds_plain"], out["rounds_scheduled"], out["rounds_scheduled_db"] = plain, scheduled, db_rates
        out["scheduled_completed"] = min(completed)  # of the jobs of each round
        out["ratio"] = round(out["scheduled_jobs_per_s"] / out["plain_jobs_per_s"], 3)
        out["rounds_cpu_plain"], out["rounds_cpu_scheduled"] = cpu_plain, cpu_scheduled
        out["cpu_ms_per_task"] = {side: {g: statistics.median(r[g] for r in rounds) for g in rounds[0]}
                                  for side, rounds in (("plain", cpu_plain), ("scheduled", cpu_scheduled))}
        say(f"overhead: medians {out['plain_jobs_per_s']:,.0f} plain, {out['scheduled_jobs_per_s']:,.0f} scheduled "
            f"= {out['ratio']:.2f} x plain")
        return out

    def consume(self, queue: str, n: int) -> float:
        """Let the workers consume the pre-loaded ``queue``: completions/s from the first message taken
        until the queue and the unacked set are empty (Celery acks a message as a pool child accepts it)."""
        self.app.control.add_consumer(queue, reply=True, destination=self.worker_names)
        deadline = time.perf_counter() + max(60, n / 50)
        t0 = None
        while time.perf_counter() < deadline:
            left = self.redis.llen(queue)
            if t0 is None and left < n:
                t0 = time.perf_counter()
            if left == 0 and self.redis.hlen("unacked") == 0:
                break
            time.sleep(0.002)
        s = time.perf_counter() - (t0 or deadline)
        self.app.control.cancel_consumer(queue, reply=True, destination=self.worker_names)
        return round(n / s, 1)

    def w1(self) -> dict:
        import cron_at_scale

        a = self.args
        self.start_workers()
        self.reset()
        self.start_dispatcher()
        later = self.db_now() + timedelta(hours=1)
        for start in range(0, a.jobs, 10_000):
            cron_at_scale.schedule_many([{"task": TASK, "at": later}] * min(10_000, a.jobs - start))
        # All due at one instant; the rates count from it, not from a clock read after the commit (a
        # small batch can be fired before such a read).
        (visible,), = self.q("""WITH due AS (UPDATE cron_at_scale_job SET fire_at = statement_timestamp()
                                             RETURNING fire_at)
                                SELECT max(fire_at) FROM due""")
        got = self.wait_for("SELECT count(*) FROM cron_at_scale_jobattempt WHERE finished_at IS NOT NULL",
                            a.jobs, max(120, a.jobs / 100))
        (dispatched, finished), = self.q("""SELECT extract(epoch FROM max(dispatched_at) - %s),
                                                   extract(epoch FROM max(finished_at) - %s)
                                            FROM cron_at_scale_jobattempt""", [visible, visible])
        out = {"jobs": a.jobs, "completed": got, "workers": a.workers * a.concurrency,
               "firing_jobs_per_s": rate(got, float(dispatched or 0)),
               "completion_jobs_per_s": rate(got, float(finished or 0)),
               "dispatch_lag_ms": self.lag_stats("SELECT extract(epoch FROM dispatched_at - scheduled_at) * 1000 "
                                               "FROM cron_at_scale_jobattempt"),
               "start_lag_ms": self.lag_stats("SELECT extract(epoch FROM started_at - scheduled_at) * 1000 "
                                              "FROM cron_at_scale_jobattempt WHERE started_at IS NOT NULL")}
        say(f"w1: {a.jobs} due at one instant    firing {out['firing_jobs_per_s']:,} jobs/s, completion "
            f"{out['completion_jobs_per_s']:,} jobs/s, start lag p50 {out['start_lag_ms']['p50']} ms "
            f"p99 {out['start_lag_ms']['p99']} ms")
        self.reset()
        return out

    def spread_schedule(self, n: int, per_s: int) -> tuple:
        """Schedule ``n`` jobs, ``per_s`` per second, starting a little after they are all inserted; (start, end)."""
        import cron_at_scale

        # Inserted at their final fire_at (not shifted by an UPDATE afterwards: 30,000 dead rows
        # and the autovacuum they call for would be the first seconds' lag), with a lead that
        # covers the insert (schedule_many: tens of thousands a second).
        lead = 2.0 + n / 10_000
        base = self.db_now() + timedelta(seconds=lead)
        for start in range(0, n, 10_000):
            cron_at_scale.schedule_many([{"task": TASK, "at": base + timedelta(seconds=i / per_s)}
                                         for i in range(start, min(n, start + 10_000))])
        (first, last, early), = self.q("SELECT min(fire_at), max(fire_at), min(fire_at) < statement_timestamp() "
                                       "FROM cron_at_scale_job")
        if early:
            say("  warning: the stream started before its jobs were committed (slow box): early lags inflated")
        return first, last

    def w2(self, per_s: int, duration: float, eta_lead: float | None = None) -> dict:
        self.start_workers()
        self.reset()
        self.start_dispatcher(eta_lead)
        n = int(per_s * duration)
        first, last = self.spread_schedule(n, per_s)
        wait = (last - self.db_now()).total_seconds()
        say(f"w2: {per_s}/s for {duration:.0f}s ({n} jobs) starts in {(first - self.db_now()).total_seconds():.1f}s")
        time.sleep(max(0.0, wait))
        got = self.wait_for("SELECT count(*) FROM cron_at_scale_jobattempt WHERE started_at IS NOT NULL", n,
                            max(120, n / 200))
        out = {"rate": per_s, "seconds": duration, "jobs": n, "started": got, "eta_lead": eta_lead,
               "dispatch_lag_ms": self.lag_stats("SELECT extract(epoch FROM dispatched_at - scheduled_at) * 1000 "
                                               "FROM cron_at_scale_jobattempt"),
               "start_lag_ms": self.lag_stats("SELECT extract(epoch FROM started_at - scheduled_at) * 1000 "
                                              "FROM cron_at_scale_jobattempt WHERE started_at IS NOT NULL")}
        out["series"] = [list(r) for r in self.q("""
            SELECT floor(extract(epoch FROM scheduled_at - %s))::int,
                   percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM dispatched_at - scheduled_at) * 1000),
                   percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - scheduled_at) * 1000)
            FROM cron_at_scale_jobattempt WHERE started_at IS NOT NULL GROUP BY 1 ORDER BY 1""", [first])]
        f, s = out["dispatch_lag_ms"], out["start_lag_ms"]
        say(f"w2: {per_s}/s{'' if eta_lead is None else f' eta lead {eta_lead:g}s'}  dispatch lag p50 {f['p50']} p95 {f['p95']} p99 {f['p99']} max {f['max']} ms; "
            f"start lag p50 {s['p50']} p95 {s['p95']} p99 {s['p99']} max {s['max']} ms")
        self.reset()
        return out

    def eta(self) -> dict:
        a = self.args
        self.start_workers()
        out = {"burst": self._eta(a.eta_jobs, None)}
        if a.rates:
            out["spread"] = self._eta(int(a.rates[0] * a.duration), a.rates[0])
        return out

    def lag(self) -> dict:
        """W2 with each ETA lead and a Celery ETA stream at the same rate, in turns (see the module doc)."""
        from cron_at_scale import conf

        a = self.args
        leads = a.eta_leads or sorted({0.0, conf.eta_lead(conf.values())})
        per_s = a.rates[0]
        turns, series = [], []  # per turn: start lag per side; its per-second p50/p99
        for turn in range(a.turns):
            say(f"lag: turn {turn + 1} of {a.turns}")
            runs = {f"ours_lead_{lead:g}": self.w2(per_s, a.duration, lead) for lead in leads}
            runs["celery_eta"] = self._eta(int(per_s * a.duration), per_s, stream=a.stream_lead)
            turns.append({side: run["start_lag_ms"] for side, run in runs.items()})
            series.append({side: run.get("series") for side, run in runs.items()})
        out: dict = {"rate": per_s, "seconds": a.duration, "jobs": int(per_s * a.duration), "stream_lead": a.stream_lead,
                     "turns": turns, "series": series, "median": {}}
        for side in turns[0]:
            out["median"][side] = {k: statistics.median(t[side][k] for t in turns) for k in ("p50", "p99")}
            m = out["median"][side]
            say(f"lag: {side:20} start lag p50 {m['p50']} ms, p99 {m['p99']} ms (median of {len(turns)} turns)")
        return out

    def _eta(self, n: int, per_s: int | None, stream: float | None = None) -> dict:
        """Celery's ETA path: ``n`` ``apply_async(eta=...)``, ``per_s`` a second (else all at one instant);
        all sent beforehand, or each ``stream`` seconds before its ETA."""
        self.reset()
        lead = 3.0 + (0 if stream else n / 1_000)
        start = self.db_now() + timedelta(seconds=lead)
        etas = [start + timedelta(seconds=(i / per_s if per_s else 0)) for i in range(n)]
        with self.app.producer_or_acquire() as producer:
            if stream is None:
                for i, eta in enumerate(etas):
                    self.app.send_task("bench.stamp", args=[i, eta.isoformat()], eta=eta, producer=producer)
            else:  # sent in 5 ms slices, each message `stream` seconds before its ETA (database clock)
                db0, mono0 = self.db_now(), time.monotonic()
                behind = 0.0
                for i, eta in enumerate(etas):
                    send_at = mono0 + (eta - db0).total_seconds() - stream
                    if send_at > time.monotonic():
                        time.sleep(max(send_at - time.monotonic(), 0.005))
                    behind = max(behind, time.monotonic() - send_at)
                    self.app.send_task("bench.stamp", args=[i, eta.isoformat()], eta=eta, producer=producer)
        late = (behind >= stream) if stream else self.db_now() > start
        if late:
            say("  warning: ETA messages were still being sent when the first fell due")
        time.sleep(max(0.0, (etas[-1] - self.db_now()).total_seconds()))
        got = self.wait_for("SELECT count(*) FROM demo_execution", n, max(120, n / 100))
        (span,), = self.q("SELECT extract(epoch FROM max(executed_at) - %s) FROM demo_execution", [start])
        out = {"jobs": n, "rate": per_s, "executed": got, "sent_late": late,
               "start_lag_ms": self.lag_stats("SELECT extract(epoch FROM executed_at - occurrence) * 1000 FROM demo_execution")}
        if per_s:
            out["series"] = [list(r) for r in self.q("""
                SELECT floor(extract(epoch FROM occurrence - %s))::int,
                       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM executed_at - occurrence) * 1000)
                FROM demo_execution GROUP BY 1 ORDER BY 1""", [start])]
        else:
            out["completion_jobs_per_s"] = rate(got, float(span or 0))
        s = out["start_lag_ms"]
        say(f"celery ETA {f'{per_s}/s' if per_s else f'{n} at one instant'}{' (stream)' if stream else ''}: start lag p50 {s['p50']} "
            f"p99 {s['p99']} max {s['max']} ms" + (f", {out['completion_jobs_per_s']:,} jobs/s" if not per_s else ""))
        self.reset()
        return out


# -- output -------------------------------------------------------------------------------


def conf_lead() -> float:
    from cron_at_scale import conf

    return conf.eta_lead(conf.values())


def targets(r: dict) -> list[dict]:
    """The published targets this run measured (docs/benchmarks.md): figure, target, met."""
    out = []

    def add(name, value, op, goal, unit=""):
        if value is None:
            return
        met = value >= goal if op == ">=" else value <= goal if op == "<=" else value < goal
        out.append({"target": name, "value": value, "goal": f"{op} {goal:,}{unit}", "met": met})

    c = r.get("ceiling") or {}
    if c:
        add("firing, one dispatcher (jobs/s)", c["firing"]["jobs_per_s"], ">=", 15_000)
        add("firing / claim+LPUSH ceiling", c["firing"]["ratio_to_ceiling"], ">=", 0.4)
        add("burst: all on the broker (s)", c["burst"]["seconds"], "<", 7, " s")
        if c.get("rabbitmq"):
            add("firing to RabbitMQ, confirmed (jobs/s)", c["rabbitmq"]["firing"]["jobs_per_s"], ">=", 10_000)
    for w in r.get("w2") or []:
        if w["rate"] == 500:
            add("W2 500/s start lag p99 (ms)", w["start_lag_ms"]["p99"], "<", 100)
            add("W2 500/s start lag p50 (ms)", w["start_lag_ms"]["p50"], "<", 20)
    w3 = r.get("w3") or {}
    if w3:
        add("schedule_many (jobs/s)", w3["schedule_many"]["jobs_per_s"], ">=", 100_000)
        add(f"firing beside {w3['rows']:,} rows / empty", w3["ratio"], ">=", 0.9)
        out.append({"target": "claim plan: index scan", "value": f"{w3['claim_scan']} using {w3['claim_index']}",
                    "goal": "index scan", "met": w3["index_scan"]})
    lag = (r.get("lag") or {}).get("median") or {}
    if lag.get("celery_eta"):
        ours = [v for k, v in lag.items() if k.startswith("ours_lead_") and k != "ours_lead_0"]
        mine = lag.get(f"ours_lead_{conf_lead():g}") or (ours[0] if ours else None)
        for q in ("p50", "p99"):
            if mine:  # the setting's lead (else the first non-zero one measured) against Celery ETA
                add(f"lag {r['lag']['rate']}/s: ours start lag {q} (ms)", mine[q], "<=", lag["celery_eta"][q])
        if mine and r["lag"]["rate"] == 500:
            add("W2 500/s with ETA_LEAD: start lag p99 (ms)", mine["p99"], "<", 100)
            add("W2 500/s with ETA_LEAD: start lag p50 (ms)", mine["p50"], "<", 20)
    o = r.get("overhead") or {}
    if o:
        add("worker: scheduled / plain completions", o["ratio"], ">=", 0.7)
    return out


def table(r: dict) -> None:
    say("")
    say(f"{'target':44} {'measured':>28} {'goal':>12}  met")
    for t in r["targets"]:
        value = f"{t['value']:,}" if isinstance(t["value"], (int, float)) else str(t["value"])
        say(f"{t['target']:44} {value:>28} {t['goal']:>12}  {'yes' if t['met'] else 'NO'}")
    cpu_rows = [(f"overhead, {side} (median of {len(o['rounds_cpu_plain'])})", cpu)
                for o in [r.get("overhead") or {}] for side, cpu in (o.get("cpu_ms_per_task") or {}).items()]
    cpu_rows += [(f"ceiling: {k}", (r["ceiling"].get(k) or {}).get("cpu_ms_per_job")) for k in ("ceiling", "firing", "burst")
                 if r.get("ceiling")]
    if cpu_rows:
        say("")
        say(f"{'CPU ms per task / fired job':36}" + "".join(f"{g:>11}" for g in (*CPU_GROUPS, "total")))
        for name, cpu in cpu_rows:
            say(f"{name:36}" + "".join(f"{cpu[g]:>11.3f}" if g in cpu else f"{'-':>11}" for g in (*CPU_GROUPS, "total")))
    say(f"machine: {r['machine']['cpus']} cpus, load average {r['machine']['load_start']} at start, "
        f"{r['machine']['load_end']} at the end")


def draw(r: dict, png_dir: str) -> str | None:
    """Firing and start lag over time (per-second p50/p99) for each W2 rate and for Celery ETA spread."""
    try:
        import matplotlib
    except ImportError:
        say("matplotlib is not installed (pip install -e '.[bench]'): no PNG")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"cron_at_scale, {w['rate']} jobs/s", w["series"], True) for w in r.get("w2") or []]
    spread = (r.get("eta") or {}).get("spread")
    if spread:
        panels.append((f"Celery ETA (apply_async(eta=...)), {spread['rate']} jobs/s", spread["series"], False))
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)), squeeze=False)
    for ax, (title, series, ours) in zip(axes[:, 0], panels, strict=True):
        x = [row[0] for row in series]
        if ours:
            ax.plot(x, [row[1][0] for row in series], label="dispatch lag p50 (claimed - fire_at)", color="tab:blue")
            ax.plot(x, [row[1][1] for row in series], label="dispatch lag p99", color="tab:blue", linestyle="--")
            ax.plot(x, [row[2][0] for row in series], label="start lag p50 (started - fire_at)", color="tab:red")
            ax.plot(x, [row[2][1] for row in series], label="start lag p99", color="tab:red", linestyle="--")
        else:
            ax.plot(x, [row[1][0] for row in series], label="start lag p50 (executed - eta)", color="tab:green")
            ax.plot(x, [row[1][1] for row in series], label="start lag p99", color="tab:green", linestyle="--")
        ax.set_yscale("symlog", linthresh=100)
        ax.set_title(title)
        ax.set_xlabel("fire time (s into the stream)")
        ax.set_ylabel("lag, ms (per second)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    Path(png_dir).mkdir(parents=True, exist_ok=True)
    path = str(Path(png_dir) / "bench-lag.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def code_version() -> str | None:
    """The commit measured, with "+dirty" when cron_at_scale/ has uncommitted changes."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "cron_at_scale"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def main(argv=None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    result: dict = {"size": args.size, "workloads": args.only,
                    "machine": {"cpus": os.cpu_count(), "load_start": [round(x, 2) for x in os.getloadavg()]},
                    "settings": {"workers": args.workers, "concurrency": args.concurrency,
                                 "batch_size": args.batch_size or bench.dispatcher().batch_size}}
    result["code"] = code_version()
    t0 = time.monotonic()
    try:
        for name in WORKLOADS:
            if name not in args.only:
                continue
            say(f"== {name} (load {os.getloadavg()[0]:.2f})")
            if name == "w2":
                result["w2"] = [bench.w2(r, args.duration if i == 0 else args.duration_high)
                                for i, r in enumerate(args.rates)]
            elif name == "w1":
                result["w1"] = bench.w1()
            else:
                result[name] = getattr(bench, name)()
    finally:
        bench.stop()
        bench.reset()
    result["machine"]["load_end"] = [round(x, 2) for x in os.getloadavg()]
    result["seconds"] = round(time.monotonic() - t0, 1)
    result["targets"] = targets(result)
    result["png"] = draw(result, args.png_dir)
    table(result)
    line = json.dumps(result, default=str)
    print(line, flush=True)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
