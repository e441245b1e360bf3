"""Views: Prometheus metrics (``metrics``) and the admin dashboard's figures.

Route the metrics view yourself (it is not behind a login: Prometheus
scrapes it; expose it only where your scraper can reach it, and set
``METRICS_TOKEN`` to require ``Authorization: Bearer <token>``)::

    path("metrics", cron_at_scale.views.metrics)          # or include("cron_at_scale.urls")
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.views.decorators.http import require_GET

from cron_at_scale.ops.status import (
    DEFAULT_WINDOW,
    duration_text,
    oldest_due_per_queue,
    recent_lags,
    snapshot,
    why_late,
)

LAG_BARS = (0.01, 0.1, 0.5, 1, 5, 30, 60)  # seconds: the dashboard's lag histogram edges
CHART_WIDTH = 420  # px of the longest bar


@require_GET
def metrics(request):
    """Every cron_at_scale metric in Prometheus' text format (database gauges at most
    ``METRICS_CACHE_SECONDS`` old); 401 without the bearer token when ``METRICS_TOKEN`` is set."""
    from prometheus_client import CONTENT_TYPE_LATEST

    from cron_at_scale.ops import metrics as metricslib

    if not metricslib.authorized(request.headers.get("Authorization")):
        response = HttpResponse("401 Unauthorized: METRICS_TOKEN is set; send Authorization: Bearer <token>\n",
                                status=401, content_type="text/plain")
        response["WWW-Authenticate"] = "Bearer"
        return response
    return HttpResponse(metricslib.render(), content_type=CONTENT_TYPE_LATEST)


def _bars(items: list[tuple[str, int]]) -> list[dict[str, Any]]:
    top = max((n for _, n in items), default=0) or 1
    return [{"label": label, "value": n, "width": round(CHART_WIDTH * n / top), "y": i * 26}
            for i, (label, n) in enumerate(items)]


def lag_histogram(lags: list[float]) -> list[tuple[str, int]]:
    """Count of ``lags`` (seconds) per bar: ``≤10 ms``, ``≤100 ms`` … ``>60 s``."""
    counts = [0] * (len(LAG_BARS) + 1)
    for lag in lags:
        for i, edge in enumerate(LAG_BARS):
            if lag <= edge:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
    labels = [f"≤{e * 1000:g} ms" if e < 1 else f"≤{e:g} s" for e in LAG_BARS] + [f">{LAG_BARS[-1]:g} s"]
    return list(zip(labels, counts, strict=True))


def dashboard_context(window: float = DEFAULT_WINDOW) -> dict[str, Any]:
    """What the dashboard template shows: the status snapshot and two bar charts."""
    snap = snapshot(window)
    lags = recent_lags(window)
    # the snapshot's "overdue" bucket is a pending job past its fire time: "late" here, as in the job list
    # ("overdue" is the other rule: a recurring job with no success within its grace)
    bucket_labels = {"overdue": "late", "next_minute": "next minute", "next_hour": "next hour",
                     "next_day": "next day", "later": "later"}
    bucket_filters = {"overdue": "late", "next_minute": "minute", "next_hour": "hour", "next_day": "day",
                      "later": "later"}
    pending = _bars([(bucket_labels[k], v) for k, v in snap.pending.items()])
    for bar, key in zip(pending, snap.pending, strict=True):
        bar["due"] = bucket_filters[key]
    lag = _bars(lag_histogram(lags))
    ms = {k: (None if v is None else round(v * 1000, 1)) for k, v in snap.lag_seconds.items()}
    return {"status": snap, "pending_bars": pending, "pending_height": 26 * len(pending),
            "lag_bars": lag, "lag_height": 26 * len(lag), "lag_ms": ms, "window_minutes": round(window / 60),
            "capped": set(snap.capped), "estimated": set(snap.estimated), "queue_rows": queue_rows(snap),
            "oldest_late_text": duration_text(snap.oldest_overdue_seconds)}


def queue_rows(snap) -> list[dict[str, Any]]:
    """The dashboard's queues: each broker queue of the snapshot (held or not, and why, as
    ``cron_status`` says it) with the oldest due job waiting for it, and any job queue with a due job
    the survey did not list (its ``queue`` column, or ``(default)``)."""
    from cron_at_scale.celery_app import get_app
    from cron_at_scale.dispatcher.backpressure import destination

    states = {q["queue"]: (q["state"], q["held"]) for q in snap.queues}
    rows = {q["queue"]: {**q, "oldest": None, "job_queue": None} for q in snap.queues}
    app = get_app()
    for due in oldest_due_per_queue():
        reason = why_late(due["task"], due["queue"], states, snap.dispatchers_alive, app)
        try:
            name = destination(app, due["task"], due["queue"]) or due["queue"] or "(default)"
        except Exception:  # noqa: BLE001 (a task the router cannot place: list it under its job queue)
            name = due["queue"] or "(default)"
        row = rows.setdefault(name, {"queue": name, "depth": None, "consumers": None, "state": "-", "held": False,
                                     "oldest": None, "job_queue": due["queue"]})
        if row["oldest"] is None or due["fire_at"] < row["oldest"]["fire_at"]:
            row["oldest"] = {**due, "why": reason, "late_text": duration_text(due["late_seconds"])}
            row["job_queue"] = due["queue"]
    return sorted(rows.values(), key=lambda r: (not r["held"], r["oldest"] is None, r["queue"]))
