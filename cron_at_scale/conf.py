"""Settings: one dict, ``CRON_AT_SCALE`` in Django's settings, merged over DEFAULTS."""

from __future__ import annotations

from typing import Any

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
    # Celery app path ("module:attr"); None => celery.current_app.
    "CELERY_APP": None,
    # The alias in settings.DATABASES that every table of the app lives on and every statement runs
    # on (with cron_at_scale.routers.CronAtScaleRouter in DATABASE_ROUTERS when not "default"). Its
    # own database keeps the application's long transactions (analytics, a forgotten BEGIN) from
    # holding back the vacuum of the job tables; the cost: schedule() is then atomic with the
    # application's writes only on this alias (docs/own-database.md).
    "DATABASE": "default",
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
    for key in _POSITIVE:
        value = user.get(key, DEFAULTS[key])
        kind = int if key in _INTEGER else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
            out.append(f"CRON_AT_SCALE[{key!r}] must be a {'whole ' if key in _INTEGER else ''}number > 0, got {value!r}")
    value = user.get("LOOKAHEAD", DEFAULTS["LOOKAHEAD"])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 60:
        out.append(f"CRON_AT_SCALE['LOOKAHEAD'] must be a number of seconds from 0 to 60, got {value!r}")
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
    app_path = user.get("CELERY_APP")
    if app_path is not None and (not isinstance(app_path, str) or ":" not in app_path):
        out.append(f"CRON_AT_SCALE['CELERY_APP'] must be 'module:attribute' or None, got {app_path!r}")
    alias = user.get("DATABASE", DEFAULTS["DATABASE"])
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        out.append(f"CRON_AT_SCALE['DATABASE'] is {alias!r}, not an alias of settings.DATABASES "
                   f"(known: {', '.join(map(repr, settings.DATABASES))})")
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


def db_alias() -> str:
    """The alias of the app's database (``DATABASE``): every statement of the package runs on
    ``django.db.connections[db_alias()]``, every transaction of its own is ``atomic(using=db_alias())``."""
    return get("DATABASE")


def get(name: str) -> Any:
    """Return setting ``name`` from ``settings.CRON_AT_SCALE`` or its default."""
    from django.conf import settings

    user = getattr(settings, "CRON_AT_SCALE", None) or {}
    if name in user:
        return user[name]
    return DEFAULTS[name]
