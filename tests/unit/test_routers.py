"""CronAtScaleRouter: the app's models on ``CRON_AT_SCALE["DATABASE"]``, no opinion on other apps."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from cron_at_scale import conf
from cron_at_scale.models import Job, JobAttempt
from cron_at_scale.routers import CronAtScaleRouter

router = CronAtScaleRouter()


@pytest.fixture
def on_jobs(settings, monkeypatch):
    # The one key, in place: assigning DATABASES would make Django warn that connections keep the old one.
    monkeypatch.setitem(settings.DATABASES, "jobs", settings.DATABASES["default"])
    settings.CRON_AT_SCALE = {**settings.CRON_AT_SCALE, "DATABASE": "jobs"}


def test_the_apps_models_read_and_write_on_its_alias(on_jobs):
    assert conf.db_alias() == "jobs"
    for model in (Job, JobAttempt):
        assert router.db_for_read(model) == router.db_for_write(model) == "jobs"
    assert router.db_for_read(User) is None and router.db_for_write(User) is None


def test_the_app_migrates_on_its_alias_only_and_other_apps_are_left_to_others(on_jobs):
    assert router.allow_migrate("jobs", "cron_at_scale", model_name="job") is True
    assert router.allow_migrate("default", "cron_at_scale", model_name="job") is False
    assert router.allow_migrate("jobs", "auth") is None
    assert router.allow_migrate("default", "auth") is None


def test_relations_among_the_apps_models_only():
    job, attempt, user = Job(), JobAttempt(), User()
    assert router.allow_relation(job, attempt) is True
    assert router.allow_relation(job, user) is None
    assert router.allow_relation(user, user) is None


def test_the_default_is_default_and_an_unknown_alias_is_named(settings):
    assert conf.db_alias() == "default"
    assert router.db_for_write(Job) == "default"
    assert not any("DATABASE" in p for p in conf.problems())
    settings.CRON_AT_SCALE = {**settings.CRON_AT_SCALE, "DATABASE": "jbos"}
    assert [p for p in conf.problems() if "DATABASE" in p] == [
        "CRON_AT_SCALE['DATABASE'] is 'jbos', not an alias of settings.DATABASES (known: 'default')"]
