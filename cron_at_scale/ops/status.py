"""The operator's figures, shared by the admin dashboard, ``cron_status`` and the metrics collector.

Every query here is bounded, whatever the size of the jobs table:

* counts walk an index and stop at a cap (``SELECT count(*) FROM (SELECT 1
  ... LIMIT cap)``); a figure that hit its cap is reported as "at least"
  (``capped`` lists them);
* the "later" bucket of pending jobs is the planner's estimate minus the
  counted buckets (``estimated`` lists it);
* the firing lag is computed over a sample: the latest ``LAG_SAMPLE``
  attempts by id (the primary key walked backwards), those started in the
  last ``window`` seconds.

Times come from the database clock.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from cron_at_scale import conf
from cron_at_scale import sql as db

COUNT_CAP = 100_000  # rows counted per figure before we say "at least"; ~20 ms on an index
DLQ_CAP = 1_000_000  # the dead-letter queue is worth counting further
LAG_SAMPLE = 10_000  # latest attempts the lag percentiles are computed over
# Firing lag: from when the attempt was due, or from when its job was created if that
# is later (a job scheduled at a time already past was not late before anyone asked).
_RECENT_LAGS = """
    FROM (
        SELECT extract(epoch FROM a.started_at - greatest(a.scheduled_at, j.created_at))::float8 AS lag, a.started_at
        FROM (SELECT job_id, scheduled_at, started_at FROM cron_at_scale_jobattempt ORDER BY id DESC LIMIT %s) AS a
        LEFT JOIN cron_at_scale_job AS j ON j.id = a.job_id
    ) AS recent
    WHERE started_at >= statement_timestamp() - make_interval(secs => %s)
"""
_PENDING = "status = 'pending' AND shard = ANY(%s::smallint[])"
DEFAULT_WINDOW = 300.0  # seconds of attempts the lag figures cover
DISPATCHER_SEEN = 60.0  # seconds: a dispatcher that claimed or polled within this is alive
WORKERS_SHOWN = 3600.0  # seconds: workers last seen longer ago are not listed

# (bucket, lower bound, upper bound) as SQL intervals from now; the claim's (shard, fire_at) index of
# pending rows serves each, as one range per shard (shard = ANY(every shard): without it the planner
# would read the whole index for a few overdue rows).
_BUCKET_RANGES = (
    ("overdue", None, "0 seconds"),
    ("next_minute", "0 seconds", "1 minute"),
    ("next_hour", "1 minute", "1 hour"),
    ("next_day", "1 hour", "1 day"),
)


@dataclass
class StatusReport:
    """A snapshot of the scheduler, as the dashboard and ``cron_status --json`` show it (``snapshot()``)."""

    db_now: str
    pending: dict[str, int]
    oldest_overdue_seconds: float  # 0 when no pending job is due
    lag_seconds: dict[str, float | None]  # p50, p99, max over the window; None when no attempt started
    lag_window_seconds: float
    lag_sample: int  # attempts the lag figures were computed from
    in_progress: int  # attempts dispatched or running (unfinished)
    expired_leases: int  # unfinished attempts whose lease has expired (the reaper's work)
    dlq: int  # failed jobs (the dead-letter queue)
    paused: int
    missed_occurrences: int  # sum over recurring jobs
    dispatchers_alive: int
    dispatchers: list[str] = field(default_factory=list)
    # Celery workers with a health row seen within WORKERS_SHOWN seconds (cron_at_scale.worker.health):
    # name, queues, alive, stuck, state, last_received_seconds_ago, running, concurrency, waiting, note
    workers: list[dict[str, Any]] = field(default_factory=list)
    # Broker queues (cron_at_scale.dispatcher.backpressure): queue, depth, consumers, state (ok, full, no consumer,
    # unknown), held (the dispatchers keep its jobs in the database)
    queues: list[dict[str, Any]] = field(default_factory=list)
    # Recurring jobs overdue (cron_at_scale.maintenance.overdue: no success within their grace of a due
    # occurrence; not the pending.overdue bucket): how many, and the most overdue (at most 100):
    # id, key, task, expected_at, late_seconds, grace, last_success_at, overdue_since
    overdue_jobs_count: int = 0
    overdue_jobs: list[dict[str, Any]] = field(default_factory=list)
    # beat_schedule entries the beat drop-in cannot map (they do not run under it): name, reason
    beat_unmapped: list[dict[str, str]] = field(default_factory=list)
    capped: list[str] = field(default_factory=list)  # figures that hit their count cap (true value >= shown)
    # With SHARD_DATABASES: each database's own figures (database, shards, pending, late,
    # oldest_late_seconds, in_progress, dlq, dispatchers_alive); the fields above add them up
    databases: list[dict[str, Any]] = field(default_factory=list)
    estimated: list[str] = field(default_factory=list)  # figures from the planner's statistics

    def behind(self, after_seconds: float) -> bool:
        """True when a due job has waited longer than ``after_seconds``."""
        return self.oldest_overdue_seconds > after_seconds

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data. ``pending.late`` and ``oldest_late_seconds`` say "late" as the
        admin and ``cron_status`` do (due, not yet claimed); ``pending.overdue`` and
        ``oldest_overdue_seconds`` hold the same figures for scripts written before."""
        out = asdict(self)
        out["pending"] = {**out["pending"], "late": out["pending"].get("overdue", 0)}
        out["oldest_late_seconds"] = out["oldest_overdue_seconds"]
        return out

    def to_json(self, **extra: Any) -> str:
        return json.dumps({**self.as_dict(), **extra}, sort_keys=True)


Status = StatusReport  # the old name (models.Status is the job's state)


def _one(cur, query: str, params=()):
    cur.execute(query, params)
    return cur.fetchone()


def bounded_count(cur, where: str, params=(), cap: int = COUNT_CAP, table: str = "cron_at_scale_job",
                  order: str = "") -> tuple[int, bool]:
    """``(count, capped)`` of rows of ``table`` matching ``where``, counting at most ``cap`` rows.
    ``order``: an ORDER BY for the rows counted, to make the planner take the index that has it."""
    order_by = f" ORDER BY {order}" if order else ""
    (n,) = _one(cur, f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {where}{order_by} LIMIT %s) AS s",
                [*params, cap])
    return n, n >= cap


def planner_estimate(cur, query: str, params=()) -> int:
    """Rows the planner expects ``query`` to return (statistics only: nothing is read)."""
    cur.execute("EXPLAIN (FORMAT JSON) " + query, params)
    plan = cur.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def table_estimate(cur, table: str = "cron_at_scale_job") -> int:
    """Rows in ``table`` from ``pg_class.reltuples`` (kept by VACUUM/ANALYZE); -1 before the first ANALYZE."""
    (n,) = _one(cur, "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [table])
    return int(n)


def _lag(cur, window: float) -> tuple[dict[str, float | None], int]:
    cur.execute(
        """
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
               percentile_cont(0.99) WITHIN GROUP (ORDER BY lag),
               max(lag), count(*)
        """ + _RECENT_LAGS,
        [LAG_SAMPLE, window],
    )
    p50, p99, top, n = cur.fetchone()
    return {"p50": p50, "p99": p99, "max": top}, int(n)


def recent_lags(window: float = DEFAULT_WINDOW) -> list[float]:
    """Firing lags (seconds) of the latest attempts started within ``window`` seconds (bounded sample;
    of every database of ``SHARD_DATABASES``, each bounded)."""
    return [lag for alias in conf.shard_aliases() for lag in _lags_on(alias, window)]


def _dispatchers(cur) -> tuple[int, list[str]]:
    """Dispatchers alive, defined from what the database sees.

    * ``alive``: database sessions whose latest statement was the claim or
      the reaper's scan (a dispatcher polls every ``POLL_INTERVAL``) within
      ``DISPATCHER_SEEN`` seconds. Needs the role to see other sessions'
      queries (the same role, or ``pg_read_all_stats``); otherwise counts
      only what it can see.
    * ``names``: ``locked_by`` of one-off jobs claimed within the same
      period and still in progress (a dispatcher's ``host:pid``); a
      dispatcher whose jobs all finished already is alive but unnamed.
    """
    (alive,) = _one(
        cur,
        """
        SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()
          AND state_change >= statement_timestamp() - make_interval(secs => %s)
          AND (query LIKE %s OR query LIKE %s)
        """,
        [DISPATCHER_SEEN, "WITH due AS (%FOR UPDATE SKIP LOCKED%", "WITH expired AS (%cron_at_scale_jobattempt%"],
    )
    cur.execute(
        """
        SELECT DISTINCT locked_by FROM (
            SELECT locked_by FROM cron_at_scale_job
            WHERE status = 'in_progress' AND locked_by <> ''
              AND updated_at >= statement_timestamp() - make_interval(secs => %s)
            LIMIT %s
        ) AS s ORDER BY 1 LIMIT 100
        """,
        [DISPATCHER_SEEN, COUNT_CAP],
    )
    names = [r[0] for r in cur.fetchall()]
    beats = _heartbeats(cur)
    if beats is not None:  # dispatchers say who they are and which shards they hold: the best source
        return len(beats), [f"{name} (shards {_ranges(shards)})" for name, shards in beats]
    return max(int(alive), len(names)), names


def _heartbeats(cur) -> list[tuple[str, list[int]]] | None:
    """``[(name, shards)]`` of dispatchers whose heartbeat row is younger than ``DISPATCHER_SEEN``;
    None where dispatchers keep no heartbeat table (an older schema)."""
    from django.db import DatabaseError, transaction

    from cron_at_scale import models

    model = getattr(models, "DispatcherHeartbeat", None)
    if model is None:
        return None
    try:
        with transaction.atomic(using=conf.db_alias()):  # a savepoint: a missing table must not break the caller's transaction
            cur.execute(
                f"SELECT name, shards FROM {model._meta.db_table} "
                "WHERE last_seen >= statement_timestamp() - make_interval(secs => %s) ORDER BY name LIMIT 100",
                [DISPATCHER_SEEN],
            )
            rows = cur.fetchall()
    except DatabaseError:
        return None
    return [(name, json.loads(shards) if isinstance(shards, str) else list(shards or [])) for name, shards in rows]


def _ranges(shards: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (in any order; ``"none"`` for no shard)."""
    return conf.shard_ranges(sorted(set(shards))) or "none"


def workers(cur) -> list[dict[str, Any]]:
    """Celery workers' health rows seen within ``WORKERS_SHOWN`` seconds (at most 500), by name.

    ``alive``: its heartbeat is younger than 3 ``WORKER_HEARTBEAT_INTERVAL``s. ``stuck``: alive and
    its watchdog reports it stuck, recovering or exiting. Seconds are from the database clock.
    Empty where the table does not exist yet (an older schema).
    """
    from django.db import DatabaseError, transaction

    ttl = 3 * float(conf.get("WORKER_HEARTBEAT_INTERVAL"))
    try:
        with transaction.atomic(using=conf.db_alias()):  # a savepoint: a missing table must not break the caller's transaction
            cur.execute(
                """
                SELECT name, pid, queues, concurrency, running, received, state, waiting, note, stuck_count,
                       last_seen > statement_timestamp() - make_interval(secs => %s) AS alive,
                       extract(epoch FROM statement_timestamp() - last_seen)::float8,
                       extract(epoch FROM statement_timestamp() - last_received)::float8,
                       extract(epoch FROM statement_timestamp() - stuck_since)::float8
                FROM cron_at_scale_workerhealth
                WHERE last_seen > statement_timestamp() - make_interval(secs => %s)
                ORDER BY name LIMIT 500
                """,
                [ttl, WORKERS_SHOWN],
            )
            rows = cur.fetchall()
    except DatabaseError:
        return []
    out = []
    for (name, pid, queues, conc, running, received, state, waiting, note, stuck_count, alive, seen_ago,
         received_ago, stuck_for) in rows:
        out.append({
            "name": name, "pid": pid, "queues": json.loads(queues) if isinstance(queues, str) else list(queues or []),
            "alive": bool(alive and state != "stopped"), "state": state,
            "stuck": bool(alive and state in ("stuck", "recovering", "exiting")),
            "stuck_seconds": None if stuck_for is None else round(stuck_for, 1), "stuck_count": stuck_count,
            "last_seen_seconds_ago": round(seen_ago, 1),
            "last_received_seconds_ago": None if received_ago is None else round(received_ago, 1),
            "received": received, "running": running, "concurrency": conc, "waiting": waiting, "note": note,
        })
    return out


def beat_unmapped() -> list[dict[str, str]]:
    """The Celery app's ``beat_schedule`` entries the beat drop-in cannot map (``cron_at_scale.beat.mapping.unmapped``):
    ``[{"name", "reason"}]``; [] when the app does not load (``manage.py check`` says why)."""
    from cron_at_scale.beat.mapping import unmapped
    from cron_at_scale.celery_app import get_app

    try:
        app = get_app()
        entries = app.conf.beat_schedule
    except Exception:  # noqa: BLE001
        return []
    return [{"name": name, "reason": why} for name, why in unmapped(entries, app)]


def snapshot(window: float = DEFAULT_WINDOW) -> StatusReport:
    """Collect every figure (a dozen bounded statements, a few ms on an idle database). With
    ``SHARD_DATABASES``, the job figures of every database added up (``databases``: each one's);
    the workers' health rows and the broker's queues are read once, from ``DATABASE``."""
    homes = conf.shard_aliases()
    parts = []
    for alias in homes:
        with conf.using(alias):
            parts.append(_figures(window))
    with conf.using(conf.get("DATABASE")), db.get_connection().cursor() as cur:
        worker_rows = workers(cur)
    from cron_at_scale.dispatcher.backpressure import survey

    queue_rows = [q.as_dict() for q in survey()]
    first = parts[0]
    pending = {name: sum(p["pending"][name] for p in parts) for name in first["pending"]}
    lag, sample = first["lag"], first["sample"]
    if len(parts) > 1:
        lag, sample = _merged_lag([lag for alias in homes for lag in _lags_on(alias, window)])
    late = sorted((o for p in parts for o in p["late"]), key=lambda o: o.late_seconds, reverse=True)
    return StatusReport(
        beat_unmapped=beat_unmapped(),
        db_now=first["db_now"].isoformat(), pending=pending,
        oldest_overdue_seconds=max(p["overdue"] for p in parts),
        lag_seconds=lag, lag_window_seconds=window, lag_sample=sample,
        in_progress=sum(p["in_progress"] for p in parts), expired_leases=sum(p["expired"] for p in parts),
        dlq=sum(p["dlq"] for p in parts), paused=sum(p["paused"] for p in parts),
        missed_occurrences=sum(p["missed"] for p in parts),
        dispatchers_alive=sum(p["alive"] for p in parts), dispatchers=[n for p in parts for n in p["names"]],
        workers=worker_rows, queues=queue_rows,
        capped=list(dict.fromkeys(c for p in parts for c in p["capped"])),
        estimated=list(dict.fromkeys(e for p in parts for e in p["estimated"])),
        overdue_jobs_count=sum(p["late_count"] for p in parts), overdue_jobs=[o.as_dict() for o in late[:100]],
        databases=[{"database": alias, "shards": _ranges(conf.shards_of(alias)), "pending": sum(p["pending"].values()),
                    "late": p["pending"].get("overdue", 0), "oldest_late_seconds": p["overdue"],
                    "in_progress": p["in_progress"], "dlq": p["dlq"], "dispatchers_alive": p["alive"]}
                   for alias, p in zip(homes, parts)] if len(parts) > 1 else [],
    )


def _figures(window: float) -> dict[str, Any]:
    """The job figures of the database the package's statements run on now (``conf.db_alias()``)."""
    capped: list[str] = []
    with db.get_connection().cursor() as cur:
        db_now = db.db_now()
        pending: dict[str, int] = {}
        for name, lo, hi in _BUCKET_RANGES:
            where = _PENDING
            params: list[Any] = [list(conf.ALL_SHARDS)]
            if lo is not None:
                where += " AND fire_at > %s::timestamptz + %s::interval"
                params += [db_now, lo]
            where += " AND fire_at <= %s::timestamptz + %s::interval"
            params += [db_now, hi]
            pending[name], hit = bounded_count(cur, where, params)
            if hit:
                capped.append(f"pending.{name}")
        later, hit = bounded_count(cur, _PENDING + " AND fire_at > %s::timestamptz + interval '1 day'",
                                   [list(conf.ALL_SHARDS), db_now])
        estimated: list[str] = []
        if hit:  # many future jobs: the planner's figure, rather than counting millions of index entries.
            # Pending rows (status statistics are per value, hence close) minus the buckets counted;
            # not an estimate of "pending AND fire_at > …", which the planner gets wrong by treating
            # the two columns as independent (every pending job is in the future, most others past).
            total = planner_estimate(cur, "SELECT 1 FROM cron_at_scale_job WHERE status = 'pending'")
            later = max(later, total - sum(pending.values()))
            estimated.append("pending.later")
        pending["later"] = later
        (oldest,) = _one(cur, "SELECT min(o.fire_at) FROM unnest(%s::smallint[]) AS s(shard) CROSS JOIN LATERAL "
                              "(SELECT min(fire_at) AS fire_at FROM cron_at_scale_job "
                              "WHERE status = 'pending' AND shard = s.shard) AS o", [list(conf.ALL_SHARDS)])
        overdue = max(0.0, (db_now - oldest).total_seconds()) if oldest is not None else 0.0
        lag, sample = _lag(cur, window)
        in_progress, hit = bounded_count(cur, "finished_at IS NULL", table="cron_at_scale_jobattempt")
        if hit:
            capped.append("in_progress")
        expired, hit = bounded_count(cur, "finished_at IS NULL AND locked_until < %s", [db_now],
                                     table="cron_at_scale_jobattempt")
        if hit:
            capped.append("expired_leases")
        dlq, hit = bounded_count(cur, "status = 'failed'", cap=DLQ_CAP)
        if hit:
            capped.append("dlq")
        paused, hit = bounded_count(cur, "status = 'paused'")
        if hit:
            capped.append("paused")
        (missed,) = _one(cur, "SELECT coalesce(sum(missed_occurrences), 0) FROM cron_at_scale_job "
                              "WHERE NOT schedule_type = 'once'")
        alive, names = _dispatchers(cur)
    from cron_at_scale.maintenance.overdue import overdue_jobs

    late, late_count = overdue_jobs()
    return {"db_now": db_now, "pending": pending, "capped": capped, "estimated": estimated,
            "overdue": round(overdue, 3), "lag": lag, "sample": sample, "in_progress": in_progress,
            "expired": expired, "dlq": dlq, "paused": paused, "missed": int(missed), "alive": alive,
            "names": names, "late": late, "late_count": late_count}


def _lags_on(alias: str, window: float) -> list[float]:
    with conf.using(alias), db.get_connection().cursor() as cur:
        cur.execute("SELECT lag " + _RECENT_LAGS, [LAG_SAMPLE, window])
        return [r[0] for r in cur.fetchall()]


def _merged_lag(lags: list[float]) -> tuple[dict[str, float | None], int]:
    """p50, p99 and max of ``lags`` as PostgreSQL's ``percentile_cont`` computes them (linear)."""
    if not lags:
        return {"p50": None, "p99": None, "max": None}, 0
    ordered = sorted(lags)

    def cont(q: float) -> float:
        pos = q * (len(ordered) - 1)
        low = int(pos)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)

    return {"p50": cont(0.5), "p99": cont(0.99), "max": ordered[-1]}, len(ordered)


OLDEST_DUE_SCAN = 100_000  # due jobs walked (oldest first) to find each queue's oldest waiting one


def oldest_due_per_queue(scan: int = OLDEST_DUE_SCAN) -> list[dict[str, Any]]:
    """Each job queue's oldest due, unclaimed job: ``[{"queue", "task", "id", "fire_at", "late_seconds"}]``
    by queue (``""``: the default, routed by task). Bounded: found among the oldest due jobs of each
    shard, ``scan`` in all."""
    per_shard = -(-scan // conf.NUM_SHARDS)  # the scan spread over the shards (ids, hence shards, are random)
    return [r._asdict() for r in db.run("oldest_due_per_queue", {"shards": list(conf.ALL_SHARDS), "per_shard": per_shard},
                                        retries=0)]


def why_late(task: str, queue: str, queues: dict[str, tuple[str, bool]], dispatchers_alive: int, app=None) -> str:
    """Why a due, unclaimed job has not fired, as ``cron_status`` would explain it: its broker queue
    held (``"queue emails HELD: no consumer"``), no dispatcher alive, else the dispatchers' backlog
    (with its queue's state when not ``ok``). ``queues`` maps a broker queue to ``(state, held)``
    (:func:`cron_at_scale.dispatcher.backpressure.survey`). The queue is where the job's run is
    published: its ``queue``, or where its task routes (``backpressure.destination``)."""
    from cron_at_scale.dispatcher.backpressure import destination

    name: str | None = queue or None
    try:
        from cron_at_scale.celery_app import get_app

        name = destination(app or get_app(), task, queue)
    except Exception:  # noqa: BLE001 (a task the router cannot place: say what we know)
        pass
    state, held = queues.get(name or "", ("unknown", False))
    if held:
        return f"queue {name} HELD: {state}"
    if not dispatchers_alive:
        return "no dispatcher alive"
    why = "waiting for a dispatcher (a backlog, or about to be claimed)"
    return why + (f"; queue {name}: {state}" if state not in ("ok", "unknown") else "")


def dispatchers_alive() -> int:
    """How many dispatchers are alive now (as the dashboard counts them)."""
    with db.get_connection().cursor() as cur:
        return _dispatchers(cur)[0]


def duration_text(seconds: float) -> str:
    """``42 s``, ``5 min 3 s``, ``2 h 10 min``, ``3 d 4 h``."""
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"
