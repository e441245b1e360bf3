"""Prometheus metrics: hooks, database gauges on scrape, the Django view and the dispatcher's server."""

from __future__ import annotations

import socket
import urllib.error
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
    assert s[("cron_oldest_late_seconds", ())] == s[("cron_oldest_overdue_seconds", ())]
    assert s[("cron_jobs_late", ())] == s[("cron_jobs_pending", (("bucket", "overdue"),))] >= 1


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


# -- hardening: cached gauges, job keys on request, bind address, bearer token ---------------------------


def scrape(port: int, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db(transaction=True)
def test_database_gauges_are_computed_once_per_interval_whatever_the_scrapes(settings):
    import threading

    settings.CRON_AT_SCALE = {**settings.CRON_AT_SCALE, "METRICS_CACHE_SECONDS": 60}
    collector = metrics._db_collector
    collector.forget()
    before = collector.computations
    port = free_port()
    server = metrics.serve(port)
    try:
        results: list[tuple[int, str]] = []
        threads = [threading.Thread(target=lambda: results.append(scrape(port))) for _ in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [code for code, _ in results] == [200] * 40
        assert all("cron_database_up 1.0" in text for _, text in results)
        assert collector.computations - before == 1  # 40 concurrent scrapes, one computation
        cron_at_scale.schedule(noop)
        assert samples(scrape(port)[1])[("cron_jobs_pending", (("bucket", "overdue"),))] == 0  # cached
        collector.forget()  # the interval is over
        assert samples(scrape(port)[1])[("cron_jobs_pending", (("bucket", "overdue"),))] == 1
        assert collector.computations - before == 2
    finally:
        server.shutdown()
        collector.forget()


def test_job_keys_are_labels_only_when_asked(settings):
    cron_at_scale.schedule(noop, cron="0 4 * * *", key="secret-customer-42")
    for asked in (False, True):
        settings.CRON_AT_SCALE = {**settings.CRON_AT_SCALE, "METRICS_JOB_KEYS": asked}
        text = metrics.render().decode()
        assert ("secret-customer-42" in text) is asked
        assert ("cron_job_overdue" in text.replace("cron_job_overdue_", "").replace("cron_jobs_overdue", "")) is asked
        assert "cron_jobs_overdue 0.0" in text  # the count is there either way


def test_the_defaults_cache_for_ten_seconds_and_keep_keys_out():
    from cron_at_scale.conf import DEFAULTS

    assert DEFAULTS["METRICS_CACHE_SECONDS"] == 10.0 and DEFAULTS["METRICS_JOB_KEYS"] is False
    assert DEFAULTS["METRICS_TOKEN"] is None and metrics.DEFAULT_BIND == "127.0.0.1"


def test_the_server_listens_on_loopback_unless_told():
    port = free_port()
    server = metrics.serve(port)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()
    server = metrics.serve(port, addr="0.0.0.0")
    try:
        assert server.server_address[0] == "0.0.0.0"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.django_db(transaction=True)
def test_a_token_is_required_when_set(settings):
    settings.CRON_AT_SCALE = {**settings.CRON_AT_SCALE, "METRICS_TOKEN": "s3cret-token"}
    port = free_port()
    server = metrics.serve(port)
    try:
        for token in (None, "wrong", "s3cret-token-and-more", "s3cret-toke"):
            code, text = scrape(port, token)
            assert code == 401 and "cron_" not in text, token
        code, text = scrape(port, "s3cret-token")
        assert code == 200 and "cron_database_up 1.0" in text
    finally:
        server.shutdown()
        server.server_close()
    client = Client()
    r = client.get("/metrics")
    assert r.status_code == 401 and r["WWW-Authenticate"] == "Bearer" and b"cron_" not in r.content
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    r = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token")
    assert r.status_code == 200 and b"cron_database_up 1.0" in r.content


@pytest.mark.parametrize("setting", [{"METRICS_TOKEN": ""}, {"METRICS_TOKEN": "a b"}, {"METRICS_TOKEN": 7},
                                     {"METRICS_CACHE_SECONDS": -1}, {"METRICS_JOB_KEYS": "yes"},
                                     {"MAX_QUEUE_WAIT": -1}, {"MAX_QUEUE_WAIT": 30.0}])
def test_bad_metrics_and_pacing_settings_are_named(settings, setting):
    from cron_at_scale import conf

    settings.CRON_AT_SCALE = setting
    found = conf.problems()
    assert found and next(iter(setting)) in found[0], found
