"""System checks and refusals at start: a setting that would break a promise is named before anything runs."""

from __future__ import annotations

import pytest
from celery import Celery
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured

from cron_at_scale.celery_app import get_app

plain_app = Celery("plain", set_as_current=False)  # a Celery app without cron_at_scale's task class


def ids(**kw):
    return {e.id for e in run_checks(include_deployment_checks=False, databases=["default"], **kw)
            if e.id.startswith("cron_at_scale")}


pytestmark = pytest.mark.django_db


def test_the_example_project_passes_every_check():
    assert ids() == set()


def test_a_database_that_is_not_postgresql_is_an_error(monkeypatch):
    from django.db import connections

    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    assert "cron_at_scale.E002" in ids()


def test_an_own_database_the_apps_models_are_not_routed_to_is_an_error(settings, monkeypatch):
    from cron_at_scale.checks import check_router

    monkeypatch.setitem(settings.DATABASES, "jobs", settings.DATABASES["default"])  # in place: see below
    settings.CRON_AT_SCALE = {"DATABASE": "jobs"}
    [error] = check_router()
    assert error.id == "cron_at_scale.E006" and "CRON_AT_SCALE['DATABASE'] is 'jobs'" in error.msg
    settings.DATABASE_ROUTERS = ["cron_at_scale.routers.CronAtScaleRouter"]
    assert check_router() == []
    settings.CRON_AT_SCALE = {"DATABASE": "nope"}
    assert any("'nope'" in e.msg for e in run_checks(include_deployment_checks=False)
               if e.id == "cron_at_scale.E001")


def test_a_server_that_may_lose_an_attempts_start_is_a_warning():
    from helpers import sql

    sql("SET LOCAL synchronous_commit = off")  # as a server-wide setting would read
    assert "cron_at_scale.W004" in ids()


def test_an_app_without_jobtask_is_an_error(settings):
    settings.CRON_AT_SCALE = {"CELERY_APP": "test_checks:plain_app"}
    from cron_at_scale.celery_app import _configured_app

    _configured_app.cache_clear()
    try:
        assert "cron_at_scale.E003" in ids()
    finally:
        _configured_app.cache_clear()


@pytest.mark.parametrize(("key", "value"), [("accept_content", ["json", "pickle"]), ("task_serializer", "pickle")])
def test_pickle_is_an_error_and_refused_at_start(key, value):
    from cron_at_scale.celery_app import refuse_pickle
    from cron_at_scale.dispatcher import Dispatcher

    app = get_app()
    old = app.conf[key]
    app.conf[key] = value
    try:
        assert "cron_at_scale.E004" in ids()
        with pytest.raises(ImproperlyConfigured, match="pickle"):
            refuse_pickle(app)
        with pytest.raises(ImproperlyConfigured, match="pickle"):
            Dispatcher()
    finally:
        app.conf[key] = old


def test_settings_that_break_promises_are_warnings(settings, monkeypatch):
    # The one key, in place: assigning DATABASES would make Django warn that connections keep the old one.
    monkeypatch.setitem(settings.DATABASES["default"], "CONN_MAX_AGE", 0)
    settings.CELERY_DB_REUSE_MAX = None
    settings.CRON_AT_SCALE = {"RUN_LEASE": 30, "HEARTBEAT_INTERVAL": 20}
    found = ids()
    assert {"cron_at_scale.W002", "cron_at_scale.W003"} <= found
    app = get_app()
    old = app.conf.broker_transport_options
    app.conf.broker_transport_options = {"visibility_timeout": 10}
    try:
        assert "cron_at_scale.W001" in ids()
    finally:
        app.conf.broker_transport_options = old


@pytest.fixture
def declare():
    """Register tasks on the project's Celery app for one test (``declare(name, **options)``)."""
    app, names = get_app(), []

    def make(name, **options):
        def run():
            pass

        names.append(name)
        return app.task(name=name, **options)(run).name  # .name: registered now, not lazily

    yield make
    for name in names:
        app.tasks.pop(name, None)


def messages(check_id):
    return [e.msg for e in run_checks(include_deployment_checks=False) if e.id == check_id]


def test_retry_options_a_scheduled_run_cannot_honour_are_errors_naming_them(declare):
    assert not messages("cron_at_scale.E005")
    declare("checks.requeue", autoretry_for=(ValueError,), retry_kwargs={"max_retries": 2, "queue": "slow"})
    found = messages("cron_at_scale.E005")
    assert len(found) == 1 and "checks.requeue" in found[0] and "retry_kwargs['queue']" in found[0]


def test_contradicting_retry_options_are_a_warning(declare):
    declare("checks.capped", autoretry_for=(ValueError,), retry_backoff=900)
    declare("checks.fine", autoretry_for=(ValueError,), retry_backoff=True, retry_backoff_max=60)
    found = messages("cron_at_scale.W005")
    assert len(found) == 1 and "checks.capped" in found[0] and "retry_backoff_max" in found[0]
