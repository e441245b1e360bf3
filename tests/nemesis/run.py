"""One nemesis run: start the cluster, run the workload under the seeded faults, heal, settle, check."""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import faultkit

from . import checker
from .cluster import Cluster
from .schedule import (
    ALL_KINDS,
    BOUND_KINDS,
    EVERY_KIND,
    REQUIRED,
    REQUIRED_SHARDED,
    SHARDED_KINDS,
    SLOW_LINK_DELAY,
    Fault,
    covers,
    make_schedule,
    scenario,
    unavailable,
)
from .workload import Workload, database_of


@dataclass
class Outcome:
    result: checker.Result
    schedule: list[Fault]
    applied: list[dict]
    run_dir: Path
    skipped_kinds: dict
    missing: list[str]  # required scenarios (``cover``) that no applied fault was

    @property
    def ok(self) -> bool:
        return self.result.ok


def _say(msg: str) -> None:
    print(f"[nemesis] {msg}", flush=True)


class Nemesis:
    """Applies a schedule to a cluster; every fault applied and healed goes to ``faults.jsonl``."""

    def __init__(self, cluster: Cluster, run_dir: Path):
        self.c = cluster
        self.path = run_dir / "faults.jsonl"
        self.applied: list[dict] = []
        self.lock = threading.Lock()

    def _log(self, rec: dict) -> None:
        with self.lock:
            self.applied.append(rec)
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")

    def apply(self, f: Fault) -> dict:
        c = self.c
        rec = {**f.as_dict(), "start": time.time(), "heal": None, "error": None}
        try:
            if f.kind == "kill":
                c.kill9(f.target)
            elif f.kind == "stop":
                c.signal(f.target, signal.SIGSTOP)
            elif f.kind == "clock":
                c.kill9(f.target)
                c.spawn(f.target, clock_offset=f.offset)
            elif f.kind == "partition_pg":
                c.ns[f.target].block(c.ns[f.target].host_ip)
            elif f.kind == "partition_broker":
                c.ns[f.target].block(c.ns[f.target].broker_ip)
            elif f.kind == "pg_restart":
                c.pg_stop()
            elif f.kind == "pg2_restart":
                c.pg2_stop()
            elif f.kind == "broker_restart":
                c.broker_kill()
            elif f.kind == "failover":
                c.failover()
            elif f.kind == "claim_stall":
                c.stall_claim(f.target)
            elif f.kind == "db_clock":
                c.step_db_clock(f.offset)
            elif f.kind == "slow_link":
                c.slow_link(f.target, SLOW_LINK_DELAY)
            rec["start_done"] = time.time()
        except Exception as e:  # noqa: BLE001 (a fault that could not be applied is reported, not fatal)
            rec["error"] = f"apply: {e!r}"[:300]
        return rec

    def heal(self, f: Fault, rec: dict) -> None:
        c = self.c
        try:
            if f.kind == "kill":
                c.spawn(f.target, c.offsets.get(f.target, 0.0))
            elif f.kind == "stop":
                c.signal(f.target, signal.SIGCONT)
            elif f.kind == "clock":
                c.kill9(f.target)
                c.spawn(f.target, 0.0)
            elif f.kind.startswith("partition"):
                c.ns[f.target].unblock()
            elif f.kind == "pg_restart":
                c.pg_start()
            elif f.kind == "pg2_restart":
                c.pg2_start()
            elif f.kind == "broker_restart":
                c.broker_start()
            elif f.kind == "failover":
                c.standby_ready.wait(120)
            elif f.kind == "claim_stall":
                rec["stalled"] = c.unstall_claim(f.target)
            elif f.kind == "db_clock":
                c.step_db_clock(0.0)
            elif f.kind == "slow_link":
                c.slow_link(f.target, 0.0)
        except Exception as e:  # noqa: BLE001
            rec["error"] = ((rec["error"] or "") + f" heal: {e!r}")[:400]
        rec["heal"] = time.time()
        self._log(rec)

    def run(self, schedule: list[Fault], t0: float, stop: threading.Event) -> None:
        """Apply each fault at its time; heal it after its duration (in its own thread)."""
        threads = []
        for f in schedule:
            if stop.wait(max(0.0, t0 + f.at - time.monotonic())):
                break
            rec = self.apply(f)
            _say(f"fault   {f.describe()}" + (f"  ERROR {rec['error']}" if rec["error"] else ""))

            def later(f=f, rec=rec):
                time.sleep(f.duration)
                self.heal(f, rec)
                _say(f"healed  {f.kind} {f.target} after {rec['heal'] - rec['start']:.1f}s")

            th = threading.Thread(target=later, daemon=True)
            th.start()
            threads.append(th)
        for th in threads:
            th.join(180)


def available_kinds(cluster: Cluster, wanted: list[str]) -> tuple[list[str], dict]:
    skipped = {}
    kinds = []
    for k in wanted:
        if unavailable(k, cluster.databases):
            skipped[k] = unavailable(k, cluster.databases)
        elif k.startswith("partition") and cluster.why_no_netns:
            skipped[k] = cluster.why_no_netns
        elif k == "failover" and not cluster.want_standby:
            skipped[k] = "no standby (--no-standby)"
        elif k == "db_clock" and cluster.why_no_db_clock:
            skipped[k] = cluster.why_no_db_clock
        else:
            kinds.append(k)
    return kinds, skipped


def collect(cluster: Cluster, run_dir: Path) -> tuple:
    """The final rows, of every database (job ids are unique across them)."""
    jobs: dict = {}
    attempts: dict = {}
    fsyncs = []
    for url in cluster.db_urls():
        db = faultkit.DB(url)
        try:
            jobs.update({str(r[0]): {"status": r[1], "attempts": r[2], "lost_attempts": r[3]}
                         for r in db.q("SELECT id, status, attempts, lost_attempts FROM cron_at_scale_job")})
            attempts.update({(str(r[0]), r[1]): {"outcome": r[2], "started_at": r[3].timestamp() if r[3] else None,
                                                 "error": r[4][:120], "worker": r[5],
                                                 "finished_at": r[6].timestamp() if r[6] else None,
                                                 "scheduled_at": r[7].timestamp(), "dispatched_at": r[8].timestamp()}
                             for r in db.q("SELECT job_id, attempt, outcome, started_at, error, worker, finished_at, "
                                           "scheduled_at, dispatched_at FROM cron_at_scale_jobattempt")})
            fsyncs.append(db.one("SHOW fsync"))
        finally:
            db.close()
    fsync = "/".join(fsyncs)  # "on", or "on/on" with two databases
    # The final rows beside the ledger, so that the run can be checked again offline (recheck()).
    (run_dir / "rows.json").write_text(json.dumps({"jobs": jobs, "attempts": [[j, a, r] for (j, a), r in attempts.items()],
                                                   "fsync": fsync}))
    ledger = checker.read_jsonl(sorted((run_dir / "ledger").glob("*.jsonl")))
    workload = checker.read_jsonl([run_dir / "workload.jsonl"])
    # A node that exited by itself (a worker stuck after a broker restart) died as a kill would: a fault.
    with open(run_dir / "faults.jsonl", "a") as f:
        for t, name, rc in cluster.exits:
            f.write(json.dumps({"kind": "exit", "target": name, "start": t - 0.5, "heal": t, "duration": 0.5,
                                "at": None, "error": None, "returncode": rc}) + "\n")
    faults = checker.read_jsonl([run_dir / "faults.jsonl"])
    return ledger, jobs, attempts, workload, faults, fsync


def recheck(run_dir: Path, settings: dict | None = None, limits: dict | None = None) -> checker.Result:
    """Check a kept run directory again (after a change to the checker), from its files alone."""
    rows = json.loads((run_dir / "rows.json").read_text())
    attempts = {(j, a): r for j, a, r in rows["attempts"]}
    ledger = checker.read_jsonl(sorted((run_dir / "ledger").glob("*.jsonl")))
    workload = checker.read_jsonl([run_dir / "workload.jsonl"])
    faults = checker.read_jsonl([run_dir / "faults.jsonl"]) if (run_dir / "faults.jsonl").exists() else []
    return checker.check(ledger, rows["jobs"], attempts, workload, faults, limits, settings=settings)


def wait_settled(cluster: Cluster, timeout: float) -> float:
    dbs = [faultkit.DB(url) for url in cluster.db_urls()]
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            try:
                left = sum(db.one("""SELECT count(*) FROM cron_at_scale_job
                                     WHERE schedule_type = 'once' AND status IN ('pending', 'in_progress')""")
                           for db in dbs)
            except Exception:  # noqa: BLE001
                left = -1
            if left == 0:
                break
            time.sleep(1.0)
    finally:
        for db in dbs:
            db.close()
    return time.monotonic() - t0


def run(seed: int, minutes: float, dispatchers: int | None = None, workers: int = 2, kinds: list[str] | None = None,
        netns: bool = True, standby: bool = True, keep: bool = False, settle: float = 180.0,
        extra_env: dict | None = None, limits: dict | None = None, per_tick: int = 3,
        cover: tuple[str, ...] = (), fsync: bool = True, databases: int = 1,
        gap: tuple[float, float] | None = None) -> Outcome:
    """``cover``: scenarios scheduled first (:data:`schedule.REQUIRED`); ``fsync``: PostgreSQL's own.

    ``databases=2``: the shards on two clusters, two dispatchers for each unless ``dispatchers`` says
    otherwise (one would leave its database's shards unleased while it is down), and the second
    cluster's crash (``pg2_restart``) among the default kinds. ``gap``: seconds between two faults.
    """
    run_dir = Path(tempfile.mkdtemp(prefix=f"nemesis-{seed}-", dir="/tmp"))
    if dispatchers is None:
        dispatchers = 2 * databases
    if kinds is None and databases > 1:
        kinds = list(ALL_KINDS + SHARDED_KINDS)
    cluster = Cluster(run_dir, dispatchers, workers, netns=netns, standby=standby, fsync=fsync,
                      bound_kinds=tuple(k for k in BOUND_KINDS if k in (kinds or ALL_KINDS)), databases=databases)
    cluster.extra_env = dict(extra_env or {})
    stop = threading.Event()
    try:
        t_setup = time.monotonic()
        cluster.start()
        use, skipped = available_kinds(cluster, list(kinds or ALL_KINDS))
        schedule = make_schedule(seed, minutes, cluster.node_names, use, leases=cluster.settings["DISPATCH_LEASE"],
                                 cover=cover, **({"gap": gap} if gap else {}),
                                 **({"first": ("failover",)} if databases > 1 else {}))
        if databases > 1:
            _say("two databases: shards 0-31 on the first cluster (dispatchers "
                 + ", ".join(n for n in cluster.node_names if n[0] == "d" and cluster.database_of(n) == "default")
                 + "), 32-63 on the second ("
                 + ", ".join(n for n in cluster.node_names if n[0] == "d" and cluster.database_of(n) == "second") + ")")
        _say(f"seed {seed}, {minutes} min, nodes {cluster.node_names}, run dir {run_dir}, "
             f"setup {time.monotonic() - t_setup:.0f}s, partitions: "
             f"{'netns + blackhole routes' if not cluster.why_no_netns else 'off (' + cluster.why_no_netns + ')'}")
        for k, why in skipped.items():
            _say(f"fault kind {k} skipped: {why}")
        _say("schedule:\n" + "\n".join("    " + f.describe() for f in schedule))
        wl = Workload(cluster.db_url(), run_dir, seed, cluster.db2_url() if databases > 1 else None)
        wl.per_tick = per_tick
        wl.start()
        t0 = time.monotonic()
        nem = Nemesis(cluster, run_dir)
        nem.run(schedule, t0, stop)
        time.sleep(max(0.0, t0 + minutes * 60 - time.monotonic()))
        wl.stop()
        _say(f"workload stopped: {wl.ticks} ticks, {wl.skipped} failed inserts; settling")
        waited = wait_settled(cluster, settle)
        time.sleep(3.0)
        wl.cancel_crons()
        time.sleep(2.0)  # a late duplicate (a redelivered message) would land now
        ledger, jobs, attempts, workload, faults, fsync_now = collect(cluster, run_dir)
        res = checker.check(ledger, jobs, attempts, workload, faults, limits,
                            max_lost=int(cluster.settings["MAX_LOST_ATTEMPTS"]), settings=cluster.settings)
        res.stats["fsync"] = fsync_now
        if databases > 1:
            _two_cluster_stats(res, jobs, ledger, faults)
        applied = [f for f in faults if not f.get("error")]
        missing = [m for m in covers(applied, cover) if m.split(":")[0] in use]
        res.notes.append("scenarios covered: " + ", ".join(
            f"{k}={n}" for k, n in sorted(_count(scenario(f["kind"], f["target"]) for f in applied).items())))
        if cover:
            res.notes.append("required scenarios missing: " + (", ".join(missing) or "none"))
        res.stats["settle_s"] = round(waited, 1)
        res.stats["supervisor_restarts"] = len(cluster.exits)
        res.stats["fault_errors"] = sum(1 for f in faults if f.get("error"))
        if cluster.exits:
            _say(f"nodes that exited by themselves (restarted): {cluster.exits}")
        for f in faults:
            if f.get("error"):
                _say(f"fault error: {f['kind']} {f['target']}: {f['error']}")
        return Outcome(res, schedule, faults, run_dir, skipped, missing)
    finally:
        stop.set()
        cluster.close()
        if not keep:
            # Keep the evidence of a failing run; the rest goes.
            pass


def _two_cluster_stats(res: checker.Result, jobs: dict, ledger: list[dict], faults: list[dict]) -> None:
    """Each cluster fired (its one-off jobs completed), and how the first's runs due while the second
    was down fared (the checker holds them to their bounds; these are the figures)."""
    for i, name in enumerate(("default", "second")):
        res.stats[f"completed_{name}"] = sum(1 for j, r in jobs.items() if r["status"] == "completed"
                                             and database_of(j) == i)
    down = [(f["start"], f["heal"]) for f in faults if f["kind"] == "pg2_restart" and not f.get("error")]
    first: dict = {}  # (job, due) -> its first start, for the first cluster's runs
    for line in ledger:
        if line["ev"] == "start" and database_of(line["job"]) == 0:
            due = datetime.fromisoformat(line.get("occurrence") or line["fire_at"]).timestamp()
            first[(line["job"], due)] = min(first.get((line["job"], due), line["wall"]), line["wall"])
    late = [start - due for (_, due), start in first.items() if any(a <= due <= b for a, b in down)]
    res.stats["default_runs_due_while_second_down"] = len(late)
    res.stats["their_max_late_s"] = round(max(late, default=0.0), 2)


def _count(items) -> dict:
    out: dict = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.nemesis", description=__doc__)
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--dispatchers", type=int, default=None, help="default: two for each database")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--kinds", default=",".join(ALL_KINDS),
                    help=f"comma-separated fault kinds, or all (adds {','.join(BOUND_KINDS)})")
    ap.add_argument("--rate", type=int, default=3, help="one-off jobs due now per second (besides the rest)")
    ap.add_argument("--no-netns", action="store_true", help="no namespaces: partition faults are skipped")
    ap.add_argument("--no-standby", action="store_true", help="no streaming standby: failover is skipped")
    ap.add_argument("--schedule-only", action="store_true", help="print the schedule for these nodes and exit")
    ap.add_argument("--cover", action="store_true",
                    help="schedule every required scenario (schedule.REQUIRED, and the bounded kinds asked for) "
                         "first; exit 1 if one is missing")
    ap.add_argument("--fsync-off", action="store_true", help="PostgreSQL with fsync=off (to measure what it costs)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory also when the run passes")
    ap.add_argument("--databases", type=int, choices=(1, 2), default=1,
                    help="2: the shards on two clusters (tests.settings_sharded), adds the kind pg2_restart")
    ap.add_argument("--gap", default="", help="seconds between two faults, MIN,MAX (default 4,9)")
    a = ap.parse_args(argv)
    kinds = list(EVERY_KIND) if a.kinds == "all" else [k for k in a.kinds.split(",") if k]
    if a.databases > 1 and a.kinds == ",".join(ALL_KINDS):
        kinds += SHARDED_KINDS
    cover = (REQUIRED_SHARDED if a.databases > 1 else REQUIRED) + BOUND_KINDS if a.cover else ()
    gap = tuple(float(x) for x in a.gap.split(",")) if a.gap else None
    dispatchers = a.dispatchers or 2 * a.databases
    if a.schedule_only:
        nodes = [f"d{i + 1}" for i in range(dispatchers)] + [f"w{i + 1}" for i in range(a.workers)]
        kinds = [k for k in kinds if not unavailable(k, a.databases)]
        for f in make_schedule(a.seed, a.minutes, nodes, kinds, cover=cover, **({"gap": gap} if gap else {}),
                               **({"first": ("failover",)} if a.databases > 1 else {})):
            print(f.describe())
        return 0
    out = run(a.seed, a.minutes, dispatchers, a.workers, kinds, netns=not a.no_netns, standby=not a.no_standby,
              per_tick=a.rate, cover=cover, fsync=not a.fsync_off, databases=a.databases, gap=gap)
    ok = out.ok and not out.missing
    print(f"\n=== nemesis seed {a.seed}, {a.minutes} min: {'OK' if ok else 'VIOLATIONS' if not out.ok else 'MISSING'} ===")
    print(out.result.table())
    if not ok:
        print("\nevidence:")
        print(out.result.evidence())
        print(f"\nrun directory (ledger, workload, faults, logs): {out.run_dir}")
        print(f"reproduce: python -m tests.nemesis --seed {a.seed} --minutes {a.minutes}"
              + (f" --databases {a.databases}" if a.databases > 1 else "") + (f" --gap {a.gap}" if a.gap else ""))
    elif not a.keep:
        shutil.rmtree(out.run_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
