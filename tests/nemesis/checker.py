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
cancel), ``late`` (started later than the recovery bound after the faults
around its fire time healed). Failures from ``MAX_LOST_ATTEMPTS`` exhaustion
are counted apart (``lost_exhausted``): they are a policy, reported, not a
violation, unless a success was discarded.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

LIMITS = {
    # Database clock vs the ledger's real clock: one machine, so only the ledger's write delay and rounding.
    "skew": 0.25,
    # A task may write its start line this long after a cancel committed (it had started before it).
    "cancel_window": 1.0,
    # After the faults around a fire time have healed, a job starts within this many seconds. It covers
    # DISPATCH_LEASE (6) doubled by two never-started re-fires (backoff), plus the reaper and a restart.
    "recovery": 30.0,
    # A fault is blamed for what happens this long after it healed.
    "lookback": 10.0,
    # Cron occurrences due this close to the cron cancel need not have run.
    "cron_tail": 10.0,
}

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


@dataclass
class Result:
    violations: list[Violation] = field(default_factory=list)
    faults_by_kind: dict = field(default_factory=dict)  # kind -> count
    max_late_by_kind: dict = field(default_factory=dict)  # kind -> max lateness (s) of jobs due around it
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
        lines = [f"{'fault kind':<18} {'count':>5} {'max late s':>10} {'violations':>10}  rules",
                 "-" * 70]
        for k in kinds:
            rules = defaultdict(int)
            for v in by_kind[k]:
                rules[v.rule] += 1
            lines.append(f"{k:<18} {self.faults_by_kind.get(k, 0):>5} {self.max_late_by_kind.get(k, 0.0):>10.2f} "
                         f"{len(by_kind[k]):>10}  " + ", ".join(f"{r}={n}" for r, n in sorted(rules.items())))
        lines.append("-" * 70)
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
          faults: list[dict], limits: dict | None = None, max_lost: int = 5) -> Result:
    lim = {**LIMITS, **(limits or {})}
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
    lateness: list[tuple[float, float, str]] = []  # (due, start, job)
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
            lateness.append((w["fire_at"], min(x["wall"] for x in lines), job))

    # cron occurrences: each due from the first to the cancel (less the tail) ran
    cron_runs = 0
    for job, w in planned.items():
        if not w["kind"].startswith("cron"):
            continue
        by_occ: dict[float, float] = {}
        for line in starts.get(job, []):
            occ = round(_ts(line.get("occurrence")) or _ts(line["fire_at"]), 3)
            by_occ[occ] = min(by_occ.get(occ, line["wall"]), line["wall"])
        cron_runs += len(by_occ)
        end = cancels.get(job, {}).get("wall")
        if end is None:
            continue
        t = w["fire_at"]
        while t <= end - lim["cron_tail"]:
            if round(t, 3) not in by_occ:
                add("missed", job, t, f"cron occurrence {datetime.fromtimestamp(t).isoformat()} never ran")
            else:
                lateness.append((t, by_occ[round(t, 3)], job))
            t += w.get("step", 1)

    # late: start beyond the recovery bound after the faults around the fire time healed
    for due, start, job in lateness:
        around = [f for f in faults if f["start"] - lim["lookback"] <= due <= (f.get("heal") or f["start"]) + lim["lookback"]
                  or f["start"] <= start and (f.get("heal") or f["start"]) >= due]
        ready = max([due] + [(f.get("heal") or f["start"]) for f in around])
        late = start - due
        for f in around:
            k = f["kind"]
            res.max_late_by_kind[k] = max(res.max_late_by_kind.get(k, 0.0), late)
        if not around:
            res.max_late_by_kind["none"] = max(res.max_late_by_kind.get("none", 0.0), late)
        if start > ready + lim["recovery"]:
            v.append(Violation("late", job, start, f"started {late:.1f}s after its fire time, "
                               f"{start - ready:.1f}s after the faults around it healed",
                               max(around, key=lambda f: f.get("heal") or f["start"])["kind"] if around else "none"))

    res.stats = {"jobs": sum(1 for w in planned.values() if not w["kind"].startswith("cron")),
                 "ambiguous_inserts": len(ambiguous), "starts": sum(len(x) for x in starts.values()),
                 "cron_runs": cron_runs, "reexecuted_jobs": reexecuted,
                 "lost_attempts": sum(1 for r in attempts.values() if r.get("outcome") == "lost"),
                 "lost_exhausted": lost_exhausted,
                 "cancels": sum(1 for c in cancels.values() if c["cancelled"])}
    return res
