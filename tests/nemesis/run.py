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
from pathlib import Path

import faultkit

from . import checker
from .cluster import Cluster
from .schedule import (
    ALL_KINDS,
    BOUND_KINDS,
    EVERY_KIND,
    REQUIRED,
    SLOW_LINK_DELAY,
    Fault,
    covers,
    make_schedule,
    scenario,
)
from .workload import Workload


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
        if k.startswith("partition") and cluster.why_no_netns:
            skipped[k] = cluster.why_no_netns
        elif k == "failover" and not cluster.want_standby:
            skipped[k] = "no standby (--no-standby)"
        elif k == "db_clock" and cluster.why_no_db_clock:
            skipped[k] = cluster.why_no_db_clock
        else:
            kinds.append(k)
    return kinds, skipped


def collect(cluster: Cluster, run_dir: Path) -> tuple:
    db = faultkit.DB(cluster.db_url())
    try:
        jobs = {str(r[0]): {"status": r[1], "attempts": r[2], "lost_attempts": r[3]}
                for r in db.q("SELECT id, status, attempts, lost_attempts FROM cron_at_scale_job")}
        attempts = {(str(r[0]), r[1]): {"outcome": r[2], "started_at": r[3].timestamp() if r[3] else None,
                                         "error": r[4][:120], "worker": r[5],
                                         "finished_at": r[6].timestamp() if r[6] else None,
                                         "scheduled_at": r[7].timestamp(), "dispatched_at": r[8].timestamp()}
                    for r in db.q("SELECT job_id, attempt, outcome, started_at, error, worker, finished_at, "
                                  "scheduled_at, dispatched_at FROM cron_at_scale_jobattempt")}
        fsync = db.one("SHOW fsync")
    finally:
        db.close()
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
    db = faultkit.DB(cluster.db_url())
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            try:
                left = db.one("""SELECT count(*) FROM cron_at_scale_job
                                 WHERE schedule_type = 'once' AND status IN ('pending', 'in_progress')""")
            except Exception:  # noqa: BLE001
                left = -1
            if left == 0:
                break
            time.sleep(1.0)
    finally:
        db.close()
    return time.monotonic() - t0


def run(seed: int, minutes: float, dispatchers: int = 2, workers: int = 2, kinds: list[str] | None = None,
        netns: bool = True, standby: bool = True, keep: bool = False, settle: float = 180.0,
        extra_env: dict | None = None, limits: dict | None = None, per_tick: int = 3,
        cover: tuple[str, ...] = (), fsync: bool = True) -> Outcome:
    """``cover``: scenarios scheduled first (:data:`schedule.REQUIRED`); ``fsync``: PostgreSQL's own."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"nemesis-{seed}-", dir="/tmp"))
    cluster = Cluster(run_dir, dispatchers, workers, netns=netns, standby=standby, fsync=fsync,
                      bound_kinds=tuple(k for k in BOUND_KINDS if k in (kinds or ALL_KINDS)))
    cluster.extra_env = dict(extra_env or {})
    stop = threading.Event()
    try:
        t_setup = time.monotonic()
        cluster.start()
        use, skipped = available_kinds(cluster, list(kinds or ALL_KINDS))
        schedule = make_schedule(seed, minutes, cluster.node_names, use, leases=cluster.settings["DISPATCH_LEASE"],
                                 cover=cover)
        _say(f"seed {seed}, {minutes} min, nodes {cluster.node_names}, run dir {run_dir}, "
             f"setup {time.monotonic() - t_setup:.0f}s, partitions: "
             f"{'netns + blackhole routes' if not cluster.why_no_netns else 'off (' + cluster.why_no_netns + ')'}")
        for k, why in skipped.items():
            _say(f"fault kind {k} skipped: {why}")
        _say("schedule:\n" + "\n".join("    " + f.describe() for f in schedule))
        wl = Workload(cluster.db_url(), run_dir, seed)
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
    ap.add_argument("--dispatchers", type=int, default=2)
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
    a = ap.parse_args(argv)
    kinds = list(EVERY_KIND) if a.kinds == "all" else [k for k in a.kinds.split(",") if k]
    if a.schedule_only:
        nodes = [f"d{i + 1}" for i in range(a.dispatchers)] + [f"w{i + 1}" for i in range(a.workers)]
        for f in make_schedule(a.seed, a.minutes, nodes, kinds, cover=REQUIRED + BOUND_KINDS if a.cover else ()):
            print(f.describe())
        return 0
    out = run(a.seed, a.minutes, a.dispatchers, a.workers, kinds, netns=not a.no_netns, standby=not a.no_standby,
              per_tick=a.rate, cover=REQUIRED + BOUND_KINDS if a.cover else (), fsync=not a.fsync_off)
    ok = out.ok and not out.missing
    print(f"\n=== nemesis seed {a.seed}, {a.minutes} min: {'OK' if ok else 'VIOLATIONS' if not out.ok else 'MISSING'} ===")
    print(out.result.table())
    if not ok:
        print("\nevidence:")
        print(out.result.evidence())
        print(f"\nrun directory (ledger, workload, faults, logs): {out.run_dir}")
        print(f"reproduce: python -m tests.nemesis --seed {a.seed} --minutes {a.minutes}")
    elif not a.keep:
        shutil.rmtree(out.run_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
