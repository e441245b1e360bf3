"""Fixtures of the fault-injection suite: private PostgreSQL and Redis it may kill.

These tests never use pytest-django's database: each scenario gets its own
database (a copy of a migrated template) on a private PostgreSQL cluster,
the private redis-server (flushed), and the processes it starts. Everything
is stopped at the end, also on failure.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import tempfile
from pathlib import Path

import faultkit
import pytest

TEMPLATE = "faults_template"


@pytest.fixture(autouse=True)
def _collect_own_garbage():
    """Collect each scenario's garbage at its own teardown: a socket or process object it left
    unclosed then warns (a failure, as every warning) against it, not against a later scenario."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def pg():
    """The private PostgreSQL cluster, or (without one) a private database on DATABASE_URL's server."""
    server = None
    try:
        server = faultkit.PrivatePostgres().start()
    except faultkit.Unavailable as e:
        if server is not None:
            server.stop()
        url = os.environ.get("DATABASE_URL")
        if not url:
            pytest.skip(f"no private PostgreSQL ({e}) and no DATABASE_URL to fall back on")
        server = faultkit.SharedPostgres(url)
        server.why_private_failed = str(e)
    log_dir = Path(tempfile.mkdtemp(prefix="caf-logs-", dir="/tmp"))
    try:
        faultkit.migrate_template(server, TEMPLATE, log_dir)
        yield server
    finally:
        server.stop()
        shutil.rmtree(log_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server():
    try:
        server = faultkit.PrivateRedis().start()
    except faultkit.Unavailable as e:
        pytest.skip(str(e))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def env(request, pg, redis_server, tmp_path):
    """One scenario's database, broker and process set; ``env.system(settings)`` starts the set."""

    class Env:
        pass

    e = Env()
    e.pg, e.redis = pg, redis_server
    name = "faults_" + re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:50]
    e.db_url = faultkit.create_database(pg, TEMPLATE, name)
    if not redis_server.ping():  # a scenario that killed it and failed before restarting it
        redis_server.start()
    redis_server.client().flushall()
    e.db = faultkit.DB(e.db_url)
    e.log_dir = tmp_path / "logs"
    systems: list[faultkit.System] = []

    def system(settings: dict) -> faultkit.System:
        s = faultkit.System(e.db_url, redis_server.url(), e.log_dir, settings)
        systems.append(s)
        return s

    e.system = system
    try:
        yield e
    finally:
        _stop(request, e, systems, redis_server)


def _stop(request, e, systems, redis_server) -> None:
    """A scenario's teardown: its processes (on a failure their stacks first, then their logs), its
    connections, Redis back up."""
    failed = getattr(request.node, "rep_failed", False)
    if failed:
        for s in systems:
            print(s.stacks())
        with contextlib.suppress(Exception):
            client = redis_server.client()
            print(f"redis: queue celery {client.llen('celery')}, clients:\n{client.client_list()}")
    for s in systems:
        s.stop_all()
    if failed:
        for s in systems:
            print(s.logs())
    e.db.close()
    if not redis_server.ping():
        redis_server.start()


@pytest.fixture(scope="session")
def pg2(pg):
    """A second private PostgreSQL cluster: the shards 32-63 of the two-cluster scenarios."""
    if pg.restart is None:
        pytest.skip(f"no private PostgreSQL cluster for a second one ({pg.why_private_failed})")
    server = faultkit.PrivatePostgres().start()
    log_dir = Path(tempfile.mkdtemp(prefix="caf-logs2-", dir="/tmp"))
    try:
        faultkit.migrate_template(server, TEMPLATE, log_dir)
        yield server
    finally:
        server.stop()
        shutil.rmtree(log_dir, ignore_errors=True)


@pytest.fixture
def env2(request, pg, pg2, redis_server, tmp_path):
    """A scenario on two clusters: its database on each (``default``: shards 0-31 and the demo's
    executions; ``second``: 32-63), ``env2.db`` both as one (:class:`faultkit.Spread`), and
    ``env2.system(settings)`` whose processes run with ``SHARD_DATABASES``."""

    class Env:
        pass

    e = Env()
    e.pg, e.pg2, e.redis = pg, pg2, redis_server
    name = "faults2_" + re.sub(r"[^a-z0-9_]", "_", request.node.name.lower())[:48]
    e.urls = {"default": faultkit.create_database(pg, TEMPLATE, name),
              "second": faultkit.create_database(pg2, TEMPLATE, name)}
    check_url = faultkit.create_database(pg, TEMPLATE, name + "_chk")
    if not redis_server.ping():
        redis_server.start()
    redis_server.client().flushall()
    e.db = faultkit.Spread({alias: faultkit.DB(url) for alias, url in e.urls.items()}, check_url)
    e.log_dir = tmp_path / "logs"
    systems: list[faultkit.System] = []

    def system(settings: dict) -> faultkit.System:
        s = faultkit.System(e.urls["default"], redis_server.url(), e.log_dir, settings, second_db_url=e.urls["second"])
        systems.append(s)
        return s

    e.system = system
    try:
        yield e
    finally:
        _stop(request, e, systems, redis_server)


_COLUMNS = {"scenario", "jobs", "executions", "reexecuted", "lost", "p50", "max", "extra", "seconds", "ok"}


def pytest_terminal_summary(terminalreporter):
    if not faultkit.RESULTS:
        return
    tr = terminalreporter
    tr.section("fault-injection scenarios")
    head = f"{'scenario':<44} {'jobs':>6} {'execs':>6} {'re-exec':>7} {'lost':>5} {'p50 s':>6} {'max s':>6} {'extra s':>7} {'ok':>3}  notes"
    tr.write_line(head)
    tr.write_line("-" * len(head))
    for r in faultkit.RESULTS:
        tr.write_line(f"{r['scenario']:<44} {r['jobs']:>6} {r['executions']:>6} {r['reexecuted']:>7} {r['lost']:>5} "
                      f"{r['p50']:>6.2f} {r['max']:>6.2f} {r['extra']:>7.2f} {'yes' if r['ok'] else 'NO':>3}  "
                      + ", ".join(f"{k}={v}" for k, v in r.items() if k not in _COLUMNS))
