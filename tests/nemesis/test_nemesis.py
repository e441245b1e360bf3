"""The nemesis run under pytest: a short seed for CI, and the checker's self-tests.

``NEMESIS_SEED`` / ``NEMESIS_MINUTES`` choose the run (default seed 11, 2 minutes).
A failure prints the schedule, the table and the evidence; the same seed
replays the same schedule (``python -m tests.nemesis --seed S --minutes M``).
"""

from __future__ import annotations

import os
import uuid

import pytest

from . import checker
from .run import run
from .schedule import ALL_KINDS, BOUND_KINDS, make_schedule

pytestmark = [pytest.mark.faults, pytest.mark.nemesis]

SEED = int(os.environ.get("NEMESIS_SEED", "11"))
MINUTES = float(os.environ.get("NEMESIS_MINUTES", "2"))


def _report(out) -> str:
    return (f"seed {SEED}, {MINUTES} min, run dir {out.run_dir}\n" + "\n".join(f.describe() for f in out.schedule)
            + "\n" + out.result.table() + "\n" + out.result.evidence())


@pytest.mark.timeout(900)
def test_nemesis_short_seed():
    out = run(SEED, MINUTES)
    print("\n" + out.result.table())
    assert out.applied, "no fault was applied: the run tested nothing"
    assert not [f for f in out.applied if f.get("error")], _report(out)
    assert out.result.stats["starts"] > 100, _report(out)
    assert out.ok, _report(out)


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


def _start(job, attempt, wall, fire_at, ev="start", occurrence=None):
    return {"ev": ev, "job": job, "attempt": attempt, "fire_at": _iso(fire_at),
            "occurrence": _iso(occurrence) if occurrence else None, "wall": wall, "pid": 1, "offset": 0.0}


def _history():
    """A clean history: a one-off job, a retried one, an always-failing one, a cancelled one, a cron job."""
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
    return ledger, jobs, {}, workload, []


def test_checker_passes_a_clean_history():
    res = checker.check(*_history())
    assert res.ok, res.evidence()
    assert res.stats["cron_runs"] == 11


def test_checker_counts_a_job_failed_by_max_lost_attempts_as_the_policy():
    ledger, jobs, attempts, workload, faults = _history()
    a = workload[0]["job"]
    ledger = [x for x in ledger if not (x["job"] == a and x["ev"] == "end")]  # its runs all died mid-run
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
    ("late", "late"), ("lost_row", "lost_job"), ("unsettled", "unsettled"),
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
    elif breakage == "discarded":
        jobs[a] = {"status": "failed", "lost_attempts": 1}
    elif breakage == "after_cancel":
        ledger.append(_start(d, 1, T + 10.1, T + 10))
    elif breakage == "late":
        faults.append({"kind": "kill", "target": "w1", "start": T - 5, "heal": T - 4})
        ledger[0] = _start(a, 1, T + 45, T)
    elif breakage == "lost_row":
        del jobs[a]
    elif breakage == "unsettled":
        jobs[a] = {"status": "pending"}
    res = checker.check(ledger, jobs, attempts, workload, faults)
    assert rule in {v.rule for v in res.violations}, res.evidence()
    if breakage == "late":
        assert {v.blamed for v in res.violations} == {"kill"}
        assert "kill" in res.table()
