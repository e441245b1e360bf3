"""Prometheus metrics (prometheus_client), served by the dispatcher and by a Django view.

Two kinds:

* **Events** the dispatcher counts as they happen (``observe_claim``,
  ``observe_published``, ``observe_reaped``, ``observe_dead_lettered``):
  counters and histograms in the dispatcher process, served on
  ``cron_dispatcher --metrics-port``.
* **State** read from the database by :class:`DatabaseCollector` at most once per
  ``METRICS_CACHE_SECONDS`` whatever the scrape rate (scrapes in between, concurrent ones
  included, get the same figures; bounded queries, see :mod:`cron_at_scale.ops.status`): pending jobs by
  ``fire_at`` bucket, oldest overdue job, dead-letter queue, attempts in
  progress, expired leases, missed cron occurrences, and the firing lag of
  the latest attempts, overdue recurring jobs (and, with ``METRICS_JOB_KEYS``, per live
  recurring job with a key, overdue or not and its latest success). Workers run in Celery's prefork children, whose
  per-process counters no scrape reaches; the database already knows what
  they did, so worker-side figures come from here.

The worker hooks (``observe_start``, ``observe_outcome``) count too, for a
worker that serves its own metrics (a solo/threads pool, or prefork with
``PROMETHEUS_MULTIPROC_DIR`` set: prometheus_client then writes them to
files the Django view aggregates).

Who may read them: ``METRICS_TOKEN`` (a bearer token, compared in constant time; 401 otherwise) for
the Django view and the dispatcher's server, which listens on ``--metrics-bind`` (127.0.0.1 unless
told: job names, queues and worker names are not for anyone who can reach the port).

Every metric lives in :data:`REGISTRY` (not prometheus_client's global one),
so importing this module never changes what another exporter serves.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

# Per-job series (cron_job_overdue, cron_job_last_success_timestamp_seconds): live recurring jobs
# with a key only, at most this many, so that the label cardinality stays what the project chose.
MAX_KEYED_JOBS = 1000

# Firing lag buckets, seconds: sub-second precision is the point, minutes are an incident.
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)

CLAIMED = Counter("cron_jobs_claimed", "Runs claimed by this dispatcher.", registry=REGISTRY)
PUBLISHED = Counter("cron_jobs_published", "Runs published to the broker by this dispatcher.", registry=REGISTRY)
REAPED = Counter("cron_lease_expiries", "Attempts whose lease expired with nobody finishing them (reaped).",
                 registry=REGISTRY)
DEAD_LETTERED = Counter("cron_jobs_dead_lettered", "Jobs that failed for good and were announced on the DLQ.",
                        registry=REGISTRY)
OUTCOMES = Counter("cron_attempts_finished", "Attempts finished in this process, by outcome "
                   "(succeeded, failed, retried, cancelled).", ["outcome"], registry=REGISTRY)
CLAIM_SECONDS = Histogram("cron_claim_seconds", "Duration of one claim statement (one batch).",
                          buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                          registry=REGISTRY)
BATCH_SIZE = Histogram("cron_claim_batch_jobs", "Runs claimed per claim statement.",
                       buckets=(1, 10, 100, 250, 500, 1000, 5000), registry=REGISTRY)
DISPATCH_SECONDS = Histogram("cron_dispatch_seconds", "Claim plus publish of one batch, seconds.",
                             buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                             registry=REGISTRY)
QUEUE_PACED = Gauge("cron_queue_paced", "1 while this dispatcher holds a queue's jobs in the database because "
                    "its backlog is MAX_QUEUE_WAIT of its consumers' work.", ["queue"], registry=REGISTRY)
QUEUE_DRAIN = Gauge("cron_queue_drain_rate", "Messages per second this dispatcher measured a queue's consumers "
                    "take (while it had a backlog).", ["queue"], registry=REGISTRY)
FIRING_LAG = Histogram("cron_firing_lag_seconds", "Scheduled fire_at to attempt start (observed by the worker).",
                       buckets=LAG_BUCKETS, registry=REGISTRY)


# -- hooks (cheap: a counter increment; called on the hot path) ----------------------------------


def observe_claim(n: int, seconds: float) -> None:
    """Dispatcher: one claim statement returned ``n`` runs in ``seconds``."""
    CLAIM_SECONDS.observe(seconds)
    if n:
        CLAIMED.inc(n)
        BATCH_SIZE.observe(n)


def observe_published(n: int, seconds: float | None = None) -> None:
    """Dispatcher: ``n`` runs published; ``seconds``: claim + publish of their batch."""
    if n:
        PUBLISHED.inc(n)
    if seconds is not None:
        DISPATCH_SECONDS.observe(seconds)


def observe_reaped(n: int) -> None:
    """Dispatcher: ``n`` attempts marked lost (lease expired)."""
    if n:
        REAPED.inc(n)


def observe_dead_lettered(n: int = 1) -> None:
    """Dispatcher or worker: ``n`` jobs failed for good (announced on the DLQ)."""
    if n:
        DEAD_LETTERED.inc(n)


def observe_pace(queue: str, paced: bool, drain: float | None) -> None:
    """Dispatcher: queue ``queue`` is paced or not; ``drain``: its consumers' measured messages/s."""
    QUEUE_PACED.labels(queue).set(1 if paced else 0)
    if drain is not None:
        QUEUE_DRAIN.labels(queue).set(drain)


def observe_start(lag_seconds: float) -> None:
    """Worker: an attempt started ``lag_seconds`` after its scheduled fire_at."""
    FIRING_LAG.observe(max(0.0, lag_seconds))


def observe_outcome(outcome: str) -> None:
    """Worker: an attempt finished with ``outcome`` (succeeded, failed, retried, cancelled)."""
    OUTCOMES.labels(outcome).inc()


# -- state, read from the database on scrape -------------------------------------------------------


class DatabaseCollector:
    """Gauges computed from the database (bounded queries; ~a dozen statements), at most once per
    ``METRICS_CACHE_SECONDS``: a scrape within that of the last computation, or while another scrape
    computes, gets the same figures (``computations`` counts the computations made).

    A scrape while the database is down yields ``cron_database_up 0`` and
    nothing else, instead of failing the whole scrape.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: list | None = None
        self._until = 0.0  # monotonic time until which _families stand
        self.computations = 0

    def describe(self):
        # Without it prometheus_client would call collect() at registration, i.e. query the
        # database whenever this module is imported (workers, manage.py migrate ...).
        return []

    def collect(self):
        from cron_at_scale import conf

        with self._lock:  # concurrent scrapes wait for the one computing, then share its figures
            if self._families is None or time.monotonic() >= self._until:
                self._families = list(self._compute(bool(conf.get("METRICS_JOB_KEYS"))))
                self.computations += 1
                self._until = time.monotonic() + float(conf.get("METRICS_CACHE_SECONDS"))
            families = self._families
        yield from families

    def forget(self) -> None:
        """Drop the cached figures: the next scrape computes them (tests; a settings change)."""
        with self._lock:
            self._families = None

    def _compute(self, keyed: bool):
        from django.db import transaction

        from cron_at_scale import conf
        from cron_at_scale import sql as db
        from cron_at_scale.maintenance import overdue
        from cron_at_scale.ops import status

        up = GaugeMetricFamily("cron_database_up", "1 when the scheduler's database answered this scrape.")
        for attempt in (1, 2):  # a connection the server closed while idle: reconnect once
            try:
                with transaction.atomic(using=conf.db_alias()):  # one transaction, not one per statement (~25)
                    snap = status.snapshot()
                    lags = status.recent_lags()
                    health = overdue.keyed_health(MAX_KEYED_JOBS) if keyed else []
                break
            except Exception as e:  # noqa: BLE001 (a scrape must answer; the reason goes to the log)
                if attempt == 2:
                    log.warning("metrics: database unavailable: %s", str(e).strip()[:200])
                    up.add_metric([], 0)
                    yield up
                    return
                db.reset_connection()
        up.add_metric([], 1)
        yield up
        pending = GaugeMetricFamily("cron_jobs_pending", "Pending jobs by fire_at bucket (counts capped at "
                                    f"{status.COUNT_CAP}; 'later' may be the planner's estimate).", labels=["bucket"])
        for bucket, n in snap.pending.items():
            pending.add_metric([bucket], n)
        yield pending
        # "late" as the admin and cron_status say it (due, not yet claimed); the overdue names are the same
        # figures under their older names, kept for dashboards and alerts written before
        yield GaugeMetricFamily("cron_oldest_late_seconds", "How long the oldest late job (due, pending) has waited.",
                                value=snap.oldest_overdue_seconds)
        yield GaugeMetricFamily("cron_jobs_late", "Late jobs: due, pending, not yet claimed (counts capped at "
                                f"{status.COUNT_CAP}).", value=snap.pending.get("overdue", 0))
        yield GaugeMetricFamily("cron_oldest_overdue_seconds", "The older name of cron_oldest_late_seconds.",
                                value=snap.oldest_overdue_seconds)
        yield GaugeMetricFamily("cron_dlq_jobs", "Failed jobs (the dead-letter queue).", value=snap.dlq)
        yield GaugeMetricFamily("cron_attempts_in_progress", "Attempts dispatched or running.", value=snap.in_progress)
        yield GaugeMetricFamily("cron_leases_expired", "Unfinished attempts whose lease expired, waiting for the reaper.",
                                value=snap.expired_leases)
        yield GaugeMetricFamily("cron_jobs_paused", "Paused recurring jobs.", value=snap.paused)
        yield GaugeMetricFamily("cron_dispatchers_alive", "Dispatchers that polled the database in the last minute.",
                                value=snap.dispatchers_alive)
        yield CounterMetricFamily("cron_missed_occurrences", "Cron occurrences skipped because nobody fired them "
                                  "within their catch-up window (sum over recurring jobs).",
                                  value=snap.missed_occurrences)
        alive = [w for w in snap.workers if w["alive"]]
        yield GaugeMetricFamily("cron_workers_alive", "Celery workers whose health heartbeat is recent.",
                                value=len(alive))
        yield GaugeMetricFamily("cron_workers_stuck", "Live Celery workers that stopped consuming while messages "
                                "wait in their queues (stuck, recovering or exiting).",
                                value=sum(1 for w in alive if w["stuck"]))
        idle = GaugeMetricFamily("cron_worker_last_consumed_seconds", "Seconds since a live worker received its "
                                 "latest task message (since it started, if none).", labels=["worker", "queue"])
        stuck = GaugeMetricFamily("cron_worker_stuck", "1 while a live worker is stuck (see cron_workers_stuck).",
                                  labels=["worker", "queue"])
        for w in alive:
            ago = w["last_received_seconds_ago"]
            for q in w["queues"] or [""]:
                if ago is not None:
                    idle.add_metric([w["name"], q], ago)
                stuck.add_metric([w["name"], q], 1 if w["stuck"] else 0)
        yield idle
        yield stuck
        held = GaugeMetricFamily("cron_queue_held", "1 while the dispatchers hold a broker queue's jobs in the "
                                 "database: it is full (over MAX_BROKER_DEPTH), paced (MAX_QUEUE_WAIT of its consumers' work "
                                 "waits in it) or has no consumer.",
                                 labels=["queue", "state"])
        messages = GaugeMetricFamily("cron_queue_messages", "Messages waiting in a broker queue.", labels=["queue"])
        consumers = GaugeMetricFamily("cron_queue_consumers", "Consumers of a broker queue (Redis: live workers "
                                      "whose health row lists it).", labels=["queue"])
        for q in snap.queues:
            held.add_metric([q["queue"], q["state"]], 1 if q["held"] else 0)
            if q["depth"] is not None:
                messages.add_metric([q["queue"]], q["depth"])
            if q["consumers"] is not None:
                consumers.add_metric([q["queue"]], q["consumers"])
        yield held
        yield messages
        yield consumers
        lag = GaugeMetricFamily("cron_recent_firing_lag_seconds", "Firing lag (fire_at to start) of the attempts "
                                f"started in the last {status.DEFAULT_WINDOW:.0f} s (latest {status.LAG_SAMPLE} "
                                "attempts), by quantile.", labels=["quantile"])
        for q, value in (("0.5", snap.lag_seconds["p50"]), ("0.99", snap.lag_seconds["p99"]),
                         ("1", snap.lag_seconds["max"])):
            if value is not None:
                lag.add_metric([q], value)
        yield lag
        yield GaugeMetricFamily("cron_recent_attempts_started", "Attempts the recent firing lag was computed from.",
                                value=len(lags))
        yield GaugeMetricFamily("cron_jobs_overdue", "Recurring jobs with no success within their grace of a due "
                                "occurrence (cron_at_scale.maintenance.overdue), keyed or not.", value=snap.overdue_jobs_count)
        late = GaugeMetricFamily("cron_job_overdue", "1 while a live recurring job with a key is overdue (at most "
                                    f"{MAX_KEYED_JOBS} keys, by key).", labels=["key"])
        last = GaugeMetricFamily("cron_job_last_success_timestamp_seconds", "When a live recurring job with a key "
                                 "last succeeded (UNIX seconds; absent until its first success).", labels=["key"])
        for key, is_overdue, succeeded_at in health:
            late.add_metric([key], 1 if is_overdue else 0)
            if succeeded_at is not None:
                last.add_metric([key], succeeded_at.timestamp())
        if keyed:
            yield late
            yield last


_db_collector = DatabaseCollector()
REGISTRY.register(_db_collector)


def registry_for_scrape() -> CollectorRegistry:
    """The registry to expose: :data:`REGISTRY`, or, with ``PROMETHEUS_MULTIPROC_DIR`` set, the
    aggregate of every process's files plus the database gauges."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(_db_collector)
    return registry


def render() -> bytes:
    """The metrics in Prometheus' text format."""
    return generate_latest(registry_for_scrape())


def authorized(header: str | None) -> bool:
    """Whether an ``Authorization`` header value may read the metrics: always without
    ``METRICS_TOKEN``; with it, only ``Bearer <token>`` (compared in constant time)."""
    from cron_at_scale import conf

    token = conf.get("METRICS_TOKEN")
    if not token:
        return True
    given = (header or "").encode()
    return hmac.compare_digest(given, f"Bearer {token}".encode())


def _guarded(app):
    """A WSGI app answering 401 unless :func:`authorized`."""

    def guarded(environ, start_response):
        if not authorized(environ.get("HTTP_AUTHORIZATION")):
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
            return [b"401 Unauthorized: METRICS_TOKEN is set; send Authorization: Bearer <token>\n"]
        return app(environ, start_response)

    return guarded


_server = None


class _ClosingRegistry:
    """The server thread's view of a registry: its database connection is closed after each scrape
    (a scrape every 15 s does not need a connection held open in between)."""

    def __init__(self, inner: CollectorRegistry):
        self.inner = inner

    def collect(self):
        from cron_at_scale import sql as db

        try:
            yield from self.inner.collect()
        finally:
            db.get_connection().close()

    def restricted_registry(self, names):
        return self.inner.restricted_registry(names)


DEFAULT_BIND = "127.0.0.1"  # loopback unless told: a scraper elsewhere is a choice (with METRICS_TOKEN)


def serve(port: int, addr: str = DEFAULT_BIND):
    """Serve ``/metrics`` on ``addr``:``port`` from a daemon thread (``cron_dispatcher --metrics-port``,
    ``--metrics-bind``), behind ``METRICS_TOKEN`` when set.

    Returns the server (``.shutdown()`` stops it). Raises ``OSError`` when the
    port is taken or the address is not this host's. The database gauges use
    their own connection (Django's connections are per thread).
    """
    global _server
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        request_queue_size = 128  # many scrapers at once wait in the backlog, not in SYN retries
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

        def shutdown(self) -> None:  # stopped is closed: no listening socket left to the collector
            super().shutdown()
            self.server_close()

    class Quiet(WSGIRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 (the stdlib's name): a line per scrape is noise
            pass

    app = _guarded(make_wsgi_app(_ClosingRegistry(registry_for_scrape())))  # type: ignore[arg-type]
    _server = make_server(addr, port, app, Server, handler_class=Quiet)
    threading.Thread(target=_server.serve_forever, daemon=True, name="metrics").start()
    log.info("metrics on http://%s:%d/metrics%s", addr, port,
             " (bearer token)" if _token_set() else "")
    return _server


def _token_set() -> bool:
    from cron_at_scale import conf

    return bool(conf.get("METRICS_TOKEN"))
