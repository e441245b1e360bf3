"""Prometheus metrics: hooks, database gauges on scrape, the Django view and the dispatcher's server."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from demo.tasks import noop
from django.test import Client
from helpers import sql
from prometheus_client.parser import text_string_to_metric_families

import cron_at_scale
from cron_at_scale.ops import metrics

pytestmark = pytest.mark.django_db


def samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_view_serves_database_gauges():
    cron_at_scale.schedule(noop)
    cron_at_scale.schedule(noop, countdown=30)
    cron_at_scale.schedule(noop, countdown=7200)
    failed = cron_at_scale.schedule(noop)
    sql("UPDATE cron_at_scale_job SET status = 'failed' WHERE id = %s", [failed.id])
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() - interval '20 seconds' "
        "WHERE status = 'pending' AND fire_at <= statement_timestamp()")
    r = Client().get("/metrics")
    assert r.status_code == 200 and r["Content-Type"].startswith("text/plain")
    s = samples(r.content.decode())
    assert s[("cron_database_up", ())] == 1
    assert s[("cron_jobs_pending", (("bucket", "overdue"),))] == 1
    assert s[("cron_jobs_pending", (("bucket", "next_minute"),))] == 1
    assert s[("cron_jobs_pending", (("bucket", "next_day"),))] == 1
    assert s[("cron_dlq_jobs", ())] == 1
    assert s[("cron_oldest_overdue_seconds", ())] >= 19


def test_hooks_count():
    before = samples(metrics.render().decode())
    metrics.observe_claim(7, 0.004)
    metrics.observe_published(7, 0.01)
    metrics.observe_reaped(2)
    metrics.observe_dead_lettered()
    metrics.observe_start(0.12)
    metrics.observe_outcome("succeeded")
    after = samples(metrics.render().decode())

    def delta(name, labels=()):
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    assert delta("cron_jobs_claimed_total") == 7
    assert delta("cron_jobs_published_total") == 7
    assert delta("cron_lease_expiries_total") == 2
    assert delta("cron_jobs_dead_lettered_total") == 1
    assert delta("cron_attempts_finished_total", (("outcome", "succeeded"),)) == 1
    assert delta("cron_firing_lag_seconds_count") == 1
    assert delta("cron_claim_seconds_count") == 1


def test_serve_on_a_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = metrics.serve(port, addr="127.0.0.1")
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
    assert "cron_jobs_claimed_total" in text and "cron_database_up" in text
