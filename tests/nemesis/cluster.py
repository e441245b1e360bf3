"""The nodes of a nemesis run: PostgreSQL primary (+ streaming standby), Redis, dispatchers, workers.

With ``databases=2`` the 64 shards are on two clusters (``tests.settings_sharded``): shards 0-31 on the
first (the pair above), 32-63 on a second primary of its own, without a standby; the dispatchers
take turns between the two (``--database default``, ``--database second``, ...).

Each dispatcher and worker may run in its own network namespace (``ip netns``)
joined to the host by a veth pair; PostgreSQL and Redis also listen on the
host side's address, so a partition is a ``tc`` filter inside the node's
namespace that drops its packets to one port. Without namespaces (not root,
no ``ip``), every node uses 127.0.0.1 and the partition faults are skipped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import faultkit

from . import schedule

# Short leases so that a fault costs seconds (see tests/faults/test_faults.py BASE and cron_at_scale/conf.py).
SETTINGS = {"DISPATCH_LEASE": 6.0, "RUN_LEASE": 4.0, "HEARTBEAT_INTERVAL": 1.0, "REAPER_INTERVAL": 0.5,
            "SHARD_LEASE": 3.0, "LOOKAHEAD": 1.0, "BATCH_SIZE": 200, "POLL_INTERVAL": 0.05, "MAX_LOST_ATTEMPTS": 5}
DB_NAME = "nemesis"
# Node i: host side 10.N.i.1 (PostgreSQL listens there) and 10.N.i.3 (Redis), namespace side 10.N.i.2;
# N from the pid, so that two runs on one host do not route each other's addresses.
SUBNET = f"10.{100 + os.getpid() % 150}"


def _sh(*args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    res = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {res.returncode} {res.stderr.strip()}")
    return res


def netns_unavailable() -> str:
    """Why network namespaces cannot be used here ('' when they can)."""
    if os.geteuid() != 0:
        return "not root: no network namespaces"
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            return f"no '{tool}' binary (iproute2)"
    name = f"nemprobe{os.getpid()}"
    res = _sh("ip", "netns", "add", name, check=False)
    if res.returncode != 0:
        return f"ip netns add failed: {res.stderr.strip()}"
    _sh("ip", "netns", "del", name, check=False)
    return ""


@dataclass
class Netns:
    """One node's namespace and veth pair; ``block(ip)``/``unblock()`` partition it from one server.

    This kernel has no tc action modules and no netfilter tools, so a partition is a
    ``blackhole`` route inside the namespace to the host address of that server: the node's
    packets to it are discarded (the server sees silence, the node's connects fail).
    """

    index: int
    tag: str

    @property
    def name(self) -> str:
        return f"nem{self.tag}n{self.index}"

    @property
    def host_if(self) -> str:
        return f"nm{self.tag}h{self.index}"[:15]

    @property
    def ns_if(self) -> str:
        return f"nm{self.tag}c{self.index}"[:15]

    @property
    def host_ip(self) -> str:
        return f"{SUBNET}.{self.index}.1"

    @property
    def broker_ip(self) -> str:
        return f"{SUBNET}.{self.index}.3"

    @property
    def ns_ip(self) -> str:
        return f"{SUBNET}.{self.index}.2"

    def create(self) -> None:
        _sh("ip", "netns", "add", self.name)
        _sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _sh("ip", "link", "set", self.ns_if, "netns", self.name)
        _sh("ip", "addr", "add", f"{self.host_ip}/29", "dev", self.host_if)
        _sh("ip", "addr", "add", f"{self.broker_ip}/29", "dev", self.host_if)
        _sh("ip", "link", "set", self.host_if, "up")
        self.run("ip", "addr", "add", f"{self.ns_ip}/29", "dev", self.ns_if)
        self.run("ip", "link", "set", self.ns_if, "up")
        self.run("ip", "link", "set", "lo", "up")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _sh("ip", "netns", "exec", self.name, *args, check=check)

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def block(self, ip: str) -> None:
        """Discard every packet this node sends to ``ip`` until ``unblock()``."""
        self.run("ip", "route", "add", "blackhole", f"{ip}/32")
        self.blocked = ip

    def unblock(self) -> None:
        ip = getattr(self, "blocked", None)
        if ip:
            self.run("ip", "route", "del", "blackhole", f"{ip}/32", check=False)
            self.blocked = None

    def destroy(self) -> None:
        _sh("ip", "link", "del", self.host_if, check=False)
        _sh("ip", "netns", "del", self.name, check=False)


# Seconds the WAL writer is frozen before a crash: the asynchronous commits of that time (claims,
# heartbeats; a start, were it asynchronous) stay in PostgreSQL's memory, unwritten, and are lost,
# as an operating system crash loses what was not flushed (fsync on or off, a crash of the server's
# processes alone loses only what they had not written). $NEMESIS_WAL_STALL changes it (0: a plain crash).
WAL_STALL = float(os.environ.get("NEMESIS_WAL_STALL", "0.5"))


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
    return out


def crash(pg: faultkit.PrivatePostgres) -> None:
    """Crash the server as a power loss would: WAL writer frozen for :data:`WAL_STALL`, then the
    postmaster frozen and every process of it killed -9 at once. ``start()`` brings it back."""
    pid = int((pg.data / "postmaster.pid").read_text().split()[0])
    kids = _children(pid)
    for k in kids:
        with contextlib.suppress(OSError):
            if b"walwriter" in Path(f"/proc/{k}/cmdline").read_bytes():
                os.kill(k, signal.SIGSTOP)
    time.sleep(WAL_STALL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    for k in set(kids) | set(_children(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(k, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:  # reaped: a new postmaster may start
        time.sleep(0.05)


class StandbyPostgres(faultkit.PrivatePostgres):
    """A streaming standby: ``pg_basebackup -R`` of ``primary`` (on ``port`` if given), then started."""

    def __init__(self, primary: faultkit.PrivatePostgres, port: int | None = None):
        super().__init__()
        if port is not None:
            self.port = port
        self.listen, self.extra_opts = primary.listen, primary.extra_opts
        self.server_env = dict(primary.server_env)  # the same faked clock (db_clock), if any
        self._run(str(self.bin / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                  "-D", str(self.data), "-R", "-X", "stream", "-c", "fast", timeout=300)


class _Background(threading.Thread):
    """``fn()`` in a thread; ``join()`` raises what it raised."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.error = fn, None
        self.start()

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as e:  # noqa: BLE001 (raised again in join)
            self.error = e

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


class Cluster:
    """Everything a run starts; ``close()`` stops it all (also after a failure)."""

    def __init__(self, run_dir: Path, dispatchers: int = 2, workers: int = 2, netns: bool = True,
                 standby: bool = True, settings: dict | None = None, fsync: bool = True,
                 bound_kinds: tuple[str, ...] = (), databases: int = 1):
        self.run_dir = run_dir
        self.databases = databases
        self.log_dir = run_dir / "logs"
        self.ledger_dir = run_dir / "ledger"
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        self.settings = dict(settings or SETTINGS)
        self.node_names = [f"d{i + 1}" for i in range(dispatchers)] + [f"w{i + 1}" for i in range(workers)]
        self.why_no_netns = netns_unavailable() if netns else "namespaces switched off (--no-netns)"
        self.ns: dict[str, Netns] = {}
        self.want_standby = standby
        self.fsync = fsync
        self.pg: faultkit.PrivatePostgres | None = None
        self.standby: faultkit.PrivatePostgres | None = None
        self.standby_ready = threading.Event()
        self.pg2: faultkit.PrivatePostgres | None = None  # shards 32-63 (databases=2)
        self.redis: faultkit.PrivateRedis | None = None
        self.system: faultkit.System | None = None
        self.offsets: dict[str, float] = {}  # node -> fake clock offset it runs with now
        self.down: set[str] = set()  # nodes deliberately not running (the supervisor leaves them)
        self.exits: list[tuple[float, str, int]] = []  # unexpected exits the supervisor restarted
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._spawned = 0
        # The faults with bounds of their own (schedule.BOUND_KINDS), set up only when asked for:
        # db_clock runs both servers under libfaketime, slow_link puts each worker behind proxies.
        self.bound_kinds = tuple(k for k in bound_kinds if not schedule.unavailable(k, databases))
        self.clock_control: Path | None = None
        self.why_no_db_clock = "" if "db_clock" in self.bound_kinds else "not asked for"
        self.links: dict[str, list[faultkit.SlowLink]] = {}  # worker -> its proxies, one per PostgreSQL port

    # -- start -------------------------------------------------------------

    def start(self) -> None:
        tag = str(os.getpid() % 10000)
        if not self.why_no_netns:
            for i, name in enumerate(self.node_names, start=1):
                ns = Netns(i, tag)
                ns.destroy()  # a leftover of a killed run with the same pid
                ns.create()
                self.ns[name] = ns
        self.pg = faultkit.PrivatePostgres()
        self.pg.listen = ",".join(["127.0.0.1", *(ns.host_ip for ns in self.ns.values())])
        self.pg.hba_extra = [f"host all all {SUBNET}.0.0/16 trust", f"host replication all {SUBNET}.0.0/16 trust"]
        # Synchronous replication while a standby streams: an acknowledged commit is on both, so a
        # failover loses none (with asynchronous replication it may, by design, not by a bug of ours).
        self.pg.extra_opts = "-c wal_level=replica -c max_wal_senders=10 -c wal_keep_size=512MB -c hot_standby=on"
        if self.fsync:
            # Durability on, as the guarantees assume: a later -c wins over faultkit's fsync=off, so a
            # crash (pg_restart, failover) loses only what a real server would lose.
            self.pg.extra_opts += " -c fsync=on -c full_page_writes=on"
        if "db_clock" in self.bound_kinds:
            ctl = Path(tempfile.mkdtemp(prefix="nemesis-dbclock-", dir="/tmp"))
            ctl.chmod(0o755)  # the servers run as postgres: they read the offset there
            try:
                self.pg.server_env = faultkit.faketime_env(ctl / "faketime.rc")
                self.clock_control = ctl / "faketime.rc"
            except faultkit.Unavailable as e:
                self.why_no_db_clock = str(e)
        second = None
        if self.databases > 1:
            self.pg2 = faultkit.PrivatePostgres()
            self.pg2.listen, self.pg2.hba_extra = self.pg.listen, self.pg.hba_extra
            self.pg2.extra_opts = "-c fsync=on -c full_page_writes=on" if self.fsync else ""
            # started and migrated while the first is: the setup's longest steps, side by side
            second = _Background(lambda: (self.pg2.start(), faultkit.migrate_template(self.pg2, DB_NAME, self.log_dir)))
        try:
            self.pg.start()
            faultkit.migrate_template(self.pg, DB_NAME, self.log_dir)
        finally:  # also on a failure: close() must not remove the second's directory under its initdb
            if second is not None:
                second.join()
        if self.want_standby:
            self._make_standby(self.pg)
        self.redis = faultkit.PrivateRedis()
        self.redis.bind = " ".join(["127.0.0.1", *(ns.broker_ip for ns in self.ns.values())])
        self.redis.start()
        self.system = faultkit.System(self.db_url(), self.redis.url(), self.log_dir, self.settings)
        for name in self.node_names:
            self.spawn(name)
        self.system.wait_workers([n for n in self.node_names if n.startswith("w")], timeout=120)
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        self._supervisor.start()

    def _make_standby(self, primary: faultkit.PrivatePostgres, port: int | None = None) -> None:
        self.standby_ready.clear()
        sb = StandbyPostgres(primary, port)
        sb.start()
        self.standby = sb
        admin = faultkit.connect(primary.url("postgres"))
        with admin.cursor() as cur:
            cur.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            cur.execute("SELECT pg_reload_conf()")
        admin.close()
        self.standby_ready.set()

    # -- addresses ---------------------------------------------------------

    def pg_ports(self) -> list[int]:
        """Both ports of the pair (a partition from PostgreSQL drops both)."""
        return list(self._url_ports)

    def db_url(self, host: str = "127.0.0.1") -> str:
        """Multi-host when there is a standby: whichever of the two accepts writes is the primary."""
        hosts = ",".join(f"{host}:{p}" for p in self._url_ports)
        return f"postgresql://postgres@{hosts}/{DB_NAME}?target_session_attrs=read-write&connect_timeout=5"

    @property
    def _url_ports(self) -> list[int]:
        # Fixed for the run: the two ports of the pair (a rebuilt standby takes the dead primary's port).
        if not hasattr(self, "_ports_fixed"):
            self._ports_fixed = [self.pg.port] + ([self.standby.port] if self.standby is not None else [])
        return self._ports_fixed

    def db2_url(self, host: str = "127.0.0.1") -> str:
        """The second cluster (shards 32-63), one server."""
        return f"postgresql://postgres@{host}:{self.pg2.port}/{DB_NAME}?connect_timeout=5"

    def db_urls(self) -> list[str]:
        """Each database's URL from this host, the first cluster's first."""
        return [self.db_url()] + ([self.db2_url()] if self.pg2 is not None else [])

    def database_of(self, name: str) -> str:
        """The alias dispatcher ``name`` serves: d1, d3, ... the first cluster, d2, d4, ... the second."""
        return "second" if int(name[1:]) % 2 == 0 else "default"

    def broker_url(self, host: str = "127.0.0.1") -> str:
        return f"redis://{host}:{self.redis.port}/0"

    # -- processes ---------------------------------------------------------

    def _worker_db_url(self, name: str, host: str) -> str:
        """A worker's URL through its proxies (slow_link), one per port of the pair, on ``host``."""
        if name not in self.links:
            self.links[name] = [faultkit.SlowLink("127.0.0.1", p, listen=host) for p in self._url_ports]
        hosts = ",".join(f"{host}:{link.port}" for link in self.links[name])
        return f"postgresql://postgres@{hosts}/{DB_NAME}?target_session_attrs=read-write&connect_timeout=5"

    def slow_link(self, name: str, delay: float) -> None:
        for link in self.links[name]:
            link.delay = delay

    def stall_claim(self, name: str) -> None:
        """The dispatcher stops itself (SIGSTOP) at its next claim that locked rows (failpoint)."""
        (self.run_dir / f"stall-{name}").touch()

    def unstall_claim(self, name: str) -> bool:
        """SIGCONT; whether the dispatcher had stalled (it took the trigger) or claimed nothing meanwhile."""
        trigger = self.run_dir / f"stall-{name}"
        stalled = not trigger.exists()
        trigger.unlink(missing_ok=True)
        self.signal(name, signal.SIGCONT)
        return stalled

    def step_db_clock(self, offset: float) -> None:
        assert self.clock_control is not None
        faultkit.step_clock(self.clock_control, offset)

    def spawn(self, name: str, clock_offset: float = 0.0) -> None:
        ns = self.ns.get(name)
        prefix = ns.prefix if ns else None
        host = ns.host_ip if ns else "127.0.0.1"
        slow = "slow_link" in self.bound_kinds and name.startswith("w")
        env = {"DATABASE_URL": self._worker_db_url(name, host) if slow else self.db_url(host),
               "CELERY_BROKER_URL": self.broker_url(ns.broker_ip if ns else "127.0.0.1"),
               "NEMESIS_LEDGER_DIR": str(self.ledger_dir), "NEMESIS_NODE": name, **self.extra_env}
        if "claim_stall" in self.bound_kinds and name.startswith("d"):
            env["CRON_AT_SCALE_FAILPOINTS"] = f"dispatcher.in_claim=stop:{self.run_dir / f'stall-{name}'}"
        extra = None
        if self.pg2 is not None:
            env.update(DJANGO_SETTINGS_MODULE="tests.settings_sharded", SECOND_DATABASE_URL=self.db2_url(host))
            extra = ["--database", self.database_of(name)]
        with self._lock:
            old = self.system.procs.get(name)
            if old is not None:
                self._spawned += 1
                self.system.procs[f"{name}~{self._spawned}"] = self.system.procs.pop(name)  # keep it for stop_all
            if name.startswith("w"):
                self.system.worker(name, concurrency=2, clock_offset=clock_offset, prefix=prefix, **env)
            else:
                self.system.dispatcher(name, clock_offset=clock_offset, prefix=prefix, extra=extra, **env)
            self.offsets[name] = clock_offset
            self.down.discard(name)

    extra_env: dict = {}

    def kill9(self, name: str) -> None:
        with self._lock:
            self.down.add(name)
            self.system.kill9(name)

    def signal(self, name: str, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.system.procs[name].pid, sig)

    def _supervise(self) -> None:
        """Restart a node that exited by itself, as systemd or Kubernetes would (and note it)."""
        while not self._stop.wait(0.5):
            with self._lock:
                for name in self.node_names:
                    p = self.system.procs.get(name)
                    if name in self.down or p is None or p.poll() is None:
                        continue
                    self.exits.append((time.time(), name, p.returncode))
                    self.spawn(name, self.offsets.get(name, 0.0))

    # -- servers -----------------------------------------------------------

    def pg_stop(self) -> None:
        crash(self.pg)

    def pg_start(self) -> None:
        self.pg.start()

    def pg2_stop(self) -> None:
        crash(self.pg2)

    def pg2_start(self) -> None:
        self.pg2.start()

    def broker_kill(self) -> None:
        self.redis.kill9()

    def broker_start(self) -> None:
        self.redis.start()

    def failover(self) -> None:
        """Kill the primary (-m immediate), promote the standby; a new standby is built in the background."""
        if not self.standby_ready.wait(120):
            raise RuntimeError("no standby ready for a failover")
        old, new = self.pg, self.standby
        self.standby = None
        self.standby_ready.clear()
        crash(old)
        new._run(str(new.bin / "pg_ctl"), "-D", str(new.data), "-w", "-t", "60", "promote")
        admin = faultkit.connect(new.url("postgres"))
        with admin.cursor() as cur:  # alone now: a synchronous standby it waits for would block every commit
            cur.execute("ALTER SYSTEM RESET synchronous_standby_names")
            cur.execute("SELECT pg_reload_conf()")
        admin.close()
        self.pg = new

        def rebuild():
            try:
                old.stop()  # removes the old data directory
                self._make_standby(new, port=old.port)
            except Exception as e:  # noqa: BLE001 (reported; a later failover then waits and fails)
                (self.run_dir / "standby-rebuild.err").write_text(repr(e))

        threading.Thread(target=rebuild, name="standby-rebuild", daemon=True).start()

    # -- stop --------------------------------------------------------------

    def close(self) -> None:
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(5)
        if self.system is not None:
            for p in list(self.system.procs.values()):  # a stopped group ignores SIGTERM until continued
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGCONT)
            self.system.stop_all()
        for ns in self.ns.values():
            ns.unblock()
        for links in self.links.values():
            for link in links:
                link.close()
        if self.clock_control is not None:
            shutil.rmtree(self.clock_control.parent, ignore_errors=True)
        for server in (self.redis, self.standby, self.pg, self.pg2):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.stop()
        for ns in self.ns.values():
            ns.destroy()
