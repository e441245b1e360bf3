"""The checker of a nemesis run: the whole history against the promises.

Inputs (all plain data, so a synthetic history can be checked too):

* ``ledger``: the tasks' own lines (``demo/ledger.py``): ``ev`` start/end,
  ``job``, ``attempt``, ``fire_at`` (ISO), ``occurrence``, ``wall`` (real UNIX
  seconds), ``pid``, ``offset``;
* ``jobs``: the final job rows (``id``, ``status``, ``lost_attempts``,
  ``attempts``), ``attempts``: attempt rows (``job``, ``attempt``,
  ``started_at`` as UNIX seconds or None, ``outcome``);
* ``workload``: ``workload.jsonl`` (jobs scheduled, cancels committed);
* ``faults``: applied faults with ``kind``, ``target``, ``start``, ``heal``
  (real UNIX seconds);
* ``limits``: the documented allowances (:data:`LIMITS`).

Rules (each violation names its rule, its evidence and the fault blamed):
``duplicate`` (a (job, attempt) started twice), ``missed`` (a job expected to
run never started, or a cron occurrence within the run never ran),
``unsettled`` (a one-off job still pending/in progress at the end),
``lost_job`` (a committed job whose row is gone), ``failed_not_by_policy``,
``success_discarded`` (a job failed although an attempt of it ended well),
``wrong_final`` (another unexpected final status), ``early`` (started before
its fire time less the skew), ``after_cancel`` (started after a committed
cancel), ``late`` (a run's first start later after its fire time than the
bounds of the faults that cover it allow, see :func:`allowed_start`),
``start_not_recorded`` (a task ran under an attempt whose row has no
``started_at``: its start was not durable), ``rerun_without_lost_lease`` (a run started again under a new attempt number
although its earlier attempt was neither retried nor lost to a fault that
could lose its lease), ``lost_without_fault`` (an attempt reaped as lost while
running with no such fault), ``success_not_recorded`` (a task returned well
per the ledger, but its attempt is not ``succeeded`` or its one-off job not
``completed``, and its worker did not die inside the completion window).
Failures from ``MAX_LOST_ATTEMPTS`` exhaustion are counted apart
(``lost_exhausted``): they are a policy, reported, not a violation, unless a
success was discarded.

Every bound comes from the run's settings (``settings``: DISPATCH_LEASE,
RUN_LEASE, HEARTBEAT_INTERVAL, REAPER_INTERVAL, SHARD_LEASE) and the recovery
bounds table of docs/guarantees.md, plus the slack of :data:`LIMITS`.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

LIMITS = {
    # Database clock vs the ledger's real clock: one machine, so only the ledger's write delay and rounding.
    "skew": 0.25,
    # A task may write its start line this long after a cancel committed (it had started before it).
    "cancel_window": 1.0,
    # A fault is blamed for what happens this long after it healed.
    "lookback": 10.0,
    # Cron occurrences due this close to the cron cancel need not have run.
    "cron_tail": 10.0,
    # A first start may come this long after the bound of the faults covering it (or its fire time, with
    # none): claim, publish, a free worker slot, the ledger line, on a 2-core box shared with other runs.
    "slack": 5.0,
    # A fault still covers jobs due this long after it healed (processes reconnect with a back-off up to
    # 5 s, docs/guarantees.md "PostgreSQL crash or restart": restart time + 5 s).
    "reconnect": 5.0,
    # And this much per fault covering it: each fault's recovery (a reconnect, a process booting) comes
    # after the previous one's when they overlap.
    "slack_per_fault": 1.0,
    # A run dispatched in time may wait this long more for a free worker slot: the recovery bounds count
    # "once workers are free", and the workload's longest task (``long``, 8 s) may hold every free slot
    # while a worker is down; plus the slack above.
    "queue_wait": 8.0,
    # A lease runs RUN_LEASE from the worker's last renewal; a renewal may come this late on a loaded box.
    "lease_slack": 1.5,
    # A success is durable once written: with the next start or COMPLETION_DELAY (0.05 s) after the task
    # returned; its worker dying this soon after the ledger's end line may lose it (promise 2's window).
    "completion_window": 1.0,
}

# Faults that can make a running attempt's lease expire: on the node that runs it, or on PostgreSQL.
NODE_LEASE_LOSS = ("kill", "clock", "exit", "stop", "partition_pg")
SERVER_LEASE_LOSS = ("pg_restart", "failover", "pg2_restart")
# A crash of the second cluster (shards 32-63, run(databases=2)) excuses nothing of the first's jobs:
# they keep firing, running and completing meanwhile.
SECOND_ONLY = ("pg2_restart",)
# Faults that kill a node's processes (a clock fault restarts the node when applied and when healed).
DEATH = ("kill", "clock", "exit")
# Faults during which a node cannot write to PostgreSQL (its completions wait).
NODE_NO_DB = ("stop", "partition_pg")


def _hurts(f: dict, job: str | None) -> bool:
    """Whether fault ``f`` may hurt ``job``: every fault, but a crash of the second cluster only its jobs."""
    return f["kind"] not in SECOND_ONLY or job is None or int(uuid.UUID(job)) & 63 >= 32


def _end(f: dict) -> float:
    """When a fault stopped hurting: its heal; a failover's outage ends when the standby is promoted."""
    if f["kind"] == "failover":
        return f.get("start_done") or f["start"]
    return f.get("heal") or f["start"]


def _node(worker: str | None, pids: dict[int, str]) -> str | None:
    """The node of an attempt row's ``worker`` (``host:pid`` of the pool process, or ``node@host``)."""
    if not worker:
        return None
    if "@" in worker:
        return worker.split("@")[0]
    pid = worker.rpartition(":")[2]
    return pids.get(int(pid)) if pid.isdigit() else None


def fault_bound(f: dict, ready: float, s: dict, lim: dict) -> float:
    """The latest first start (UNIX seconds, before slack) of a run ready at ``ready`` under fault ``f``.

    From docs/guarantees.md, "Recovery bounds", counted from the fault's start (or ``ready`` if later),
    not from its end, except where the table counts from the end (a server's restart time):

    * a worker down, stalled or cut off: its prefetched messages are lost, fired again after
      ``DISPATCH_LEASE``, by a reaper within ``REAPER_INTERVAL``;
    * a dispatcher down, stalled or cut off from PostgreSQL: ``SHARD_LEASE`` for new runs,
      ``DISPATCH_LEASE`` for the ones it claimed; cut off from the broker: ``SHARD_LEASE + DISPATCH_LEASE``;
    * PostgreSQL restarted, failed over, or the broker restarted: restart time + reconnect, or
      ``DISPATCH_LEASE`` for a message lost in it, whichever is later.
    """
    dl, ri, sl = float(s["DISPATCH_LEASE"]), float(s["REAPER_INTERVAL"]), float(s["SHARD_LEASE"])
    begin = max(ready, f["start"])
    kind, target = f["kind"], f.get("target", "")
    if kind in ("pg_restart", "failover", "broker_restart", "pg2_restart"):
        return max(max(ready, _end(f)) + lim["reconnect"], begin + dl) + ri
    if target.startswith("w"):
        return begin + dl + ri
    if target.startswith("d"):
        return begin + (sl + dl if kind == "partition_broker" else max(sl, dl)) + ri
    return max(ready, _end(f)) + dl + ri  # a kind this table does not know: counted from its end

SUCCESS_KINDS = ("now", "delayed", "retry", "long")


def _ts(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


@dataclass
class Violation:
    rule: str
    job: str
    at: float  # real UNIX seconds the evidence points at
    evidence: str
    blamed: str = "none"


def allowed_start(due: float, start: float, lost_unstarted: int, faults: list[dict], s: dict,
                  lim: dict, job: str | None = None) -> tuple[float, list[dict]]:
    """The latest first start (UNIX seconds) of a run due at ``due`` that started at ``start`` after
    ``lost_unstarted`` earlier attempts of it were lost before any worker started them; and the faults
    that cover it (begun before ``start``, ended at most ``reconnect`` seconds before ``due``).

    The latest of the covering faults' bounds (:func:`fault_bound`; one that ended before ``due``
    loses nothing of it: only ``reconnect`` after its end). Faults do not add up: a second fault that
    hurts the run again loses its message again, and the product counts that loss. So the second and
    later unstarted losses add their doubled dispatch leases (``DISPATCH_LEASE`` x 2^k, k <= 4), and
    the first is in the bound of a fault still active at ``due`` or, with none, one ``DISPATCH_LEASE``
    from when the run was ready.
    Then ``slack``, and ``slack_per_fault`` per covering fault. ``job``: only the faults that may hurt it.
    """
    dl, ri = float(s["DISPATCH_LEASE"]), float(s["REAPER_INTERVAL"])
    cov = sorted((f for f in faults if f["start"] <= start and _end(f) + lim["reconnect"] >= due and _hurts(f, job)),
                 key=lambda f: f["start"])
    t = due
    for f in cov:
        t = max(t, _end(f) + lim["reconnect"] if _end(f) < due else fault_bound(f, due, s, lim))
    if lost_unstarted and not [f for f in cov if _end(f) >= due]:
        t += dl + ri  # lost after the faults (a start that gave up while its connection came back)
    t += sum(dl * 2 ** min(k, 4) + ri for k in range(1, lost_unstarted))
    return t + lim["slack"] + lim["slack_per_fault"] * len(cov), cov


@dataclass
class Result:
    violations: list[Violation] = field(default_factory=list)
    faults_by_kind: dict = field(default_factory=dict)  # kind -> count
    max_late_by_kind: dict = field(default_factory=dict)  # kind -> max lateness (s) of jobs due around it
    margin_by_kind: dict = field(default_factory=dict)  # kind -> max (first start - allowed start), s
    stats: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # examples behind the counted figures

    @property
    def ok(self) -> bool:
        return not self.violations

    def table(self) -> str:
        kinds = sorted(set(self.faults_by_kind) | {v.blamed for v in self.violations})
        by_kind: dict[str, list[Violation]] = defaultdict(list)
        for v in self.violations:
            by_kind[v.blamed].append(v)
        lines = [f"{'fault kind':<18} {'count':>5} {'max late s':>10} {'vs bound s':>10} {'violations':>10}  rules",
                 "-" * 81]
        for k in kinds:
            rules = defaultdict(int)
            for v in by_kind[k]:
                rules[v.rule] += 1
            margin = self.margin_by_kind.get(k)
            lines.append(f"{k:<18} {self.faults_by_kind.get(k, 0):>5} {self.max_late_by_kind.get(k, 0.0):>10.2f} "
                         f"{'' if margin is None else f'{margin:+.2f}':>10} "
                         f"{len(by_kind[k]):>10}  " + ", ".join(f"{r}={n}" for r, n in sorted(rules.items())))
        lines.append("-" * 81)
        lines.append("max late: first start - fire time of the runs the kind covered; vs bound: the worst "
                     "first start - its allowed start (negative: within the bound)")
        lines.append("  ".join(f"{k}={v}" for k, v in self.stats.items()))
        lines += self.notes
        return "\n".join(lines)

    def evidence(self, limit: int = 25) -> str:
        out = []
        for v in sorted(self.violations, key=lambda v: v.at)[:limit]:
            out.append(f"[{v.rule}] job {v.job} (blamed: {v.blamed}): {v.evidence}")
        if len(self.violations) > limit:
            out.append(f"... and {len(self.violations) - limit} more")
        return "\n".join(out)


def read_jsonl(paths) -> list[dict]:
    out = []
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def check(ledger: list[dict], jobs: dict[str, dict], attempts: dict[tuple[str, int], dict], workload: list[dict],
          faults: list[dict], limits: dict | None = None, max_lost: int = 5, settings: dict | None = None) -> Result:
    if settings is None:
        from .cluster import SETTINGS as settings
    lim = {**LIMITS, **(limits or {})}
    sett = settings
    res = Result()
    v = res.violations
    faults = [f for f in faults if not f.get("error")]  # not applied: blamed for nothing, counted in stats
    for f in faults:
        res.faults_by_kind[f["kind"]] = res.faults_by_kind.get(f["kind"], 0) + 1

    def blame(t: float) -> str:
        near = [f for f in faults if f["start"] - 1.0 <= t <= (f.get("heal") or f["start"]) + lim["lookback"]]
        return max(near, key=lambda f: f["start"])["kind"] if near else "none"

    def add(rule, job, at, evidence):
        v.append(Violation(rule, job, at, evidence, blame(at)))

    def db_ahead(t: float) -> float:
        # how far a db_clock fault had set the database clock ahead of the real one at real time t:
        # fire times are on the database clock, the ledger's starts on the real one
        return max([f.get("offset", 0.0) for f in faults if f["kind"] == "db_clock"
                    and f["start"] - 1.0 <= t <= (f.get("heal") or f["start"]) + 1.0] + [0.0])

    steps = [f for f in faults if f["kind"] == "db_clock"]

    def real(t: float | None) -> float | None:
        # a database clock reading (fire times, attempt rows) as real time, through a db_clock step
        for f in steps:
            if t is not None and f["start"] - 1.0 <= t - f.get("offset", 0.0) <= (f.get("heal") or f["start"]) + 1.0:
                return t - f.get("offset", 0.0)
        return t

    if steps:
        attempts = {k: {**r, **{c: real(r.get(c)) for c in ("started_at", "finished_at", "dispatched_at")}}
                    for k, r in attempts.items()}

    planned = {w["job"]: w for w in workload if w["ev"] == "job"}
    ambiguous = {j for w in workload if w["ev"] == "ambiguous" for j in w["jobs"]}
    cancels = {w["job"]: w for w in workload if w["ev"] == "cancel"}
    starts: dict[str, list[dict]] = defaultdict(list)
    ends: dict[str, list[dict]] = defaultdict(list)
    for line in ledger:
        (starts if line["ev"] == "start" else ends)[line["job"]].append(line)

    # duplicate: one (job, attempt) started twice
    seen: dict[tuple[str, int], dict] = {}
    for line in sorted((x for xs in starts.values() for x in xs), key=lambda x: x["wall"]):
        key = (line["job"], line["attempt"])
        if key in seen:
            first = seen[key]
            add("duplicate", line["job"], line["wall"],
                f"attempt {line['attempt']} started twice: pid {first['pid']} at {first['wall']:.3f} and pid "
                f"{line['pid']} at {line['wall']:.3f}; attempt row {attempts.get(key)}")
        else:
            seen[key] = line

    # start_not_recorded: a task ran under an attempt number whose row says no worker started it (the
    # start, the fencing token, was lost: a crash could hand the same number out again)
    for line in seen.values():
        row = attempts.get((line["job"], line["attempt"]))
        if row is not None and row.get("started_at") is None:
            add("start_not_recorded", line["job"], line["wall"],
                f"attempt {line['attempt']} started at {line['wall']:.3f} (pid {line['pid']}, {line.get('node')}) "
                f"but its row has no start: {row}")

    # early: before the fire time the task was given (and, for one-off jobs, the one scheduled)
    for job, lines in starts.items():
        w = planned.get(job)
        for line in lines:
            due = _ts(line.get("occurrence")) or _ts(line["fire_at"])
            if w is not None and not w["kind"].startswith("cron") and line["attempt"] == 1:
                due = max(due or 0.0, w["fire_at"])
            if due is not None and line["wall"] + db_ahead(line["wall"]) < due - lim["skew"]:
                add("early", job, line["wall"], f"attempt {line['attempt']} started {due - line['wall']:.3f}s before "
                    f"its fire time (pid {line['pid']}, clock offset {line.get('offset')})")

    # after_cancel
    for job, c in cancels.items():
        if not c["cancelled"]:
            continue
        for line in starts.get(job, []):
            row = attempts.get((job, line["attempt"])) or {}
            started_db = row.get("started_at")
            if line["wall"] > c["wall"] + lim["cancel_window"] and (started_db is None or started_db > c["wall"]):
                add("after_cancel", job, line["wall"], f"attempt {line['attempt']} started {line['wall'] - c['wall']:.2f}s "
                    f"after the cancel committed (attempt row {row})")

    # final states, missed, lateness
    lateness: list[tuple[float, float, str, int, str | None]] = []  # (due, first start, job, its attempt, node)
    lost_exhausted = reexecuted = 0
    for job, w in planned.items():
        kind = w["kind"]
        if kind.startswith("cron"):
            continue
        row = jobs.get(job)
        if row is None:
            add("lost_job", job, w["fire_at"], f"{kind} job committed by the workload has no row")
            continue
        st = row["status"]
        lines = starts.get(job, [])
        if len({x["attempt"] for x in lines}) > 1 and kind in ("now", "delayed", "long"):
            reexecuted += 1
        if st in ("pending", "in_progress"):
            add("unsettled", job, w["fire_at"], f"{kind} job still {st} at the end (attempts {row.get('attempts')})")
            continue
        cancelled = cancels.get(job, {}).get("cancelled")
        if kind == "cancel" and cancelled:
            if st != "cancelled":
                add("wrong_final", job, w["fire_at"], f"cancelled job ended {st}")
            continue
        if st == "failed" and row.get("lost_attempts", 0) >= max_lost:
            lost_exhausted += 1
            if lost_exhausted <= 3:
                res.notes.append(f"{kind} job {job} failed for lost attempts: " + "; ".join(
                    f"#{a} {r.get('outcome')} {r.get('worker', '')} {r.get('error', '')}"
                    for (j, a), r in sorted(attempts.items()) if j == job))
        if kind in SUCCESS_KINDS or kind == "cancel":
            if not lines:
                add("missed", job, w["fire_at"], f"{kind} job never started (final {st})")
            if st == "failed" and not ends.get(job) and row.get("lost_attempts", 0) >= max_lost:
                pass  # MAX_LOST_ATTEMPTS runs vanished mid-run (killed workers): the policy, counted above
            elif st == "failed":
                rule = "success_discarded" if ends.get(job) else "failed_not_by_policy"
                ok_attempts = sorted({x["attempt"] for x in ends.get(job, [])})
                add(rule, job, w["fire_at"], f"{kind} job failed: lost_attempts {row.get('lost_attempts')}, started "
                    f"attempts {sorted({x['attempt'] for x in lines})}, ended well: {ok_attempts}; attempt rows "
                    + str({a: r.get('outcome') for (j, a), r in attempts.items() if j == job}))
            elif st != "completed":
                add("wrong_final", job, w["fire_at"], f"{kind} job ended {st}")
        elif kind == "always_fail":
            if st != "failed":
                add("wrong_final", job, w["fire_at"], f"always-failing job ended {st}")
            elif row.get("lost_attempts", 0) < max_lost:
                want = w["max_retries"] + 1
                got = len({x["attempt"] for x in lines})
                if got < want:
                    add("missed", job, w["fire_at"], f"always-failing job failed after {got} started attempts of {want}")
        if lines and kind != "cancel":
            first = min(lines, key=lambda x: x["wall"])
            lateness.append((w["fire_at"], first["wall"], job, first["attempt"], first.get("node")))

    # cron occurrences: each due from the first to the cancel (less the tail) ran
    cron_runs = 0
    for job, w in planned.items():
        if not w["kind"].startswith("cron"):
            continue
        by_occ: dict[float, tuple[float, int, str | None]] = {}  # occurrence -> its first start, attempt, node
        for line in starts.get(job, []):
            occ = round(_ts(line.get("occurrence")) or _ts(line["fire_at"]), 3)
            mine = (line["wall"], line["attempt"], line.get("node"))
            by_occ[occ] = min(by_occ.get(occ, mine), mine, key=lambda x: (x[0], x[1]))
        cron_runs += len(by_occ)
        end = cancels.get(job, {}).get("wall")
        if end is None:
            continue
        t = w["fire_at"]
        while t <= end - lim["cron_tail"]:
            if round(t, 3) not in by_occ:
                runs = {a: {k: r.get(k) for k in ("outcome", "worker", "dispatched_at", "started_at", "finished_at",
                                                  "error")}
                        for (j, a), r in sorted(attempts.items())
                        if j == job and r.get("scheduled_at") is not None and abs(r["scheduled_at"] - t) < 0.0005}
                add("missed", job, t, f"cron occurrence {datetime.fromtimestamp(t).isoformat()} never ran; its "
                    f"attempt rows: {runs or 'none'}")
            else:
                wall, attempt, node = by_occ[round(t, 3)]
                lateness.append((t, wall, job, attempt, node))
            t += w.get("step", 1)

    # late: a run's first start against the bounds of the faults covering it, counted from its fire time
    unstarted: dict[tuple, list[int]] = defaultdict(list)  # run -> attempts lost before a worker started them
    for (j, a), r in attempts.items():
        if r.get("outcome") == "lost" and r.get("started_at") is None:
            kind = planned.get(j, {}).get("kind", "")
            occ = round(r["scheduled_at"], 3) if kind.startswith("cron") and r.get("scheduled_at") else None
            unstarted[(j, occ)].append(a)
    for due_db, start, job, first, node in lateness:
        occ = round(due_db, 3) if planned[job]["kind"].startswith("cron") else None
        lost = sum(1 for a in unstarted.get((job, occ), []) if a < first)
        due = real(due_db) or due_db
        allowed, cov = allowed_start(due, start, lost, faults, sett, lim, job)
        # the bound is the dispatch's (claimed for the broker); the start may then wait for a free slot
        row = attempts.get((job, first)) or {}
        dispatched = row.get("dispatched_at")
        if dispatched is not None and dispatched <= allowed:
            # a worker paused or cut off from PostgreSQL when the message reached it starts it, and
            # waits for a slot, only once it is back (the message is not lost: its start resumes);
            # while another worker is out, this one's slots carry both shares of the backlog, so its
            # slot wait, too, counts from when the pool is whole again
            back = max([_end(f) + lim["reconnect"] for f in faults if node and f["start"] - 1.0 <= dispatched <= _end(f)
                        and (f["kind"] in NODE_NO_DB and f.get("target") == node
                             or f["kind"] in NODE_NO_DB + DEATH and f.get("target", "").startswith("w")
                             and f.get("target") != node)] + [dispatched])
            allowed = max(allowed, back + lim["queue_wait"] + lim["slack"])
        late = start - due
        row_start = "?" if row.get("started_at") is None else f"{row['started_at'] - due:+.1f}s"
        for k in {f["kind"] for f in cov} or {"none"}:
            res.max_late_by_kind[k] = max(res.max_late_by_kind.get(k, 0.0), late)
            res.margin_by_kind[k] = max(res.margin_by_kind.get(k, -1e9), start - allowed)
        if start > allowed:
            v.append(Violation("late", job, start, f"started {late:.1f}s after its fire time on {node} (dispatched "
                               f"{'?' if dispatched is None else f'{dispatched - due:+.1f}s'}, its row's start {row_start}), "
                               f"{start - allowed:.1f}s "
                               f"past its bound ({allowed - due:.1f}s: {lost} unstarted losses, covering faults "
                               + (", ".join(f"{f['kind']} {f.get('target')} at {f['start'] - due:+.1f}s for "
                                            f"{_end(f) - f['start']:.1f}s" for f in cov) or "none") + ")",
                               cov[-1]["kind"] if cov else "none"))

    _check_reruns(starts, ends, attempts, planned, cancels, jobs, faults, sett, lim, add, res)

    commit = sorted(line["wall"] - row["started_at"] for line in ledger if line["ev"] == "start"
                    for row in [attempts.get((line["job"], line["attempt"])) or {}] if row.get("started_at"))
    res.stats = {"jobs": sum(1 for w in planned.values() if not w["kind"].startswith("cron")),
                 "ambiguous_inserts": len(ambiguous), "starts": sum(len(x) for x in starts.values()),
                 "cron_runs": cron_runs, "reexecuted_jobs": reexecuted,
                 "lost_attempts": sum(1 for r in attempts.values() if r.get("outcome") == "lost"),
                 "lost_exhausted": lost_exhausted,
                 "cancels": sum(1 for c in cancels.values() if c["cancelled"]),
                 **res.stats}
    if commit:
        res.stats["start_to_ledger_ms_p50"] = round(1000 * commit[len(commit) // 2], 1)
        res.stats["start_to_ledger_ms_p99"] = round(1000 * commit[int(len(commit) * 0.99)], 1)
    return res


def _check_reruns(starts, ends, attempts, planned, cancels, jobs, faults, s, lim, add, res) -> None:
    """Rules ``rerun_without_lost_lease``, ``lost_without_fault`` and ``success_not_recorded``."""
    rl, hb = float(s["RUN_LEASE"]), float(s["HEARTBEAT_INTERVAL"])
    pids = {x["pid"]: x["node"] for xs in starts.values() for x in xs if x.get("node")}  # pool process -> node

    def lease_faults(node, t0, t1, job):
        """Faults that could make an attempt of ``job`` running on ``node`` from ``t0`` lose its lease by ``t1``:
        begun by ``t1``, not ended before ``t0``, and ``t1`` at least a lease after the last renewal."""
        out = []
        for f in faults:
            if not _hurts(f, job):
                continue
            if not (f["kind"] in SERVER_LEASE_LOSS
                    or f["kind"] in NODE_LEASE_LOSS and (node is None or f.get("target") == node)):
                continue
            if f["start"] <= t1 and _end(f) + lim["lease_slack"] >= t0 \
                    and t1 >= max(t0, f["start"] - hb) + rl - lim["lease_slack"]:
                out.append(f)
        return out

    def near(t):
        return ", ".join(f"{f['kind']} {f.get('target')} {f['start'] - t:+.1f}s..{_end(f) - t:+.1f}s"
                         for f in faults if f["start"] - 30 <= t <= _end(f) + 30) or "none"

    # a run that started again under a new attempt number: its earlier attempt was retried or lost its lease
    for job, lines in starts.items():
        kind = planned.get(job, {}).get("kind", "")
        runs: dict = defaultdict(dict)  # run key -> attempt -> its first start line
        for line in sorted(lines, key=lambda x: x["wall"]):
            key = (_ts(line.get("occurrence")) or _ts(line["fire_at"])) if kind.startswith("cron") else None
            runs[key].setdefault(line["attempt"], line)
        ended = {x["attempt"] for x in ends.get(job, [])}
        for by_attempt in runs.values():
            order = sorted(by_attempt)
            for k, m in zip(order, order[1:]):
                first, again = by_attempt[k], by_attempt[m]
                row = attempts.get((job, k)) or {}
                if row.get("outcome") == "retried" and k not in ended:
                    continue
                # the lease began at the start's commit: before the ledger line if the worker stalled between
                began = min(first["wall"], row.get("started_at") or first["wall"])
                if lease_faults(first.get("node"), began, again["wall"], job):
                    continue
                add("rerun_without_lost_lease", job, again["wall"],
                    f"attempt {k} (node {first.get('node')}, started {first['wall']:.2f}, outcome "
                    f"{row.get('outcome')}, {'ended well' if k in ended else 'no end line'}) ran again as attempt "
                    f"{m} {again['wall'] - first['wall']:.2f}s later on {again.get('node')}; no fault could lose "
                    f"its lease (RUN_LEASE {rl:g}s); faults near: {near(first['wall'])}")

    # an attempt reaped as lost while running: a fault made it lose its lease
    for (job, a), row in attempts.items():
        if row.get("outcome") != "lost" or row.get("started_at") is None or row.get("finished_at") is None:
            continue
        if not lease_faults(_node(row.get("worker"), pids), row["started_at"], row["finished_at"], job):
            add("lost_without_fault", job, row["finished_at"],
                f"attempt {a} started {row['started_at']:.2f} on {row.get('worker')} reaped as lost "
                f"{row['finished_at'] - row['started_at']:.2f}s later (RUN_LEASE {rl:g}s); faults near: "
                f"{near(row['started_at'])}")

    # a task that returned well: its attempt succeeded and its one-off job completed, unless its worker
    # died before the completion could be written
    in_window = 0
    for job, lines in ends.items():
        w = planned.get(job)
        if w is None:
            continue
        cancelled = bool(cancels.get(job, {}).get("cancelled"))
        for line in lines:
            row = attempts.get((job, line["attempt"])) or {}
            st = (jobs.get(job) or {}).get("status")
            good_row = row.get("outcome") == "succeeded" or cancelled and row.get("outcome") == "cancelled"
            good_job = w["kind"].startswith("cron") or st == "completed" or cancelled and st == "cancelled"
            if good_row and good_job:
                continue
            e, node = line["wall"], line.get("node")
            deadline = e + lim["completion_window"]
            for f in sorted(faults, key=lambda f: f["start"]):  # the write waits while its node cannot reach PG
                if (f["kind"] in SERVER_LEASE_LOSS and _hurts(f, job)
                        or f["kind"] in NODE_NO_DB and f.get("target") in (node, None)
                        or node is None and f["kind"] in NODE_NO_DB) and f["start"] <= deadline and _end(f) >= e:
                    deadline = max(deadline, _end(f) + lim["reconnect"])
            died = [f for f in faults if f["kind"] in DEATH and (node is None or f.get("target") == node)
                    and any(e - lim["completion_window"] <= t <= deadline
                            for t in (f["start"], *([_end(f)] if f["kind"] == "clock" else [])))]
            if died:
                in_window += 1
                continue
            add("success_not_recorded", job, e,
                f"attempt {line['attempt']} returned well at {e:.2f} on {node}; its attempt row is "
                f"{row.get('outcome')}, its job {st}; faults near: {near(e)}")
    res.stats["successes_lost_in_window"] = in_window
