"""Infrastructure of the fault-injection suite: private servers, processes, jobs, checks.

Everything here runs real processes that the suite may kill: a private
PostgreSQL cluster and a private redis-server (never the machine's shared
ones, since scenarios kill and restart them), ``manage.py cron_dispatcher``
and ``celery -A example_project worker`` children, each in its own process
group (``kill -9`` of the group takes a prefork worker's children too).

The promise checked by :func:`check` reads the demo task's own table
(``demo_execution``, one row per real execution) next to the scheduler's
bookkeeping, against ``fault_expected``: one row per scheduled job with the
fire time it was scheduled for and the final status it must reach.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psycopg2
import psycopg2.extras

REPO_DIR = Path(__file__).resolve().parents[2]
PROJECT_DIR = REPO_DIR / "example_project"
CLOCK_DIR = Path(__file__).resolve().parent / "clock"  # its sitecustomize.py fakes the clock
PYTHON = sys.executable
HOSTNAME = "faults"  # celery node names: <name>@faults

# Figures of every scenario run in this session, printed by conftest's terminal summary.
RESULTS: list[dict] = []


class Unavailable(Exception):
    """A private server cannot be started on this machine (the reason says why)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


# ---------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------


def _pg_bin_dir() -> Path:
    """initdb/pg_ctl: the system's newest PostgreSQL, else the first on PATH. (The embedded wheel's
    server cannot stand in: these scenarios need pg_ctl stop -m immediate and standbys.)"""
    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0, reverse=True):
        if os.access(os.path.join(cand, "initdb"), os.X_OK) and os.access(os.path.join(cand, "pg_ctl"), os.X_OK):
            return Path(cand)
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(os.path.realpath(initdb)).parent
    raise Unavailable("no initdb/pg_ctl in /usr/lib/postgresql/*/bin or on PATH (apt-get install postgresql)")


class PrivatePostgres:
    """A throwaway PostgreSQL cluster in a temp dir, on a free TCP port of 127.0.0.1.

    initdb refuses to run as root: as root, the cluster belongs to the
    ``postgres`` system user and every server command runs through
    ``runuser -u postgres --``.
    """

    def __init__(self):
        self.bin = _pg_bin_dir()
        self.port = free_port()
        self.runas: list[str] = []
        self.user = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                raise Unavailable("running as root and there is no 'postgres' system user for initdb") from None
            runuser = shutil.which("runuser")
            if not runuser:
                raise Unavailable("running as root and there is no runuser to run initdb as 'postgres'")
            self.runas = [runuser, "-u", "postgres", "--"]
        # A short path: the unix socket also lives here (sun_path is ~107 bytes).
        self.dir = Path(tempfile.mkdtemp(prefix="caf-pg-", dir="/tmp"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        # Extended by tests/nemesis: more listen addresses (network namespaces), pg_hba lines
        # appended after initdb, and extra "-c" server options (streaming replication).
        self.listen = "127.0.0.1"
        self.hba_extra: list[str] = []
        self.extra_opts = ""
        self.server_env: dict[str, str] = {}  # more environment for the server (faketime_env)
        if self.user is not None:
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        os.chmod(self.dir, 0o755)

    @classmethod
    def attach(cls, directory: str, port: int) -> PrivatePostgres:
        """The cluster another process made in ``directory`` (its ``dir``), listening on ``port``: to
        stop and start it from here. Its ``stop()`` would remove the directory: leave that to its maker."""
        pg = cls.__new__(cls)
        pg.bin, pg.port, pg.dir = _pg_bin_dir(), port, Path(directory)
        pg.data, pg.log = pg.dir / "data", pg.dir / "postgres.log"
        pg.user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        pg.runas = ["runuser", "-u", "postgres", "--"] if pg.user is not None else []
        pg.listen, pg.hba_extra, pg.extra_opts, pg.server_env = "127.0.0.1", [], "", {}
        return pg

    def _run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        res = subprocess.run([*self.runas, *args], capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **self.server_env} if self.server_env else None)
        if res.returncode != 0:
            raise Unavailable(f"{' '.join(args[:2])} failed ({res.returncode}): {res.stdout[-1000:]}{res.stderr[-1000:]}")
        return res

    def start(self) -> PrivatePostgres:
        if not self.data.exists():
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                      "-E", "UTF8", "--no-sync")
            if self.hba_extra:
                with open(self.data / "pg_hba.conf", "a") as f:
                    f.write("".join(line + "\n" for line in self.hba_extra))
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses={self.listen} -c max_connections=300 "
                # fsync off: fast, and a crash of PostgreSQL (not of the OS) still loses no flushed
                # commit. synchronous_commit stays on, as on a real server: the tasks' own writes
                # (demo_execution) are durable once committed; the statements of ours that commit
                # asynchronously say so themselves (SET LOCAL), and are what a crash may lose.
                "-c fsync=off -c full_page_writes=off" + (f" {self.extra_opts}" if self.extra_opts else ""))
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w",
                      "-t", "60", "start")
        except Unavailable as e:
            raise Unavailable(f"{e}\n{self.log_tail()}") from None
        return self

    def restart(self, mode: str = "immediate") -> None:
        """``pg_ctl restart -m <mode>``: every connection is cut; clients must reconnect."""
        # -l again: without it the new postmaster writes to (and holds open) our stdout pipe.
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-m", mode, "-w", "-t", "60",
                  "restart")

    def halt(self, mode: str = "immediate") -> None:
        """``pg_ctl stop -m <mode>`` keeping the data directory (``start()`` brings it back)."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                subprocess.run([*self.runas, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                                "-w", "-t", "30", "stop"], capture_output=True, timeout=40)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def url(self, db: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"


def faketime_env(control: Path) -> dict[str, str]:
    """The environment that runs a server under libfaketime with its clock offset read from the
    file ``control`` (written "+0" here; write "+40" or "-30" to step the clock, at once; every
    reading rereads it). The monotonic clock stays real (PostgreSQL times its timeouts on it).
    Raises Unavailable without libfaketime (Debian: apt-get install faketime libfaketime)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    if not found:
        raise Unavailable("no libfaketime (apt-get install faketime libfaketime)")
    control.write_text("+0\n")
    control.chmod(0o644)
    return {"LD_PRELOAD": found[0], "FAKETIME_TIMESTAMP_FILE": str(control), "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def step_clock(control: Path, offset: float) -> None:
    """Set the faked clock of :func:`faketime_env`'s server to ``offset`` seconds from the real one."""
    tmp = control.with_suffix(".tmp")
    tmp.write_text(f"{round(offset):+d}\n")  # whole seconds: the form every libfaketime reads
    tmp.chmod(0o644)
    tmp.replace(control)  # a reader sees the old offset or the new one, never half a line


class SharedPostgres:
    """Fallback without a private cluster: a private *database* on DATABASE_URL's server.

    It cannot be restarted, so the PostgreSQL-restart scenario skips.
    """

    restart = None

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.base = parts
        self.why_private_failed = ""

    def start(self):
        return self

    def stop(self):
        pass

    def url(self, db: str) -> str:
        return self.base._replace(path=f"/{db}").geturl()


def connect(url: str, retry_for: float = 30.0):
    """An autocommit psycopg2 connection, retried while the server (re)starts."""
    deadline = time.monotonic() + retry_for
    while True:
        try:
            conn = psycopg2.connect(url, connect_timeout=3)
            conn.autocommit = True
            return conn
        except psycopg2.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class DB:
    """The test process's own connection to one scenario database; reconnects after a restart."""

    def __init__(self, url: str):
        self.url = url
        self.conn = connect(url)

    def q(self, sql: str, params=None):
        for attempt in range(3):
            try:
                with self.conn.cursor() as cur:
                    cur.execute(sql, params)
                    return cur.fetchall() if cur.description else cur.rowcount
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                if attempt == 2:
                    raise
                with contextlib.suppress(Exception):
                    self.conn.close()
                self.conn = connect(self.url)
        return None

    def one(self, sql: str, params=None):
        return self.q(sql, params)[0][0]

    def close(self):
        with contextlib.suppress(Exception):
            self.conn.close()


# ---------------------------------------------------------------------------
# A slow link (this kernel has no netem: a userspace TCP proxy)
# ---------------------------------------------------------------------------


class SlowLink:
    """A TCP proxy on a free port of 127.0.0.1 to ``(host, port)`` that holds every chunk it reads,
    each way, ``delay`` seconds before passing it on (read, sleep, write: a chunk also waits for the
    one before it, as on a congested link). ``delay`` may change while it runs (0: a plain proxy);
    ``listen``: the address it listens on. ``url(db_url)``: the same URL through the proxy."""

    def __init__(self, host: str, port: int, delay: float = 0.0, listen: str = "127.0.0.1"):
        self.target = (host, port)
        self.delay = delay
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((listen, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.chunks = 0
        self._open: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="slowlink-accept").start()

    def url(self, db_url: str) -> str:
        u = urlsplit(db_url)
        return u._replace(netloc=f"{u.username or 'postgres'}@127.0.0.1:{self.port}").geturl()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            self._open += [client, upstream]
            if self._closed:  # closed while this one connected: close() may have missed the pair
                client.close()
                upstream.close()
                return
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True, name="slowlink").start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self.chunks += 1
                if self.delay:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:  # either way ends both: closed here, none is left for the garbage collector to warn of
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.sock.close()
        for s in self._open:
            with contextlib.suppress(OSError):
                s.close()


# ---------------------------------------------------------------------------
# Redis
# ---------------------------------------------------------------------------


def _redis_bin() -> str:
    for cand in ("/usr/bin/redis-server", shutil.which("redis-server")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise Unavailable("no redis-server binary (apt-get install redis-server)")


class PrivateRedis:
    """A private redis-server without persistence: kill -9 loses every queued message."""

    def __init__(self):
        self.exe = _redis_bin()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="caf-redis-", dir="/tmp"))
        self.proc: subprocess.Popen | None = None
        self.bind = "127.0.0.1"  # space-separated addresses (tests/nemesis adds its namespaces' host side)

    def start(self) -> PrivateRedis:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", *self.bind.split(), "--save", "", "--appendonly", "no",
             # Protected mode refuses every address but loopback when there is no password.
             *(["--protected-mode", "no"] if self.bind != "127.0.0.1" else []),
             "--dir", str(self.dir), "--daemonize", "no", "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _wait(self.ping, 20, "redis-server to answer")
        return self

    def client(self):
        import redis  # noqa: PLC0415

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def ping(self) -> bool:
        try:
            return bool(self.client().ping())
        except Exception:  # noqa: BLE001
            return False

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        self.kill9()
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


class PrivateRabbit:
    """A private RabbitMQ node: its own port, node name and data directory, no plugins. Its durable
    queues survive a kill -9 and a start on the same directory; transient messages do not."""

    def __init__(self):
        self.exe = shutil.which("rabbitmq-server") or ""
        if not self.exe:
            raise Unavailable("no rabbitmq-server binary (apt-get install rabbitmq-server)")
        self.port, self.dist_port = free_port(), free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="caf-rabbit-", dir="/tmp"))
        (self.dir / "rabbitmq.conf").write_text(f"listeners.tcp.1 = 127.0.0.1:{self.port}\n")
        (self.dir / "enabled_plugins").write_text("[].\n")
        for sub in ("mnesia", "log"):
            (self.dir / sub).mkdir()
        with contextlib.suppress(KeyError):  # run as root, the server script runs the node as this user
            user = pwd.getpwnam("rabbitmq")
            for path in (self.dir, *self.dir.rglob("*")):
                os.chown(path, user.pw_uid, user.pw_gid)
        self.proc: subprocess.Popen | None = None

    def start(self) -> PrivateRabbit:
        d = self.dir
        env = {**os.environ, "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"), "RABBITMQ_NODENAME": f"caf{self.port}@localhost",
               "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(self.dist_port),
               "RABBITMQ_MNESIA_BASE": str(d / "mnesia"), "RABBITMQ_LOG_BASE": str(d / "log"),
               "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"), "RABBITMQ_PID_FILE": str(d / "pid")}
        with open(d / "server.out", "ab") as out:
            self.proc = subprocess.Popen([self.exe], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        _wait(self.ping, 120, "the private RabbitMQ node to answer", interval=0.25)
        return self

    def ping(self) -> bool:
        from kombu import Connection  # noqa: PLC0415

        try:
            with Connection(self.url(), connect_timeout=1) as conn:
                conn.connect()
            return True
        except Exception:  # noqa: BLE001
            return False

    def depth(self, queue: str) -> int:
        """Messages ready in ``queue`` (0 if it does not exist yet)."""
        from kombu import Connection  # noqa: PLC0415

        with Connection(self.url(), connect_timeout=2) as conn:
            try:
                return conn.default_channel.queue_declare(queue, passive=True).message_count
            except Exception:  # noqa: BLE001 (NOT_FOUND)
                return 0

    def kill9(self) -> None:
        """SIGKILL the node's Erlang VM (its helpers exit with it), as a power cut would."""
        pid_file = self.dir / "pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        if self.proc:
            self.proc.wait(30)
        _wait(lambda: not self.ping(), 30, "the private RabbitMQ node to go")
        pid_file.unlink(missing_ok=True)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.kill9()
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"


# ---------------------------------------------------------------------------
# Scenario database: created from a migrated template, plus fault_expected
# ---------------------------------------------------------------------------


def migrate_template(pg, name: str, log_dir: Path) -> None:
    admin = connect(pg.url("postgres"))
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    env = child_env(pg.url(name), "memory://")
    log_dir.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([PYTHON, "manage.py", "migrate", "-v", "0"], cwd=PROJECT_DIR, env=env,
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"migrate failed: {res.stdout[-2000:]}{res.stderr[-3000:]}")
    db = connect(pg.url(name))
    with db.cursor() as cur:
        cur.execute("""
            CREATE TABLE fault_expected (
                job_id uuid PRIMARY KEY, fire_at timestamptz NOT NULL, expect text NOT NULL, kind text NOT NULL)
        """)
    db.close()


def create_database(pg, template: str, name: str) -> str:
    admin = connect(pg.url("postgres"))
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cur.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    admin.close()
    return pg.url(name)


def schedule_once(db: DB | Spread, specs: list[tuple[float, str, dict]], expect: str = "completed",
                  kind: str = "") -> list[str]:
    """Insert one-off jobs: ``(seconds from now on the database clock, task, kwargs)`` each.

    Written straight into the Job table (the columns schedule() writes; the
    rest have database defaults), with their expected final state. On a
    :class:`Spread`, each job goes to the database of its shard.
    """
    rows = [(str(uuid.uuid4()), float(off), task, json.dumps({"args": [], "kwargs": kw})) for off, task, kw in specs]
    if isinstance(db, Spread):
        for alias, one in db.dbs.items():
            _insert_once(one, [r for r in rows if alias_of(r[0]) == alias], expect, kind)
    else:
        _insert_once(db, rows, expect, kind)
    return [r[0] for r in rows]


def _insert_once(db: DB, rows: list[tuple], expect: str, kind: str) -> None:
    if not rows:
        return
    with db.conn.cursor() as cur:
        cur.execute("SELECT statement_timestamp()")
        (now,) = cur.fetchone()
        psycopg2.extras.execute_values(cur, """
            INSERT INTO cron_at_scale_job (id, schedule_type, fire_at, task, payload, options, status)
            SELECT v.id::uuid, 'once', %(now)s::timestamptz + make_interval(secs => v.off::float8), v.task,
                   v.payload::jsonb, '{}'::jsonb, 'pending'
            FROM (VALUES %s) AS v(id, off, task, payload)
        """.replace("%(now)s", cur.mogrify("%s", (now,)).decode()), rows, page_size=5000)
        psycopg2.extras.execute_values(cur, """
            INSERT INTO fault_expected (job_id, fire_at, expect, kind)
            SELECT j.id, j.fire_at, v.expect, v.kind FROM (VALUES %s) AS v(id, expect, kind)
            JOIN cron_at_scale_job j ON j.id = v.id::uuid
        """, [(r[0], expect, kind or r[2]) for r in rows], page_size=5000)


def burst(n: int, window: float, task: str = "demo.tasks.record", start: float = 0.5, kw=None) -> list[tuple]:
    """``n`` jobs of ``task`` whose fire times are spread evenly over ``window`` seconds."""
    return [(start + window * i / max(1, n - 1), task, dict(kw or {})) for i in range(n)]


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------


def child_env(db_url: str, broker_url: str, settings: dict | None = None, clock_offset: float = 0.0,
              **extra: str) -> dict[str, str]:
    """The demo's child environment (``demo.runner.child_env``), plus this suite's: the scenario's
    settings, an optional fake clock, and nothing inherited that would change a child's behaviour."""
    if str(PROJECT_DIR) not in sys.path:  # run as a script (python -m tests.nemesis), not under pytest
        sys.path.append(str(PROJECT_DIR))
    from demo.runner import child_env as demo_env  # noqa: PLC0415

    inherited = {k: "" for k in ("CRON_AT_SCALE_FAILPOINTS", "FAKE_CLOCK_OFFSET", "PYTEST_CURRENT_TEST")}
    env = demo_env(db_url, broker_url, CRON_AT_SCALE_SETTINGS=json.dumps(settings or {}), PYTHONUNBUFFERED="1",
                   **inherited)
    for k in inherited:
        env.pop(k)
    if clock_offset:
        env["PYTHONPATH"] = os.pathsep.join([str(CLOCK_DIR), env["PYTHONPATH"]])
        env["FAKE_CLOCK_OFFSET"] = str(clock_offset)
    env.update(extra)
    return env


@dataclass
class System:
    """The processes of one scenario against its database and the private broker."""

    db_url: str
    broker_url: str
    log_dir: Path
    settings: dict
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _app: object = None
    second_db_url: str = ""  # set: the shards split over db_url and this one (SHARDED_SETTINGS)

    def env(self, clock_offset: float = 0.0, **extra) -> dict[str, str]:
        if self.second_db_url:
            extra = {"DJANGO_SETTINGS_MODULE": SHARDED_SETTINGS, "SECOND_DATABASE_URL": self.second_db_url, **extra}
        return child_env(self.db_url, self.broker_url, self.settings, clock_offset, **extra)

    def _spawn(self, name: str, args: list[str], env: dict, prefix: list[str] | None = None) -> subprocess.Popen:
        """Start ``args`` (after ``prefix``, e.g. ``ip netns exec NS``, which execs in place)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as out:
            proc = subprocess.Popen([*(prefix or []), *args], cwd=PROJECT_DIR, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # its own process group: killpg reaches the pool
        if name in self.procs and self.procs[name].poll() is None:
            raise RuntimeError(f"process {name} already running")
        self.procs[name] = proc
        return proc

    def worker(self, name: str, concurrency: int = 2, clock_offset: float = 0.0, extra: list[str] | None = None,
               prefix: list[str] | None = None, **env) -> subprocess.Popen:
        args = [PYTHON, "-m", "celery", "-A", "example_project", "worker", "-n", f"{name}@{HOSTNAME}",
                "-c", str(concurrency), "-P", "prefork", "-O", "fair", "--without-mingle", "--without-gossip",
                "-l", "warning", *(extra or [])]
        return self._spawn(name, args, self.env(clock_offset, **env), prefix)

    def dispatcher(self, name: str, clock_offset: float = 0.0, failpoints: str = "", extra: list[str] | None = None,
                   prefix: list[str] | None = None, database: str = "", **env) -> subprocess.Popen:
        """``database``: the alias whose shards it claims (``--database``; needed with two clusters)."""
        if failpoints:
            env["CRON_AT_SCALE_FAILPOINTS"] = failpoints
        args = [PYTHON, "manage.py", "cron_dispatcher", "--name", name, "-v", "0",
                *(["--database", database] if database else []), *(extra or [])]
        return self._spawn(name, args, self.env(clock_offset, **env), prefix)

    @property
    def app(self):
        if self._app is None:
            from celery import Celery  # noqa: PLC0415

            self._app = Celery("faults-probe", broker=self.broker_url)
        return self._app

    def wait_workers(self, names: list[str], timeout: float = 60.0) -> None:
        want = {f"{n}@{HOSTNAME}" for n in names}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n in names:
                p = self.procs[n]
                if p.poll() is not None:
                    raise RuntimeError(f"worker {n} exited with {p.returncode}:\n{self.log(n)}")
            # Celery lets CELERY_BROKER_URL in this process's environment (CI sets one for the
            # other tests) win over the probe app's own broker: hide it while pinging.
            saved = os.environ.pop("CELERY_BROKER_URL", None)
            try:
                replies = self.app.control.ping(destination=sorted(want), timeout=0.5) or []
            except Exception:  # noqa: BLE001 (broker restarting)
                replies = []
            finally:
                if saved is not None:
                    os.environ["CELERY_BROKER_URL"] = saved
            if want <= {next(iter(r)) for r in replies}:
                return
        raise TimeoutError(f"workers {sorted(want)} did not answer within {timeout:.0f}s")

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def kill9(self, name: str) -> None:
        """SIGKILL the process group of ``name`` (a prefork worker's parent and pool children)."""
        p = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)

    def group_of(self, pid: int) -> str | None:
        """Name of the process whose process group holds ``pid`` (e.g. a pool child)."""
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            return None
        for name, p in self.procs.items():
            if p.pid == pgid:
                return name
        return None

    def stop_all(self, timeout: float = 10.0) -> None:
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # The group, not only the leader: a pool child may outlive its parent.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        if self._app is not None:
            with contextlib.suppress(Exception):
                self._app.close()

    def log(self, name: str, n: int = 4000) -> str:
        try:
            return (self.log_dir / f"{name}.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stacks(self) -> str:
        """Every thread's Python stack in each live process of the set, pool children included
        (``py-spy dump``): what a hung process was waiting on, printed when a scenario fails."""
        spy = shutil.which("py-spy") or str(Path(PYTHON).with_name("py-spy"))
        if not os.access(spy, os.X_OK):
            return "(no py-spy to dump the processes' stacks)"
        out = []
        for name, p in self.procs.items():
            if p.poll() is not None:
                continue
            pids = subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    r = subprocess.run([spy, "dump", "--pid", pid], capture_output=True, text=True, timeout=30)
                    out.append(f"--- {name} pid {pid} ---\n{r.stdout}{r.stderr}")
                except (OSError, subprocess.SubprocessError) as e:  # the teardown goes on regardless
                    out.append(f"--- {name} pid {pid}: no stack ({e}) ---")
        return "\n".join(out)

    def logs(self, n: int = 1500) -> str:
        return "\n".join(f"--- {name} (exit {p.poll()}) ---\n{self.log(name, n)}" for name, p in self.procs.items())


# ---------------------------------------------------------------------------
# Two clusters: the 64 shards split over two scenario databases (SHARD_DATABASES)
# ---------------------------------------------------------------------------

# tests/settings_sharded.py: alias default (DATABASE_URL) holds shards 0-31, second
# (SECOND_DATABASE_URL) 32-63; the demo's own tables (demo_execution) are on default.
SHARDED_SETTINGS = "tests.settings_sharded"
ALIASES = ("default", "second")


def alias_of(job_id: str) -> str:
    """The alias of a job's shard (its id's low 6 bits, as the ``shard`` column computes it)."""
    return "second" if uuid.UUID(job_id).int & 63 >= 32 else "default"


class Spread:
    """A scenario's two databases read as one: ``one()`` adds up, ``q()`` concatenates.

    ``merged()`` copies the rows :func:`check` reads (jobs, attempts, expectations from both,
    executions from ``default``) into a third database, so that the same checks run unchanged.
    """

    def __init__(self, dbs: dict[str, DB], check_url: str):
        self.dbs = dbs
        self.check_url = check_url

    def q(self, sql: str, params=None):
        return [row for db in self.dbs.values() for row in db.q(sql, params)]

    def one(self, sql: str, params=None):
        return sum(db.one(sql, params) or 0 for db in self.dbs.values())

    def merged(self) -> DB:
        out = DB(self.check_url)
        out.q("TRUNCATE cron_at_scale_jobattempt, cron_at_scale_job, fault_expected, demo_execution CASCADE")
        for table, skip in (("cron_at_scale_job", ()), ("cron_at_scale_jobattempt", ("id",)),
                            ("fault_expected", ()), ("demo_execution", ("id",))):
            for alias, db in self.dbs.items():
                if table == "demo_execution" and alias != "default":
                    continue
                _copy_rows(db, out, table, skip)
        return out

    def close(self):
        for db in self.dbs.values():
            db.close()


def _copy_rows(src: DB, dst: DB, table: str, skip: tuple[str, ...]) -> None:
    """Every row of ``table`` from ``src`` into ``dst`` (COPY), without generated columns or ``skip``."""
    import io  # noqa: PLC0415

    cols = ", ".join(f'"{c}"' for (c,) in src.q(
        """SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' AND table_name = %s
           AND is_generated = 'NEVER' ORDER BY ordinal_position""", (table,)) if c not in skip)
    buf = io.StringIO()
    with src.conn.cursor() as cur:
        cur.copy_expert(f"COPY (SELECT {cols} FROM {table}) TO STDOUT", buf)
    buf.seek(0)
    with dst.conn.cursor() as cur:
        cur.copy_expert(f"COPY {table} ({cols}) FROM STDIN", buf)


# ---------------------------------------------------------------------------
# Waiting and checking
# ---------------------------------------------------------------------------


def unsettled(db: DB | Spread) -> int:
    """Expected one-off jobs still pending or in progress."""
    return db.one("""SELECT count(*) FROM fault_expected e JOIN cron_at_scale_job j ON j.id = e.job_id
                     WHERE j.status IN ('pending', 'in_progress')""")


def wait_settled(db: DB | Spread, timeout: float, system: System | None = None) -> float:
    """Wait until every expected one-off job left pending/in_progress; return the seconds waited."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        if unsettled(db) == 0:
            return time.monotonic() - t0
        time.sleep(0.25)
    return time.monotonic() - t0


@dataclass
class Report:
    scenario: str
    jobs: int = 0
    executions: int = 0
    reexecuted_jobs: int = 0
    lost_attempts: int = 0
    lateness_p50: float = 0.0
    lateness_max: float = 0.0
    problems: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def extra_lateness(self) -> float:
        return max(0.0, self.lateness_max - self.lateness_p50)

    def line(self) -> str:
        return (f"[faults] {self.scenario}: jobs {self.jobs}, executions {self.executions}, "
                f"re-executed jobs {self.reexecuted_jobs}, lost attempts {self.lost_attempts}, "
                f"lateness p50 {self.lateness_p50:.2f}s max {self.lateness_max:.2f}s "
                f"(extra {self.extra_lateness:.2f}s), {self.seconds:.0f}s"
                + (f", {json.dumps(self.extra)}" if self.extra else "")
                + (f"; PROBLEMS: {self.problems}" if self.problems else ""))


def check(db: DB | Spread, scenario: str) -> Report:
    """What the promise says, read from the database; ``problems`` lists every violation.
    On a :class:`Spread`, read from the rows of both databases copied into one."""
    if isinstance(db, Spread):
        merged = db.merged()
        try:
            return check(merged, scenario)
        finally:
            merged.close()
    r = Report(scenario)
    p = r.problems
    r.jobs = db.one("SELECT count(*) FROM fault_expected")
    # 1. Every job reached its expected final state.
    wrong = db.q("""SELECT e.job_id, e.expect, j.status, j.attempts, j.lost_attempts
                    FROM fault_expected e JOIN cron_at_scale_job j ON j.id = e.job_id
                    WHERE j.status <> e.expect ORDER BY e.fire_at LIMIT 5""")
    n_wrong = db.one("""SELECT count(*) FROM fault_expected e JOIN cron_at_scale_job j ON j.id = e.job_id
                        WHERE j.status <> e.expect""")
    if n_wrong:
        p.append(f"{n_wrong} jobs not in their expected final state, e.g. {[tuple(map(str, w)) for w in wrong]}")
    # 2. No job missed: every job expected to complete executed at least once, and the
    #    attempt the scheduler marked succeeded really executed (bookkeeping == reality).
    missed = db.one("""SELECT count(*) FROM fault_expected e WHERE e.expect = 'completed'
                       AND NOT EXISTS (SELECT 1 FROM demo_execution x WHERE x.job_id = e.job_id)""")
    if missed:
        p.append(f"{missed} jobs expected to complete never executed (missed)")
    phantom = db.one("""SELECT count(*) FROM fault_expected e JOIN cron_at_scale_jobattempt a ON a.job_id = e.job_id
                        WHERE a.outcome = 'succeeded' AND NOT EXISTS (
                          SELECT 1 FROM demo_execution x WHERE x.job_id = a.job_id AND x.attempt = a.attempt)""")
    if phantom:
        p.append(f"{phantom} attempts marked succeeded without an execution of that attempt")
    never = db.one("""SELECT count(*) FROM fault_expected e WHERE e.expect <> 'completed'
                      AND e.kind = 'demo.tasks.record'
                      AND EXISTS (SELECT 1 FROM demo_execution x WHERE x.job_id = e.job_id)""")
    if never:
        p.append(f"{never} jobs expected not to run executed")
    # 3. No attempt executed twice.
    dups = db.q("""SELECT job_id, attempt, count(*) FROM demo_execution GROUP BY 1, 2 HAVING count(*) > 1 LIMIT 5""")
    n_dups = db.one("""SELECT count(*) FROM (SELECT 1 FROM demo_execution GROUP BY job_id, attempt
                       HAVING count(*) > 1) d""")
    if n_dups:
        p.append(f"{n_dups} attempts executed more than once, e.g. {[tuple(map(str, d)) for d in dups]}")
    # 4. Nothing fired early (database clock): one-off jobs against their scheduled time,
    #    cron runs against their occurrence (the attempt's scheduled_at).
    early = db.one("""SELECT count(*) FROM demo_execution x JOIN fault_expected e ON e.job_id = x.job_id
                      WHERE x.executed_at < e.fire_at""")
    early_cron = db.one("""SELECT count(*) FROM demo_execution x JOIN cron_at_scale_jobattempt a
                             ON a.job_id = x.job_id AND a.attempt = x.attempt
                           JOIN cron_at_scale_job j ON j.id = x.job_id AND j.schedule_type = 'cron'
                           WHERE x.executed_at < a.scheduled_at""")
    if early or early_cron:
        p.append(f"{early + early_cron} executions before their fire time")
    r.executions = db.one("SELECT count(*) FROM demo_execution x JOIN fault_expected e ON e.job_id = x.job_id")
    r.reexecuted_jobs = db.one("""SELECT count(*) FROM (SELECT x.job_id FROM demo_execution x
                                  JOIN fault_expected e ON e.job_id = x.job_id AND e.kind <> 'cron'
                                  GROUP BY x.job_id HAVING count(DISTINCT x.attempt) > 1) m""")
    r.lost_attempts = db.one("SELECT count(*) FROM cron_at_scale_jobattempt WHERE outcome = 'lost'")
    lat = db.q("""SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY l), max(l) FROM (
                    SELECT extract(epoch FROM min(x.executed_at) - e.fire_at) AS l
                    FROM fault_expected e JOIN demo_execution x ON x.job_id = e.job_id GROUP BY e.job_id, e.fire_at) s""")
    r.lateness_p50, r.lateness_max = float(lat[0][0] or 0.0), float(lat[0][1] or 0.0)
    return r


def record(report: Report) -> None:
    RESULTS.append({"scenario": report.scenario, "jobs": report.jobs, "executions": report.executions,
                    "reexecuted": report.reexecuted_jobs, "lost": report.lost_attempts,
                    "p50": report.lateness_p50, "max": report.lateness_max, "extra": report.extra_lateness,
                    "seconds": report.seconds, "ok": not report.problems, **report.extra})
    print("\n" + report.line(), flush=True)


# ---------------------------------------------------------------------------
# Overload: the broker's depth and a process group's memory and CPU, sampled
# ---------------------------------------------------------------------------


def broker_depth(redis_client, queue: str = "celery") -> int:
    """Messages waiting in ``queue`` on Redis: its list and kombu's priority lists beside it."""
    n = 0
    for key in redis_client.scan_iter(match=f"{queue}*", count=1000):
        if key in (queue.encode(), *(f"{queue}\x06\x16{p}".encode() for p in range(10))):
            n += redis_client.llen(key)
    return n


def group_pids(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (a prefork worker: its parent and pool children)."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:  # fields after the command: state, ppid, pgrp, ...
                pids.append(int(d))
    return pids


def group_rss_mb(pgid: int, only: int | None = None) -> float:
    """Resident memory of process group ``pgid`` (of its process ``only``, if given), in MiB, from
    /proc (shared pages counted per process)."""
    total = 0
    for pid in group_pids(pgid) if only is None else [only]:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1])
    return total * os.sysconf("SC_PAGE_SIZE") / 2**20


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of the live processes of group ``pgid``, from /proc."""
    total = 0
    for pid in group_pids(pgid):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


class Sampler:
    """A thread that samples ``probe()`` every ``interval`` seconds and keeps the peak and the last."""

    def __init__(self, probe, interval: float = 0.25):
        import threading  # noqa: PLC0415

        self.probe, self.interval = probe, interval
        self.peak = self.last = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a sample lost to a restart is not a figure
                self.last = self.probe()
                self.peak = max(self.peak, self.last)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
