"""The nemesis run under pytest: a short seed for CI, and the checker's self-tests.

``NEMESIS_SEED`` / ``NEMESIS_MINUTES`` choose the run (default seed 11, 2 minutes);
``NEMESIS_MINUTES_SHARDED`` the two-cluster run's (1 minute).
A failure prints the schedule, the table and the evidence; the same seed
replays the same schedule (``python -m tests.nemesis --seed S --minutes M``).
"""

from __future__ import annotations

import os
import uuid

import pytest

from . import checker
from .run import run
from .schedule import ALL_KINDS, BOUND_KINDS, REQUIRED, REQUIRED_SHARDED, SHARDED_KINDS, covers, make_schedule
from .workload import database_of

pytestmark = [pytest.mark.faults, pytest.mark.nemesis]

SEED = int(os.environ.get("NEMESIS_SEED", "11"))
MINUTES = float(os.environ.get("NEMESIS_MINUTES", "2"))
MINUTES_SHARDED = float(os.environ.get("NEMESIS_MINUTES_SHARDED", "1"))
SHARDED_GAP = (3.0, 5.0)  # denser than a one-cluster run's: every scenario fits in its one minute
SHARDED_NODES = ["d1", "d2", "d3", "d4", "w1", "w2"]


def _report(out, minutes: float = MINUTES) -> str:
    return (f"seed {SEED}, {minutes} min, run dir {out.run_dir}\n" + "\n".join(f.describe() for f in out.schedule)
            + "\n" + out.result.table() + "\n" + out.result.evidence())


@pytest.mark.timeout(900)
def test_nemesis_short_seed():
    """Every required scenario (schedule.REQUIRED: each promise's main one, a worker stalled longer than
    RUN_LEASE included) is scheduled first, then random faults; every rule holds."""
    out = run(SEED, MINUTES, cover=REQUIRED)
    print("\n" + out.result.table())
    assert out.applied, "no fault was applied: the run tested nothing"
    assert not [f for f in out.applied if f.get("error")], _report(out)
    assert not out.missing, f"required scenarios not applied: {out.missing}\n" + _report(out)
    assert out.result.stats["starts"] > 100, _report(out)
    assert out.ok, _report(out)


@pytest.mark.timeout(600)
def test_nemesis_short_seed_on_two_clusters():
    """The shards on two clusters (tests.settings_sharded), two dispatchers for each: every required
    scenario and a crash of the second cluster (the first's jobs keep their bounds meanwhile, the
    checker excuses nothing of them); every rule holds over both clusters' rows, and both fired."""
    out = run(SEED, MINUTES_SHARDED, databases=2, cover=REQUIRED_SHARDED, gap=SHARDED_GAP)
    print("\n" + out.result.table())
    report = (f"reproduce: python -m tests.nemesis --seed {SEED} --minutes {MINUTES_SHARDED} --databases 2 --cover "
              f"--gap {','.join(map(str, SHARDED_GAP))}\n" + _report(out, MINUTES_SHARDED))
    assert out.applied, "no fault was applied: the run tested nothing"
    assert not [f for f in out.applied if f.get("error")], report
    assert not out.missing, f"required scenarios not applied: {out.missing}\n" + report
    assert "pg2_restart" in {f["kind"] for f in out.applied}, report
    assert out.result.stats["starts"] > 100, report
    assert out.result.stats["completed_default"] > 0 and out.result.stats["completed_second"] > 0, report
    assert out.result.stats["default_runs_due_while_second_down"] > 0, report  # the first fired meanwhile
    assert out.ok, report


@pytest.mark.timeout(600)
def test_selftest_a_worker_that_runs_an_attempt_twice_is_caught():
    """A broken build (each task ledgers its start twice, as a worker skipping the dedupe would) fails the run."""
    out = run(SEED, 0.5, kinds=["kill"], extra_env={"NEMESIS_SELFTEST_DOUBLE": "start"}, settle=60)
    rules = {v.rule for v in out.result.violations}
    assert "duplicate" in rules, _report(out)


def test_schedule_is_a_function_of_the_seed():
    nodes = ["d1", "d2", "w1", "w2"]
    a = make_schedule(5, 3, nodes, list(ALL_KINDS))
    assert a == make_schedule(5, 3, nodes, list(ALL_KINDS))
    assert a != make_schedule(6, 3, nodes, list(ALL_KINDS))
    assert {f.kind for f in a} >= {"kill", "stop"} and len(a) >= 20
    for f in a:  # never two faults on one target at once
        assert not [g for g in a if g is not f and g.target == f.target and f.at <= g.at < f.at + f.duration]


@pytest.mark.parametrize("seed", range(20))
def test_schedule_covers_every_required_scenario_in_the_ci_minutes(seed):
    """With ``cover``, any seed's short schedule has every required scenario; without it, seed 11 did not
    stall a worker at all (the success of a reaped attempt never happened in CI)."""
    nodes = ["d1", "d2", "w1", "w2"]
    a = make_schedule(seed, MINUTES, nodes, list(ALL_KINDS), cover=REQUIRED)
    assert not covers(a, REQUIRED)
    for f in a:
        assert not [g for g in a if g is not f and g.target == f.target and f.at <= g.at < f.at + f.duration]
    if seed == 11:
        assert "stop:worker" in covers(make_schedule(seed, MINUTES, nodes, list(ALL_KINDS)), REQUIRED)


@pytest.mark.parametrize("seed", range(20))
def test_a_two_cluster_schedule_covers_its_scenarios_in_its_minute(seed):
    """The second cluster's crash is scheduled beside every required scenario, on its own server
    (it may overlap a fault of the first's), and only when asked for."""
    kinds = list(ALL_KINDS + SHARDED_KINDS)
    a = make_schedule(seed, MINUTES_SHARDED, SHARDED_NODES, kinds, gap=SHARDED_GAP, cover=REQUIRED_SHARDED,
                      first=("failover",))
    assert not covers(a, REQUIRED_SHARDED)
    assert {f.target for f in a if f.kind == "pg2_restart"} == {"pg2"}
    for f in a:
        assert not [g for g in a if g is not f and g.target == f.target and f.at <= g.at < f.at + f.duration]
    assert "pg2_restart" not in {f.kind for f in make_schedule(seed, MINUTES, ["d1", "d2", "w1", "w2"],
                                                               list(ALL_KINDS), cover=REQUIRED)}


def test_the_workload_routes_a_job_by_its_shard():
    low, high = uuid.UUID(int=(1 << 100) | 31), uuid.UUID(int=(1 << 100) | 32)
    assert (database_of(str(low)), database_of(str(high))) == (0, 1)


def test_the_bounded_faults_hit_their_own_nodes():
    nodes = ["d1", "d2", "w1", "w2"]
    b = make_schedule(5, 3, nodes, list(BOUND_KINDS))
    assert {f.kind for f in b} == set(BOUND_KINDS)
    for f in b:
        want = {"claim_stall": ("d1", "d2"), "slow_link": ("w1", "w2"), "db_clock": ("pg",)}[f.kind]
        assert f.target in want, f
        assert f.kind != "db_clock" or 15 <= abs(f.offset) <= 45, f


# -- the checker on synthetic histories ------------------------------------------------------------

T = 1_800_000_000.0  # a fixed real time (seconds)


def _iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def _start(job, attempt, wall, fire_at, ev="start", occurrence=None, node="w1"):
    return {"ev": ev, "job": job, "attempt": attempt, "fire_at": _iso(fire_at),
            "occurrence": _iso(occurrence) if occurrence else None, "wall": wall, "pid": 1, "offset": 0.0,
            "node": node}


def _row(outcome, started, finished, scheduled, node="w1"):
    return {"outcome": outcome, "started_at": started, "finished_at": finished, "scheduled_at": scheduled,
            "worker": f"{node}@host", "error": ""}


def _history():
    """A clean history: a one-off job, a retried one, an always-failing one, a cancelled one, a cron job;
    the ledger, the final rows (attempt rows as the database has them), the workload, no fault."""
    a, b, c, d, cr = (str(uuid.uuid4()) for _ in range(5))
    workload = [
        {"ev": "job", "job": a, "kind": "now", "fire_at": T, "max_retries": 3},
        {"ev": "job", "job": b, "kind": "retry", "fire_at": T, "max_retries": 3},
        {"ev": "job", "job": c, "kind": "always_fail", "fire_at": T, "max_retries": 1},
        {"ev": "job", "job": d, "kind": "cancel", "fire_at": T + 10, "max_retries": 3},
        {"ev": "job", "job": cr, "kind": "cron2", "fire_at": T, "step": 2, "max_retries": 3},
        {"ev": "cancel", "job": d, "cancelled": True, "wall": T + 5},
        {"ev": "cancel", "job": cr, "cancelled": True, "wall": T + 20},
    ]
    ledger = [_start(a, 1, T + 0.1, T), _start(a, 1, T + 0.2, T, ev="end"),
              _start(b, 1, T + 0.1, T), _start(b, 2, T + 1.2, T + 1), _start(b, 3, T + 3.2, T + 3),
              _start(b, 3, T + 3.3, T + 3, ev="end"),
              _start(c, 1, T + 0.1, T), _start(c, 2, T + 1.1, T + 1)]
    ledger += [_start(cr, i + 1, T + 2 * i + 0.1, T + 2 * i, occurrence=T + 2 * i) for i in range(11)]
    jobs = {a: {"status": "completed"}, b: {"status": "completed"}, c: {"status": "failed", "lost_attempts": 0},
            d: {"status": "cancelled"}, cr: {"status": "cancelled"}}
    attempts = {(a, 1): _row("succeeded", T + 0.1, T + 0.2, T),
                (b, 1): _row("retried", T + 0.1, T + 0.1, T), (b, 2): _row("retried", T + 1.2, T + 1.2, T + 1),
                (b, 3): _row("succeeded", T + 3.2, T + 3.3, T + 3),
                (c, 1): _row("retried", T + 0.1, T + 0.1, T), (c, 2): _row("failed", T + 1.1, T + 1.1, T + 1)}
    attempts.update({(cr, i + 1): _row("succeeded", T + 2 * i + 0.1, T + 2 * i + 0.2, T + 2 * i) for i in range(11)})
    return ledger, jobs, attempts, workload, []


def test_checker_passes_a_clean_history():
    res = checker.check(*_history())
    assert res.ok, res.evidence()
    assert res.stats["cron_runs"] == 11


def test_checker_counts_a_job_failed_by_max_lost_attempts_as_the_policy():
    ledger, jobs, attempts, workload, faults = _history()
    a = workload[0]["job"]
    ledger = [x for x in ledger if not (x["job"] == a and x["ev"] == "end")]  # its runs all died mid-run
    ledger += [_start(a, i, T + 10 * i, T) for i in range(2, 6)]
    for i in range(1, 6):  # each killed 1 s after it started; reaped a lease later, then the next one ran
        attempts[(a, i)] = _row("lost", T + 10 * i if i > 1 else T + 0.1, T + 10 * i + 5, T)
        faults.append({"kind": "kill", "target": "w1", "start": T + 10 * i + 1, "heal": T + 10 * i + 2})
    jobs[a] = {"status": "failed", "lost_attempts": 5}
    res = checker.check(ledger, jobs, attempts, workload, faults, max_lost=5)
    assert not res.violations, res.evidence()
    assert res.stats["lost_exhausted"] == 1
    jobs[a] = {"status": "failed", "lost_attempts": 4}  # fewer: not the policy
    assert "failed_not_by_policy" in {v.rule for v in checker.check(ledger, jobs, attempts, workload, faults,
                                                                       max_lost=5).violations}


@pytest.mark.parametrize("breakage, rule", [
    ("duplicate", "duplicate"), ("early", "early"), ("missed", "missed"), ("cron_missed", "missed"),
    ("failed", "failed_not_by_policy"), ("discarded", "success_discarded"), ("after_cancel", "after_cancel"),
    ("late", "late"), ("lost_row", "lost_job"), ("unsettled", "unsettled"), ("start_lost", "start_not_recorded"),
])
def test_checker_flags_a_broken_history(breakage, rule):
    ledger, jobs, attempts, workload, faults = _history()
    a = workload[0]["job"]
    d = workload[3]["job"]
    cr = workload[4]["job"]
    if breakage == "duplicate":
        ledger.append(_start(a, 1, T + 9, T))
    elif breakage == "early":
        ledger[0] = _start(a, 1, T - 1.0, T)
    elif breakage == "missed":
        ledger = [x for x in ledger if x["job"] != a]
    elif breakage == "cron_missed":
        ledger = [x for x in ledger if not (x["job"] == cr and x["attempt"] == 4)]
    elif breakage == "failed":
        ledger = [x for x in ledger if not (x["job"] == a and x["ev"] == "end")]
        jobs[a] = {"status": "failed", "lost_attempts": 1}
        attempts[(a, 1)]["outcome"] = "failed"
    elif breakage == "discarded":
        jobs[a] = {"status": "failed", "lost_attempts": 1}
        attempts[(a, 1)]["outcome"] = "lost"
    elif breakage == "after_cancel":
        ledger.append(_start(d, 1, T + 10.1, T + 10))
    elif breakage == "late":
        faults.append({"kind": "kill", "target": "w1", "start": T - 5, "heal": T - 4})
        ledger[0] = _start(a, 1, T + 45, T)
    elif breakage == "start_lost":  # the task ran, but its start did not survive: the row was reaped unstarted
        attempts[(a, 1)].update(outcome="lost", started_at=None)
    elif breakage == "lost_row":
        del jobs[a]
    elif breakage == "unsettled":
        jobs[a] = {"status": "pending"}
        ledger = [x for x in ledger if not (x["job"] == a and x["ev"] == "end")]
        attempts[(a, 1)]["outcome"] = "running"
    res = checker.check(ledger, jobs, attempts, workload, faults)
    assert rule in {v.rule for v in res.violations}, res.evidence()
    if breakage == "late":
        assert {v.blamed for v in res.violations} == {"kill"}
        assert "kill" in res.table()


# -- the rules on re-runs, recorded successes and lateness from the fire time ----------------------

def _rerun(fault_target="w1", fault_at=1.0, second_at=6.0):
    """Job ``a``'s attempt 1 starts on w1 at T+0.1 and is reaped; attempt 2 runs on w2 at T+``second_at``.
    A kill of ``fault_target`` at T+``fault_at`` (None: no fault)."""
    ledger, jobs, attempts, workload, faults = _history()
    a = workload[0]["job"]
    ledger = [x for x in ledger if not (x["job"] == a and x["ev"] == "end")]
    ledger += [_start(a, 2, T + second_at, T, node="w2"), _start(a, 2, T + second_at + 0.1, T, ev="end", node="w2")]
    attempts[(a, 1)] = _row("lost", T + 0.1, T + second_at - 0.5, T)
    attempts[(a, 2)] = _row("succeeded", T + second_at, T + second_at + 0.1, T + second_at - 0.5, node="w2")
    if fault_target:
        faults.append({"kind": "kill", "target": fault_target, "start": T + fault_at, "heal": T + fault_at + 2})
    return ledger, jobs, attempts, workload, faults


def test_checker_passes_a_rerun_after_its_worker_was_killed():
    res = checker.check(*_rerun())
    assert res.ok, res.evidence()


@pytest.mark.parametrize("case", ["no fault", "fault on another node", "reaped before a lease could run out"])
def test_checker_flags_a_rerun_without_a_lost_lease(case):
    """A new attempt number only after a retry or a lost lease: a fault on the node that ran the attempt,
    and at least RUN_LEASE after its last renewal (the reaper reaping a healthy attempt is caught)."""
    hist = {"no fault": _rerun(fault_target=None), "fault on another node": _rerun(fault_target="w2"),
            "reaped before a lease could run out": _rerun(second_at=2.2)}[case]
    rules = {v.rule for v in checker.check(*hist).violations}
    assert {"rerun_without_lost_lease", "lost_without_fault"} <= rules, rules


def test_checker_flags_a_success_not_recorded():
    """The task returned well (ledger end line) but its attempt row is not 'succeeded'; also when the job
    completed through another attempt. A kill of its worker inside the completion window is excused."""
    ledger, jobs, attempts, workload, faults = _history()
    a = workload[0]["job"]
    attempts[(a, 1)].update(outcome="lost", finished_at=T + 4.5)  # reaped a lease later
    res = checker.check(ledger, jobs, attempts, workload, faults)
    assert "success_not_recorded" in {v.rule for v in res.violations}, res.evidence()
    faults.append({"kind": "kill", "target": "w1", "start": T + 0.25, "heal": T + 2})  # 0.05 s after the end line
    res = checker.check(ledger, jobs, attempts, workload, faults)
    assert res.ok, res.evidence()
    assert res.stats["successes_lost_in_window"] == 1
    # the attempt succeeded, but its one-off job is not completed
    ledger, jobs, attempts, workload, faults = _history()
    jobs[workload[0]["job"]] = {"status": "cancelled"}
    assert "success_not_recorded" in {v.rule for v in checker.check(ledger, jobs, attempts, workload,
                                                                    faults).violations}


@pytest.mark.parametrize("start, dispatched, late", [(10.0, None, False), (13.0, None, True), (13.0, 1.0, False),
                                                     (13.0, 12.8, True)])
def test_checker_counts_lateness_from_the_fire_time(start, dispatched, late):
    """A job due while a dispatcher is stalled for 14 s is dispatched within SHARD_LEASE/DISPATCH_LEASE
    of the stall's start (plus reaper and slack), not within a bound counted from the stall's end; one
    dispatched in time may then wait for a free worker slot (queue_wait)."""
    ledger, jobs, attempts, workload, faults = _history()
    a = workload[0]["job"]
    ledger[0], ledger[1] = _start(a, 1, T + start, T), _start(a, 1, T + start + 0.1, T, ev="end")
    attempts[(a, 1)] = _row("succeeded", T + start, T + start + 0.1, T)
    if dispatched is not None:
        attempts[(a, 1)]["dispatched_at"] = T + dispatched
    faults.append({"kind": "stop", "target": "d1", "start": T - 1, "heal": T + 13})
    res = checker.check(ledger, jobs, attempts, workload, faults)
    assert ("late" in {v.rule for v in res.violations}) == late, res.evidence()
    if late:
        assert {v.blamed for v in res.violations} == {"stop"}


@pytest.mark.parametrize("node, w2_cut_off, start, late", [("w2", True, 14.6, False), ("w1", True, 14.6, False),
                                                          ("w1", False, 14.6, True), ("w2", True, 19.5, True),
                                                          ("w1", True, 19.5, True)])
def test_checker_counts_a_slot_wait_from_when_the_worker_pool_was_whole_again(node, w2_cut_off, start, late):
    """A message that reached a worker cut off from PostgreSQL is started when the link is back, then
    waits for a free slot: the queue wait counts from the link's return (plus reconnect). A message
    that reached the other worker meanwhile waits behind both workers' share of the backlog on half
    the slots: its queue wait counts from the same return. With every worker whole, it counts from
    the dispatch; a start later than either is late."""
    ledger, jobs, attempts, workload, faults = _history()
    a = workload[0]["job"]
    ledger[0] = _start(a, 1, T + start, T, node=node)
    ledger[1] = _start(a, 1, T + start + 0.1, T, ev="end", node=node)
    attempts[(a, 1)] = {**_row("succeeded", T + start, T + start + 0.1, T, node=node), "dispatched_at": T - 0.6}
    faults.append({"kind": "stop", "target": "d1", "start": T - 13.9, "heal": T + 0.1})
    if w2_cut_off:
        faults.append({"kind": "partition_pg", "target": "w2", "start": T - 9.4, "heal": T + 0.7})
    res = checker.check(ledger, jobs, attempts, workload, faults)
    assert ("late" in {v.rule for v in res.violations}) == late, res.evidence()


@pytest.mark.parametrize("shard, late", [(40, False), (7, True)])
def test_checker_excuses_by_a_crash_of_the_second_cluster_only_its_own_jobs(shard, late):
    """A job due while the second cluster is down may start after its restart if it lives there
    (shards 32-63); a job of the first cluster is held to its bound without a fault."""
    ledger, jobs, attempts, workload, faults = _history()
    old = workload[0]["job"]
    a = str(uuid.UUID(int=uuid.UUID(old).int & ~63 | shard))
    for x in ledger + workload:
        x["job"] = a if x["job"] == old else x["job"]
    jobs[a] = jobs.pop(old)
    attempts[(a, 1)] = attempts.pop((old, 1))
    ledger[0], ledger[1] = _start(a, 1, T + 14, T), _start(a, 1, T + 14.1, T, ev="end")
    attempts[(a, 1)].update(started_at=T + 14, finished_at=T + 14.1)
    faults.append({"kind": "pg2_restart", "target": "pg2", "start": T - 1, "heal": T + 6})
    res = checker.check(ledger, jobs, attempts, workload, faults)
    assert ("late" in {v.rule for v in res.violations}) == late, res.evidence()
