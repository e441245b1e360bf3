"""Settings: one dict, ``CRON_AT_SCALE`` in Django's settings, merged over DEFAULTS."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

# Defaults, each with why. Times are seconds.
DEFAULTS: dict[str, Any] = {
    # Jobs claimed per statement: big enough that one round trip carries many
    # jobs, small enough that a batch is published well under a lease.
    "BATCH_SIZE": 1000,
    # Idle poll of the dispatcher; a full batch loops again without sleeping.
    "POLL_INTERVAL": 0.1,
    # Jobs due within this many seconds are claimed early and published at their
    # fire_at from an in-memory timer: firing lag does not depend on the poll.
    "LOOKAHEAD": 1.0,
    # Pre-loading (cron_at_scale.dispatcher.preload): a dispatcher looks this many seconds ahead, between
    # claims, for bursts (the top of the hour, midnight) too large to claim within LOOKAHEAD, and
    # claims them early enough that they go out at their instant. 0: off. Up to 600.
    "PRELOAD": 60.0,
    # Runs a dispatcher holds at most for pre-loading (~2.4 KiB of memory each: see docs/concepts.md).
    "PRELOAD_MAX_RUNS": 200_000,
    # A run held for its fire_at is published this many seconds before it, with Celery's eta
    # set to its fire_at: the worker holds it for the last moments and starts it on time
    # (the broker and the pickup happen before, not after, the fire_at). 0: published at its
    # fire_at, no eta. At most LOOKAHEAD (a run cannot go out before it is claimed).
    # None: 1 s or LOOKAHEAD if shorter (a second keeps ETA's costs small: see docs/settings.md).
    "ETA_LEAD": None,
    # Per destination queue: stop claiming the jobs of a queue holding more messages than this
    # (an overload waits in the database), while the other queues keep firing.
    "MAX_BROKER_DEPTH": 200_000,
    # Per destination queue: stop claiming its jobs while its messages would wait longer than this
    # for its consumers (their pace measured from the queue's depth), so that a message waiting its
    # turn is never taken for lost and fired again (a second message to skip: overload amplifying
    # itself). None: half of DISPATCH_LEASE, room for a pace misjudged by half; 0: off.
    "MAX_QUEUE_WAIT": None,
    # Hold in the database the jobs of a queue nobody consumes (RabbitMQ: no consumer; Redis: no
    # live worker's health row lists it) rather than fire them into it and re-fire each lost one
    # every dispatch lease. False: fire them anyway (workers that write no health rows, on Redis;
    # tools and tests that read the messages off the broker themselves).
    "HOLD_UNCONSUMED_QUEUES": True,
    # Shard lease time; renewed every quarter of it. A dead dispatcher's shards move after this.
    "SHARD_LEASE": 5.0,
    # Lease of a claimed attempt until a worker starts it (lost message => re-fire after this).
    "DISPATCH_LEASE": 30.0,
    # Lease of a running attempt; the worker's heartbeat renews it.
    "RUN_LEASE": 60.0,
    # Heartbeat period: a third of the run lease, so two missed beats still keep it.
    "HEARTBEAT_INTERVAL": 20.0,
    # The worker's main process starts the scheduled messages it received together, in one
    # statement, before any reaches a pool process, while its pool is busy
    # (cron_at_scale.worker.batch_start); off: each pool process starts its own message;
    # "always": a message that comes with a pool slot free is started by the main process too.
    "BATCH_STARTS": True,
    # How often a dispatcher looks for expired leases.
    "REAPER_INTERVAL": 1.0,
    # Lost attempts (lease expired, nobody finished) after which a job goes to the DLQ:
    # a poison job that kills its worker must not loop forever.
    "MAX_LOST_ATTEMPTS": 5,
    # A Celery worker's main process writes its health row (cron_status, metrics) this often,
    # and its watchdog checks then whether it stopped consuming.
    "WORKER_HEARTBEAT_INTERVAL": 5.0,
    # A worker whose queues held messages for this long while it had a free pool slot and
    # received nothing is stuck: it re-adds lost queue consumers once, else exits (status 70)
    # so that its supervisor restarts it. None: report only, never act.
    "WORKER_STUCK_AFTER": 60.0,
    # Check at schedule() time that the task name is registered with the Celery app.
    "VALIDATE_TASK_NAMES": True,
    # Payload (args + kwargs as JSON) size limit, bytes.
    "MAX_PAYLOAD_BYTES": 64 * 1024,
    # Retry every exception, not only RetryableError / autoretry_for / self.retry().
    "RETRY_ALL_EXCEPTIONS": False,
    # Dead-letter queue: where failed jobs are announced.
    "DLQ_QUEUE": "cron_at_scale.dlq",
    # Seconds after which completed and cancelled jobs (and their attempts) are
    # deleted by the dispatchers, in small batches. 30 days: a month of history to look back
    # on, and a table that stops growing (at 10,000 jobs/s, keeping everything adds 864M rows
    # a day). None keeps them forever (cron_purge by hand). Failed jobs are never deleted.
    "RETENTION": 30 * 86400.0,
    # Seconds a finished job (completed or cancelled, every attempt finished) stays in the live
    # table before it moves, with its attempts, into the history tables (JobHistory, AttemptHistory:
    # partitioned by time, dropped a partition at a time after RETENTION). 3600: a finished job reads
    # as Job in the admin and cron_status for an hour (what ran this last hour is where one looks
    # first); the live table holds what can still fire and the last hour's finished jobs (36M rows
    # at 10,000 jobs/s: set less at such rates). None: nothing moves, RETENTION deletes from the live
    # table row by row (the storage before the history tables).
    "HISTORY_AFTER": 3600.0,
    # Seconds of history per partition: the unit in which RETENTION drops it (a day).
    "HISTORY_PARTITION": 86400.0,
    # Seconds a recurring job's due occurrence may go without a successful run before the job is
    # overdue (cron_at_scale.maintenance.overdue), unless the job sets its own (schedule(..., grace=)).
    # 300: the default catch-up window; a deploy or a restart is caught up within it, so
    # it does not page, while a job that stopped running does within minutes.
    "OVERDUE_GRACE": 300.0,
    # Attempts kept per recurring job (cron_at_scale.maintenance.history): older finished ones are deleted by
    # the dispatchers in small batches. 1000: the admin shows 50; a per-second job keeps ~17 minutes,
    # a per-minute one ~17 hours. None keeps them all (a per-second job adds 86,400 rows a day).
    "HISTORY_PER_JOB": 1000,
    # Seconds after which a recurring job's finished attempts are deleted, whatever their number
    # (the latest one stays). None: only HISTORY_PER_JOB applies.
    "HISTORY_MAX_AGE": None,
    # Server-side prepared statements for the worker's per-task writes; turn off
    # behind a pooler that does not keep sessions (PgBouncer transaction mode).
    "PREPARED_STATEMENTS": True,
    # Seconds the metrics' database gauges are reused for: one computation (~25 statements) per
    # interval whatever the scrape rate or the number of scrapers; below Prometheus' usual 15 s
    # scrape interval, so each scrape still sees fresh figures. 0: computed on every scrape.
    "METRICS_CACHE_SECONDS": 10.0,
    # Per-job series (cron_job_overdue{key}, cron_job_last_success_timestamp_seconds{key}) for live
    # recurring jobs with a key (at most 1000): off unless asked, since every key becomes a label
    # value anyone reading the metrics sees, and a series to store.
    "METRICS_JOB_KEYS": False,
    # A bearer token the metrics (the Django view, cron_dispatcher --metrics-port) require:
    # "Authorization: Bearer <token>", else 401. None: they answer whoever reaches them.
    "METRICS_TOKEN": None,
    # Tracing (cron_at_scale.ops.tracing, with opentelemetry-api installed): the first run of a one-off
    # job due at most this many seconds after its schedule() call is that call's span's child; one
    # due later (and every retry and cron or interval fire) starts its own trace with a link to it.
    # 60: a request's follow-up work (an email sent "now", a countdown of seconds) belongs in the
    # request's trace; a run an hour later would stretch that trace over the hour. 0: always link.
    "TRACE_CHILD_MAX_DELAY": 60.0,
    # Celery app path ("module:attr"); None => celery.current_app.
    "CELERY_APP": None,
    # The alias in settings.DATABASES that every table of the app lives on and every statement runs
    # on (with cron_at_scale.routers.CronAtScaleRouter in DATABASE_ROUTERS when not "default"). Its
    # own database keeps the application's long transactions (analytics, a forgotten BEGIN) from
    # holding back the vacuum of the job tables; the cost: schedule() is then atomic with the
    # application's writes only on this alias (docs/own-database.md).
    "DATABASE": "default",
    # The 64 shards spread over several PostgreSQL clusters: {alias: shards}, each alias one of
    # settings.DATABASES, its shards a list of numbers and "a-b" ranges; every shard 0-63 exactly
    # once. A job lives on the alias of its shard (from its id; a keyed job's shard from its key);
    # one cron_dispatcher per alias (--database) claims there. None: every shard on DATABASE.
    # docs/sharding.md.
    "SHARD_DATABASES": None,
}


_POSITIVE = ("BATCH_SIZE", "POLL_INTERVAL", "MAX_BROKER_DEPTH", "SHARD_LEASE", "DISPATCH_LEASE", "RUN_LEASE", "HEARTBEAT_INTERVAL",
             "REAPER_INTERVAL", "MAX_LOST_ATTEMPTS", "MAX_PAYLOAD_BYTES", "WORKER_HEARTBEAT_INTERVAL", "OVERDUE_GRACE",
             "PRELOAD_MAX_RUNS")
_INTEGER = ("MAX_BROKER_DEPTH", "BATCH_SIZE", "MAX_LOST_ATTEMPTS", "MAX_PAYLOAD_BYTES", "PRELOAD_MAX_RUNS")


def problems() -> list[str]:
    """What is wrong with ``settings.CRON_AT_SCALE`` (empty when nothing): each message names the key."""
    from django.conf import settings

    user = getattr(settings, "CRON_AT_SCALE", None)
    if user is None:
        return []
    if not isinstance(user, dict):
        return [f"CRON_AT_SCALE must be a dict, got {type(user).__name__}"]
    out = [f"CRON_AT_SCALE[{k!r}] is not a setting (known: {', '.join(DEFAULTS)})" for k in user if k not in DEFAULTS]
    # NaN passes every comparison check below as False and infinity passes every lower bound: a
    # number of either kind is refused here, once, and the checks below see the key's default.
    odd = [k for k, v in user.items() if k in DEFAULTS and isinstance(v, float) and not math.isfinite(v)]
    out += [f"CRON_AT_SCALE[{k!r}] must be a finite number, got {user[k]!r}" for k in odd]
    user = {k: v for k, v in user.items() if k not in odd}
    for key in _POSITIVE:
        value = user.get(key, DEFAULTS[key])
        kind = int if key in _INTEGER else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
            out.append(f"CRON_AT_SCALE[{key!r}] must be a {'whole ' if key in _INTEGER else ''}number > 0, got {value!r}")
    value = user.get("LOOKAHEAD", DEFAULTS["LOOKAHEAD"])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 60:
        out.append(f"CRON_AT_SCALE['LOOKAHEAD'] must be a number of seconds from 0 to 60, got {value!r}")
    value = user.get("TRACE_CHILD_MAX_DELAY", DEFAULTS["TRACE_CHILD_MAX_DELAY"])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        out.append(f"CRON_AT_SCALE['TRACE_CHILD_MAX_DELAY'] must be a number of seconds >= 0, got {value!r}")
    value = user.get("PRELOAD", DEFAULTS["PRELOAD"])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 600:
        out.append(f"CRON_AT_SCALE['PRELOAD'] must be a number of seconds from 0 to 600, got {value!r}")
    value = user.get("MAX_QUEUE_WAIT", DEFAULTS["MAX_QUEUE_WAIT"])
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6):
        out.append(f"CRON_AT_SCALE['MAX_QUEUE_WAIT'] must be a number of seconds >= 0 or None, got {value!r}")
    value = user.get("ETA_LEAD", DEFAULTS["ETA_LEAD"])
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 60):
        out.append(f"CRON_AT_SCALE['ETA_LEAD'] must be a number of seconds from 0 to 60 or None, got {value!r}")
    if not out:
        out += contradictions(values())
    value = user.get("METRICS_CACHE_SECONDS", DEFAULTS["METRICS_CACHE_SECONDS"])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 3600:
        out.append(f"CRON_AT_SCALE['METRICS_CACHE_SECONDS'] must be a number of seconds from 0 to 3600, got {value!r}")
    token = user.get("METRICS_TOKEN")
    if token is not None and (not isinstance(token, str) or not token or not token.isprintable() or " " in token):
        out.append("CRON_AT_SCALE['METRICS_TOKEN'] must be a non-empty string without spaces or None")
    for key in ("VALIDATE_TASK_NAMES", "RETRY_ALL_EXCEPTIONS", "PREPARED_STATEMENTS", "HOLD_UNCONSUMED_QUEUES",
                "METRICS_JOB_KEYS"):
        if not isinstance(user.get(key, DEFAULTS[key]), bool):
            out.append(f"CRON_AT_SCALE[{key!r}] must be True or False, got {user[key]!r}")
    batch = user.get("BATCH_STARTS", DEFAULTS["BATCH_STARTS"])
    if not isinstance(batch, bool) and batch != "always":
        out.append(f"CRON_AT_SCALE['BATCH_STARTS'] must be True, False or \"always\", got {batch!r}")
    retention = user.get("RETENTION", DEFAULTS["RETENTION"])
    if retention is not None and (isinstance(retention, bool) or not isinstance(retention, (int, float))
                                  or retention < 0):
        out.append(f"CRON_AT_SCALE['RETENTION'] must be seconds >= 0 or None, got {retention!r}")
    stuck = user.get("WORKER_STUCK_AFTER", DEFAULTS["WORKER_STUCK_AFTER"])
    if stuck is not None and (isinstance(stuck, bool) or not isinstance(stuck, (int, float)) or not stuck > 0):
        out.append(f"CRON_AT_SCALE['WORKER_STUCK_AFTER'] must be seconds > 0 or None, got {stuck!r}")
    age = user.get("HISTORY_MAX_AGE")
    if age is not None and (isinstance(age, bool) or not isinstance(age, (int, float)) or not age > 0):
        out.append(f"CRON_AT_SCALE['HISTORY_MAX_AGE'] must be seconds > 0 or None, got {age!r}")
    keep = user.get("HISTORY_PER_JOB", DEFAULTS["HISTORY_PER_JOB"])
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        out.append(f"CRON_AT_SCALE['HISTORY_PER_JOB'] must be a whole number >= 1 or None, got {keep!r}")
    after = user.get("HISTORY_AFTER", DEFAULTS["HISTORY_AFTER"])
    if after is not None and (isinstance(after, bool) or not isinstance(after, (int, float)) or after < 0):
        out.append(f"CRON_AT_SCALE['HISTORY_AFTER'] must be seconds >= 0 or None, got {after!r}")
    part = user.get("HISTORY_PARTITION", DEFAULTS["HISTORY_PARTITION"])
    if isinstance(part, bool) or not isinstance(part, (int, float)) or not part >= 1:
        out.append(f"CRON_AT_SCALE['HISTORY_PARTITION'] must be seconds >= 1, got {part!r}")
    app_path = user.get("CELERY_APP")
    if app_path is not None and (not isinstance(app_path, str) or ":" not in app_path):
        out.append(f"CRON_AT_SCALE['CELERY_APP'] must be 'module:attribute' or None, got {app_path!r}")
    alias = user.get("DATABASE", DEFAULTS["DATABASE"])
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        out.append(f"CRON_AT_SCALE['DATABASE'] is {alias!r}, not an alias of settings.DATABASES "
                   f"(known: {', '.join(map(repr, settings.DATABASES))})")
    spec = user.get("SHARD_DATABASES")
    if spec is not None:
        out += parse_shard_databases(spec, settings.DATABASES)[1]
    for key in ("DLQ_QUEUE",):
        if not isinstance(user.get(key, DEFAULTS[key]), str) or not user.get(key, DEFAULTS[key]):
            out.append(f"CRON_AT_SCALE[{key!r}] must be a non-empty string, got {user[key]!r}")
    return out


def contradictions(values: dict[str, Any]) -> list[str]:
    """Settings that are each valid but break a promise together (each message names both).

    * ``LOOKAHEAD`` < ``DISPATCH_LEASE``: a run claimed early waits in its dispatcher until its
      ``fire_at``; a dispatch lease no longer than that wait would let the reaper fire it again
      before it was due.
    * ``ETA_LEAD`` <= ``LOOKAHEAD``: a run is published at most its look-ahead before its ``fire_at``
      (it is claimed no earlier), and ``ETA_LEAD`` < ``DISPATCH_LEASE``: the lease of a run
      counts from its ``fire_at``, a lead as long would outlast it (also implied by the first two).
    * ``MAX_QUEUE_WAIT`` < ``DISPATCH_LEASE``: a message let wait in its queue as long as its lease
      would be reaped and fired again while it waits.
    * ``HEARTBEAT_INTERVAL`` < ``RUN_LEASE``: a running attempt's lease would expire between two
      heartbeats, and every run longer than the lease would be fired again while it runs.
    """
    out = []
    if not float(values["LOOKAHEAD"]) < float(values["DISPATCH_LEASE"]):
        out.append(f"CRON_AT_SCALE['LOOKAHEAD'] ({values['LOOKAHEAD']}s) must be shorter than "
                   f"CRON_AT_SCALE['DISPATCH_LEASE'] ({values['DISPATCH_LEASE']}s): a run held for its fire_at "
                   "would be reaped and fired again before it was due")
    lead = eta_lead(values)
    if lead > float(values["LOOKAHEAD"]):
        out.append(f"CRON_AT_SCALE['ETA_LEAD'] ({lead}s) must be at most CRON_AT_SCALE['LOOKAHEAD'] "
                   f"({values['LOOKAHEAD']}s): a run cannot be published before it is claimed")
    if not lead < float(values["DISPATCH_LEASE"]):
        out.append(f"CRON_AT_SCALE['ETA_LEAD'] ({lead}s) must be shorter than CRON_AT_SCALE['DISPATCH_LEASE'] "
                   f"({values['DISPATCH_LEASE']}s): a message held by a worker for its eta would outlast "
                   "its dispatch lease")
    wait = values.get("MAX_QUEUE_WAIT")
    if wait is not None and not float(wait) < float(values["DISPATCH_LEASE"]):
        out.append(f"CRON_AT_SCALE['MAX_QUEUE_WAIT'] ({wait}s) must be shorter than CRON_AT_SCALE['DISPATCH_LEASE'] "
                   f"({values['DISPATCH_LEASE']}s): a message waiting that long in its queue would be fired again")
    if not float(values["HEARTBEAT_INTERVAL"]) < float(values["RUN_LEASE"]):
        out.append(f"CRON_AT_SCALE['HEARTBEAT_INTERVAL'] ({values['HEARTBEAT_INTERVAL']}s) must be shorter than "
                   f"CRON_AT_SCALE['RUN_LEASE'] ({values['RUN_LEASE']}s): a running attempt's lease would expire "
                   "between two heartbeats")
    return out


ETA_LEAD_DEFAULT = 1.0  # seconds, when ETA_LEAD is None (and LOOKAHEAD is not shorter)


def eta_lead(values: dict[str, Any]) -> float:
    """The ETA lead in seconds that ``values`` (every setting, as :func:`values` gives them) make:
    ``ETA_LEAD``, or if None, 1 s or ``LOOKAHEAD`` if shorter."""
    lead = values.get("ETA_LEAD")
    if lead is None:
        return min(ETA_LEAD_DEFAULT, float(values["LOOKAHEAD"]))
    return float(lead)


def max_queue_wait(values: dict[str, Any]) -> float:
    """Seconds of its consumers' work a queue may hold (``MAX_QUEUE_WAIT``; None: half of
    ``DISPATCH_LEASE``; 0: no pacing)."""
    wait = values.get("MAX_QUEUE_WAIT")
    return float(values["DISPATCH_LEASE"]) / 2 if wait is None else float(wait)


def check() -> None:
    """Raise ``django.core.exceptions.ImproperlyConfigured`` naming every bad ``CRON_AT_SCALE`` key."""
    from django.core.exceptions import ImproperlyConfigured

    found = problems()
    if found:
        raise ImproperlyConfigured("; ".join(found))


def values() -> dict[str, Any]:
    """Every setting: ``settings.CRON_AT_SCALE`` merged over ``DEFAULTS``."""
    return {name: get(name) for name in DEFAULTS}


_using: ContextVar[str | None] = ContextVar("cron_at_scale_using", default=None)
_pinned: str | None = None  # this process's alias (a dispatcher of one cluster: pin_alias)


def db_alias() -> str:
    """The alias the package's statements run on now: ``django.db.connections[db_alias()]``, every
    transaction of its own ``atomic(using=db_alias())``. The alias of :func:`using` around the
    call, else the process's (:func:`pin_alias`), else ``DATABASE``."""
    return _using.get() or _pinned or get("DATABASE")


@contextmanager
def using(alias: str) -> Iterator[str]:
    """Run the package's statements of this thread (and its context) on ``alias`` inside the block:
    a job's own cluster (:func:`alias_of_job`)."""
    token = _using.set(alias)
    try:
        yield alias
    finally:
        _using.reset(token)


def pin_alias(alias: str | None) -> None:
    """Make ``alias`` this process's database for every thread (a dispatcher serving one cluster of
    ``SHARD_DATABASES``); None undoes it."""
    global _pinned
    _pinned = alias


NUM_SHARDS = 64  # fixed by migration 0004 (cron_at_scale.models takes it from here)
ALL_SHARDS = tuple(range(NUM_SHARDS))  # "every shard": a read of pending rows, one index range per shard
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def parse_shard_databases(spec: Any, known: Any = None) -> tuple[dict[int, str], list[str]]:
    """``SHARD_DATABASES`` read: ({shard: alias} for the 64 shards, problems). ``spec`` maps an alias
    (of ``known``, settings.DATABASES, when given) to a list of shard numbers (0-63) and ``"a-b"``
    ranges (inclusive). Each problem names the key, the alias and the overlap or the gap."""
    key = "CRON_AT_SCALE['SHARD_DATABASES']"
    if not isinstance(spec, dict) or not spec:
        return {}, [f"{key} must be a dict from a database alias to its shards, got {spec!r}"]
    owner: dict[int, str] = {}
    clashes: dict[tuple[str, str], list[int]] = {}  # (alias, the alias that had them first): shards
    out = []
    for alias, shards in spec.items():
        if not isinstance(alias, str) or (known is not None and alias not in known):
            out.append(f"{key}: {alias!r} is not an alias of settings.DATABASES "
                       f"(known: {', '.join(map(repr, known or ()))})")
            continue
        items = [shards] if isinstance(shards, str) else shards
        if not isinstance(items, (list, tuple)) or not items:
            out.append(f"{key}[{alias!r}] must be a non-empty list of shard numbers and 'a-b' ranges, got {shards!r}")
            continue
        for item in items:
            m = _RANGE.match(item) if isinstance(item, str) else None
            if m:
                first, last = int(m.group(1)), int(m.group(2))
            elif isinstance(item, int) and not isinstance(item, bool):
                first = last = item
            else:
                out.append(f"{key}[{alias!r}]: {item!r} is neither a shard number nor an 'a-b' range")
                continue
            if first < 0:
                out.append(f"{key}[{alias!r}]: {item!r} is below shard 0 (shards are 0-{NUM_SHARDS - 1})")
                continue
            if not last < NUM_SHARDS:
                out.append(f"{key}[{alias!r}]: {item!r} goes beyond shard {NUM_SHARDS - 1} (shards are 0-{NUM_SHARDS - 1})")
                continue
            if first > last:
                out.append(f"{key}[{alias!r}]: {item!r} is backwards; write the lower shard first")
                continue
            for shard in range(first, last + 1):
                if shard in owner:
                    clashes.setdefault((alias, owner[shard]), []).append(shard)
                else:
                    owner[shard] = alias
    for (alias, other), shards in clashes.items():
        where = "twice" if alias == other else f"and on {other!r}"
        many = len(set(shards)) > 1
        out.append(f"{key}: shard{'s' if many else ''} {shard_ranges(sorted(set(shards)))} "
                   f"{'are' if many else 'is'} on {alias!r} {where}; each shard goes on one alias, once")
    missing = [s for s in range(NUM_SHARDS) if s not in owner]
    if missing and not out:
        many = len(missing) > 1
        out.append(f"{key}: shard{'s' if many else ''} {shard_ranges(missing)} {'are' if many else 'is'} on no alias; "
                   f"every shard 0-{NUM_SHARDS - 1} needs one")
    return (owner if not out else {}), out


def shard_ranges(shards: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2, 5"``."""
    parts, start = [], None
    for i, s in enumerate(shards):
        if start is None:
            start = s
        if i + 1 == len(shards) or shards[i + 1] != s + 1:
            parts.append(str(start) if start == s else f"{start}-{s}")
            start = None
    return ", ".join(parts)


_shard_cache: tuple[Any, dict[int, str]] = (None, {})


def shard_map() -> dict[int, str] | None:
    """{shard: alias} from ``SHARD_DATABASES``, or None when it is unset (every shard on
    ``DATABASE``). Raises ``ImproperlyConfigured`` if it is set but wrong."""
    global _shard_cache
    spec = get("SHARD_DATABASES")
    if spec is None:
        return None
    if _shard_cache[0] is spec:
        return _shard_cache[1]
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    owner, found = parse_shard_databases(spec, settings.DATABASES)
    if found:
        raise ImproperlyConfigured("; ".join(found))
    _shard_cache = (spec, owner)
    return owner


def shard_aliases() -> list[str]:
    """Every alias that holds shards, in the order of ``SHARD_DATABASES`` (``[DATABASE]`` when unset)."""
    owner = shard_map()
    if owner is None:
        return [get("DATABASE")]
    held = set(owner.values())
    return [alias for alias in get("SHARD_DATABASES") if alias in held]


def shards_of(alias: str) -> list[int]:
    """The shards ``alias`` holds (all 64 when ``SHARD_DATABASES`` is unset)."""
    owner = shard_map()
    if owner is None:
        return list(range(NUM_SHARDS))
    return [s for s in range(NUM_SHARDS) if owner[s] == alias]


def alias_of_key(key: str) -> str:
    """The alias holding the jobs of idempotency key ``key``: the alias of the key's shard
    (:func:`cron_at_scale.ids.shard_of_key`); ``db_alias()`` when ``SHARD_DATABASES`` is unset."""
    owner = shard_map()
    if owner is None:
        return db_alias()
    from cron_at_scale.ids import shard_of_key

    return owner[shard_of_key(key)]


def alias_of_job(job_id: Any) -> str:
    """The alias holding the job with id ``job_id`` (a UUID or its text): the alias of its shard, the
    low 6 bits of the id (as the ``shard`` column computes it); ``db_alias()`` when unset."""
    owner = shard_map()
    if owner is None:
        return db_alias()
    value = job_id.int if hasattr(job_id, "int") else int(str(job_id)[-2:], 16)
    return owner[value % NUM_SHARDS]


def by_job_alias(items: Iterable[T], job_id_of: Callable[[T], Any]) -> dict[str, list[T]]:
    """``items`` grouped by the alias holding each one's job (:func:`alias_of_job` of
    ``job_id_of(item)``), in their order: one statement per database (``SHARD_DATABASES``)."""
    out: dict[str, list[T]] = {}
    for item in items:
        out.setdefault(alias_of_job(job_id_of(item)), []).append(item)
    return out


def get(name: str) -> Any:
    """Return setting ``name`` from ``settings.CRON_AT_SCALE`` or its default."""
    from django.conf import settings

    user = getattr(settings, "CRON_AT_SCALE", None) or {}
    if name in user:
        return user[name]
    return DEFAULTS[name]
