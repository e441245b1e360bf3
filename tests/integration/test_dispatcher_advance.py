"""Recurring jobs through the dispatcher's claim on PostgreSQL: catch-up, overlap, jitter, pause, intervals."""

from __future__ import annotations

import json
import math
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
import redis
from burst import ZONES, burst_specs, db_now, dow, fires_exactly, whole_second_after
from demo.tasks import noop
from django.conf import settings
from django.db import connections
from helpers import clear_of_a_minute_mark, sql, wait_until

import cron_at_scale
from cron_at_scale import ValidationError, cron
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import Job, JobAttempt
from cron_at_scale.policy.recurrence import Recurrence, plan
from cron_at_scale.sql import run as run_query

pytestmark = pytest.mark.django_db


def shift(job, seconds: float):
    """Move a job's pending occurrence ``seconds`` into the past (as if the dispatchers were down)."""
    sql("UPDATE cron_at_scale_job SET fire_at = fire_at - make_interval(secs => %s), "
        "occurrence_at = occurrence_at - make_interval(secs => %s) WHERE id = %s", [seconds, seconds, job.id])


def finish_open_attempts():
    for job_id, attempt in sql("SELECT job_id, attempt FROM cron_at_scale_jobattempt WHERE finished_at IS NULL"):
        run_query("finish_attempt", {"job_id": job_id, "attempt": attempt, "outcome": "succeeded",
                                     "status": "completed", "error": "", "traceback": ""}, fetch="count")


def test_latest_catchup_after_an_outage_fires_once_and_counts_the_missed():
    clear_of_a_minute_mark()
    job = cron_at_scale.schedule(noop, cron="* * * * *", catchup_window=600)
    shift(job, 30 * 60 + 1)  # 30 minutes of outage
    runs = Dispatcher(lookahead=0).claim()
    assert len(runs) == 1
    row = Job.objects.get(id=job.id)
    assert row.missed_occurrences == 30  # 31 due: one fired, the rest counted
    assert row.fire_at > datetime.now(timezone.utc) - timedelta(seconds=5)


def test_overlap_skip_records_the_occurrence_as_a_skipped_attempt():
    job = cron_at_scale.schedule(noop, cron="* * * * * *")
    shift(job, 1)
    assert len(Dispatcher(lookahead=0).claim()) == 1  # run 1 is now open (dispatched, not finished)
    shift(job, 1)
    assert Dispatcher(lookahead=0).claim() == []
    outcomes = list(JobAttempt.objects.filter(job_id=job.id).order_by("attempt").values_list("outcome", flat=True))
    assert outcomes == ["dispatched", "skipped"]
    assert Job.objects.get(id=job.id).skipped_occurrences == 1


def test_overlap_buffer_one_fires_the_buffered_occurrence_when_the_run_ends():
    job = cron_at_scale.schedule(noop, cron="*/10 * * * * *", overlap="buffer_one")
    shift(job, 10)
    assert len(Dispatcher(lookahead=0).claim()) == 1
    shift(job, 10)
    assert Dispatcher(lookahead=0).claim() == []  # buffered: no attempt row yet
    buffered = Job.objects.get(id=job.id).buffered_at
    assert buffered is not None
    finish_open_attempts()  # the running one ends: the buffered occurrence is due now
    runs = Dispatcher(lookahead=0).claim()
    assert [r.occurrence for r in runs] == [buffered]
    assert Job.objects.get(id=job.id).buffered_at is None


def test_overlap_allow_fires_while_a_run_is_open():
    job = cron_at_scale.schedule(noop, cron="* * * * * *", overlap="allow")
    shift(job, 1)
    assert len(Dispatcher(lookahead=0).claim()) == 1
    shift(job, 1)
    assert len(Dispatcher(lookahead=0).claim()) == 1


def test_jitter_moves_fire_at_within_the_gap_and_keeps_the_occurrence():
    job = cron_at_scale.schedule(noop, cron="0 0 * * *", jitter=3600)
    row = Job.objects.get(id=job.id)
    assert row.occurrence_at.hour == 0 and row.occurrence_at.minute == 0
    assert row.occurrence_at <= row.fire_at < row.occurrence_at + timedelta(hours=1)


def test_a_run_carries_its_nominal_occurrence():
    job = cron_at_scale.schedule(noop, cron="* * * * *", jitter=50)
    shift(job, 120)
    runs = Dispatcher(lookahead=0).claim()
    assert len(runs) == 1
    run = runs[0]
    assert run.occurrence.second == 0 and run.occurrence.microsecond == 0
    assert run.occurrence <= run.fire_at < run.occurrence + timedelta(seconds=50)
    assert JobAttempt.objects.get(job_id=job.id).scheduled_at == run.fire_at


def test_pause_holds_a_job_and_resume_follows_the_catchup_policy():
    clear_of_a_minute_mark()
    job = cron_at_scale.schedule(noop, cron="* * * * *", catchup="skip")
    assert cron_at_scale.pause(job.id, note="maintenance")
    assert not cron_at_scale.pause(job.id)
    row = Job.objects.get(id=job.id)
    assert (row.status, row.pause_note) == ("paused", "maintenance")
    shift(job, 5 * 60)
    assert Dispatcher(lookahead=0).claim() == []  # paused: nothing fires
    assert cron_at_scale.resume(job.id)
    assert Dispatcher(lookahead=0).claim() == []  # skip: five missed occurrences are not fired
    assert Job.objects.get(id=job.id).missed_occurrences == 5
    once = cron_at_scale.schedule(noop, countdown=60)
    assert not cron_at_scale.pause(once.id)  # only recurring jobs pause


def test_paused_jobs_keep_their_key_and_can_be_cancelled():
    job = cron_at_scale.schedule(noop, cron="@daily", key="nightly")
    cron_at_scale.pause(job.id)
    assert cron_at_scale.schedule(noop, cron="@daily", key="nightly").id == job.id
    assert cron_at_scale.cancel(job.id)


def test_interval_jobs_fire_every_n_seconds_from_the_schedule():
    start = datetime.now(timezone.utc) + timedelta(hours=1)
    job = cron_at_scale.schedule(noop, every=timedelta(seconds=90), at=start)
    row = Job.objects.get(id=job.id)
    assert (row.schedule_type, row.interval, row.fire_at) == ("interval", 90.0, start)
    shift(job, 3600 + 1)
    assert len(Dispatcher(lookahead=0).claim()) == 1
    # 90 s after the scheduled occurrence it fired, not after "now"
    assert Job.objects.get(id=job.id).fire_at == start - timedelta(seconds=3601) + timedelta(seconds=90)


def test_run_now_on_a_cron_job_is_one_extra_run():
    job = cron_at_scale.schedule(noop, cron="0 0 1 1 *")
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() WHERE id = %s", [job.id])
    runs = Dispatcher(lookahead=0).claim()
    assert len(runs) == 1
    row = Job.objects.get(id=job.id)
    assert row.fire_at == row.occurrence_at and row.fire_at.month == 1  # the schedule is untouched


@pytest.mark.parametrize(("spec", "field"), [
    (dict(cron="* * * * *", catchup="sometimes"), "catchup"),
    (dict(cron="* * * * *", overlap="queue"), "overlap"),
    (dict(cron="* * * * *", jitter=-1), "jitter"),
    (dict(cron="* * * * *", catchup_window="5m"), "catchup_window"),
    (dict(every=0), "every"),
    (dict(every="10s"), "every"),
    (dict(countdown=5, jitter=10), "jitter"),
    (dict(overlap="allow"), "overlap"),
    (dict(every=10, cron="* * * * *"), "every"),
])
def test_bad_policy_input_names_the_field(spec, field):
    with pytest.raises(ValidationError) as err:
        cron_at_scale.schedule(noop, **spec)
    assert err.value.field == field
    assert Job.objects.count() == 0


def _month_ends(now: datetime) -> list[datetime]:
    """Midnight UTC of the last day of the months around ``now`` (from the calendar, not from cron)."""
    import calendar

    ends = []
    for back in range(-4, 4):
        y, m = divmod(now.year * 12 + now.month - 1 + back, 12)
        ends.append(datetime(y, m + 1, calendar.monthrange(y, m + 1)[1], tzinfo=timezone.utc))
    return ends


def test_a_last_day_of_month_job_advances_to_the_next_last_day():
    """``0 0 L * *`` through schedule() and the dispatcher's claim: a due occurrence fires and the job
    moves to the next month's last day (months of 30 and 31 days, February)."""
    ((now,),) = sql("SELECT statement_timestamp()")
    ends = _month_ends(now)
    past, future = [e for e in ends if e <= now], [e for e in ends if e > now]
    job = cron_at_scale.schedule(noop, cron="0 0 L * *", catchup_window=40 * 86400)
    row = Job.objects.get(id=job.id)
    assert row.occurrence_at == row.fire_at == future[0]
    sql("UPDATE cron_at_scale_job SET fire_at = %s, occurrence_at = %s WHERE id = %s", [past[-1], past[-1], job.id])
    runs = Dispatcher(lookahead=0).claim()
    assert [r.occurrence for r in runs] == [past[-1]]
    row = Job.objects.get(id=job.id)
    assert (row.occurrence_at, row.fire_at, row.missed_occurrences) == (future[0], future[0], 0)
    # catch-up 'all' from two month-ends back: both fire, in order, then the next one is pending
    every = cron_at_scale.schedule(noop, cron="0 0 L * *", catchup="all", overlap="allow",
                                   catchup_window=70 * 86400)
    sql("UPDATE cron_at_scale_job SET fire_at = %s, occurrence_at = %s WHERE id = %s", [past[-2], past[-2], every.id])
    runs = Dispatcher(lookahead=0).claim()
    assert [r.occurrence for r in runs] == past[-2:]
    assert Job.objects.get(id=every.id).occurrence_at == future[0]


@pytest.mark.parametrize(("cron", "part"), [
    ("0 0 1,L * *", "day-of-month"), ("0 0 * * 2#6", "day-of-week"), ("L * * * *", "minute"),
    ("* * 30W 2 *", "day-of-month"), ("0 0 L-31 * *", "day-of-month"), ("0 0 * * 3W", "day-of-week"),
])
def test_bad_quartz_forms_are_refused_by_schedule(cron, part):
    with pytest.raises(ValidationError) as err:
        cron_at_scale.schedule(noop, cron=cron)
    assert err.value.field == "cron" and part in str(err.value)
    with pytest.raises(ValidationError) as err:
        cron_at_scale.schedule_many([{"task": noop.name, "cron": "0 0 L * *"}, {"task": noop.name, "cron": cron}])
    assert err.value.field == "[1].cron" and part in str(err.value)
    assert Job.objects.count() == 0


# A burst of recurring jobs through the dispatcher's batched claim (shared occurrence cache, jobs
# alike sharing one plan), job by job against the per-job reference; an occurrence due now beside one
# within the look-ahead; an every-second job beside a 20,000-job burst; pre-loading a burst before its
# instant, also when part of it still has a run unfinished. Real PostgreSQL and Redis, real
# dispatcher loops (in a thread); no worker: runs stay dispatched unless a test starts them.


MAX_JITTER = 4.0  # seconds: the largest jitter a job of the burst gets


# Zones 24 h apart: the same wall time on another day. One expression naming both days fires at
# the same instant in both, and next on different days: a batch's occurrence lists are per zone.
DATELINE = [("Pacific/Kiritimati", "Pacific/Honolulu"), ("Pacific/Tongatapu", "Pacific/Pago_Pago"),
            ("Pacific/Apia", "Pacific/Niue")]


def shapes(t: datetime, tz: str) -> dict[str, str]:
    """Six-field expressions in ``tz`` that fire at ``t`` (from its local wall time there), with
    different continuations: a day, an hour, a minute, 20 s, one or two seconds later."""
    x = t.astimezone(ZoneInfo(tz))
    s, m, h = x.second, x.minute, x.hour
    out = {
        "daily": f"{s} {m} {h} * * *",
        "hourly": f"{s} {m} * * * *",
        "minutely": f"{s} * * * * *",
        "pair": f"{s},{(s + 1) % 60} {m} {h} * * *",  # the next occurrence a second later
        "step": f"{s}-59/20 {m} * * * *",
        "dow": f"{s} {m} {h} * * {dow(x)}",
        "dom": f"{s} {m} {h} {x.day} * *",
    }
    if s <= 57:
        out["range"] = f"{s}-{s + 2} {m} {h} * * *"  # three runs a second apart
    return out


def dateline_shapes(t: datetime, pair: tuple[str, str]) -> list[str]:
    """Expressions that fire at ``t`` in both zones of ``pair`` and next on different days."""
    a, b = (t.astimezone(ZoneInfo(z)) for z in pair)
    if (a.hour, a.minute) != (b.hour, b.minute):
        return []  # not 24 h apart (any more)
    wall = f"{a.second} {a.minute} {a.hour}"
    return [f"{wall} * * {','.join(map(str, sorted({dow(a), dow(b)})))}",
            f"{wall} {','.join(map(str, sorted({a.day, b.day})))} * *"]


@dataclass
class Profile:
    """Jobs alike: one schedule and policy; each job gets its own state (see ``Burst``)."""

    spec: dict
    n: int


def profiles(rng: random.Random, t: datetime, now: datetime) -> list[Profile]:
    out = []
    for tz in ZONES:
        for expr in shapes(t, tz).values():
            if fires_exactly(expr, tz, now, [t]):  # its first occurrence after now is the burst's
                out.append(Profile({"task": noop.name, "cron": expr, "tz": tz}, rng.randint(2, 4)))
    for pair in DATELINE:
        for expr in dateline_shapes(t, pair):
            for tz in pair:
                assert fires_exactly(expr, tz, now, [t]), (expr, tz)
                out.append(Profile({"task": noop.name, "cron": expr, "tz": tz}, 6))
    for every in (7, 30, 45, 60, 3600):
        out.append(Profile({"task": noop.name, "every": every, "at": t}, rng.randint(3, 6)))
    for p in out:
        p.spec.update(catchup=rng.choice(["latest", "all", "skip"]), overlap=rng.choice(["skip", "allow", "buffer_one"]),
                      jitter=rng.choice([0, 0, 0, 1.5, MAX_JITTER]),
                      catchup_window=rng.choice([300, 300, 150, 90]))
    return out


def start(job_id, attempt: int):
    return run_query("start_attempt", {"job_id": str(job_id), "attempt": attempt, "worker": "w", "token": None, "fire_at": None,
                                       "lease": 600.0, "done_job_ids": [], "done_attempts": []}, fetch="one")


def finish(job_id, attempt: int) -> int:
    return run_query("finish_attempt", {"job_id": job_id, "attempt": attempt, "outcome": "succeeded",
                                        "status": "completed", "error": "", "traceback": ""}, fetch="count")


@dataclass
class State:
    """A recurring job's columns the claim reads and writes, and its attempt log."""

    fire_at: datetime
    occurrence_at: datetime | None
    attempts: int
    missed: int
    skipped: int
    buffered_at: datetime | None
    log: dict[int, tuple[datetime, str, bool]] = field(default_factory=dict)  # attempt -> (scheduled, outcome, done)

    def running(self) -> bool:
        return any(not done for _at, _outcome, done in self.log.values())


JOB_FIELDS = ("id", "schedule_type", "cron_expr", "timezone", "interval", "jitter", "catchup", "catchup_window",
              "overlap", "fire_at", "occurrence_at", "attempts", "missed_occurrences", "skipped_occurrences",
              "buffered_at")


def snapshot() -> tuple[dict, dict[str, State]]:
    jobs = {str(r["id"]): r for r in Job.objects.values(*JOB_FIELDS)}
    states = {jid: State(r["fire_at"], r["occurrence_at"], r["attempts"], r["missed_occurrences"],
                         r["skipped_occurrences"], r["buffered_at"]) for jid, r in jobs.items()}
    for job_id, attempt, at, outcome, finished in JobAttempt.objects.values_list(
            "job_id", "attempt", "scheduled_at", "outcome", "finished_at"):
        states[str(job_id)].log[attempt] = (at, outcome, finished is not None)
    return jobs, states


def reference(job: dict, st: State, now: datetime, lookahead: float):
    """What the claim at database time ``now`` does to this one job: plan() for it alone, without
    the batch's shared occurrences or plans (the look-ahead as the dispatcher gives it: whether a
    run overlaps an unfinished one is decided when it is due, so a job with one gets none)."""
    running = st.running()
    occurrence = st.occurrence_at or st.fire_at
    buffered = st.buffered_at
    if buffered is None and st.fire_at < occurrence:
        buffered = st.fire_at
    rec = Recurrence(str(job["id"]), job["schedule_type"], job["cron_expr"], job["timezone"], job["interval"],
                     job["jitter"], job["catchup"], job["catchup_window"], job["overlap"])
    early = lookahead if job["overlap"] == "allow" or not running else 0.0
    return plan(rec, occurrence, now, running=running, buffered=buffered, lookahead=early)


def replay(job: dict, st: State, now: datetime, lookahead: float) -> list[tuple]:
    """Apply the reference claim to ``st``; return the runs it fires (job, attempt, fire_at, occurrence)."""
    p = reference(job, st, now, lookahead)
    if (not p.fire and not p.skipped and not p.missed and p.next_fire_at == st.fire_at
            and p.next_occurrence == st.occurrence_at and p.buffer == st.buffered_at):
        return []  # nothing to do yet
    runs = []
    for _occ, due_at in p.skipped:
        st.attempts += 1
        st.log[st.attempts] = (due_at, "skipped", True)
    for occ, due_at in p.fire:
        st.attempts += 1
        st.log[st.attempts] = (due_at, "dispatched", False)
        runs.append((str(job["id"]), st.attempts, due_at, occ))
    st.fire_at, st.occurrence_at, st.buffered_at = p.next_fire_at, p.next_occurrence, p.buffer
    st.missed += p.missed
    st.skipped += len(p.skipped)
    return runs


def occurrences_from(job: dict, first: datetime, until: datetime) -> list[datetime]:
    """``first`` and the schedule's occurrences after it, before ``until`` (from cron.py alone)."""
    out = [first]
    while True:
        if job["schedule_type"] == "interval":
            nxt = out[-1] + timedelta(seconds=job["interval"])
        else:
            (nxt,) = cron.next_fire_times(job["cron_expr"], job["timezone"], out[-1], 1)
        if nxt >= until:
            return out
        out.append(nxt)


@pytest.mark.parametrize(("seed", "claim_from"), [(1, "after_due"), (2, "before_due"), (3, "after_due"),
                                                   (4, "before_due")])
def test_a_burst_in_many_zones_and_expressions_gets_each_jobs_own_plan(monkeypatch, seed, claim_from):
    rng = random.Random(seed)
    now = db_now()
    t = whole_second_after(now, 8)
    profs = profiles(rng, t, now)
    specs = [p.spec for p in profs for _ in range(p.n)]
    assert len({s.get("tz") for s in specs}) >= 8  # which zones fire exactly at t depends on the time of day: 9 seen once
    assert len({s["cron"] for s in specs if "cron" in s}) >= 30
    assert len(specs) >= 300
    jobs = cron_at_scale.schedule_many(specs)
    ids = [str(j.id) for j in jobs]
    assert all(j.fire_at >= j.occurrence_at == t for j in jobs)

    # Some jobs get a run from an earlier occurrence, claimed through the real statements, then
    # started (a 'running' attempt), left dispatched, or finished; some then had an outage.
    setup = {jid: rng.choices(["", "running", "dispatched", "finished"], [60, 15, 7, 18])[0] for jid in ids}
    before = db_now() - timedelta(seconds=15)
    for job, spec in zip(jobs, specs):
        if not setup[str(job.id)]:
            continue
        if "every" in spec:  # an earlier occurrence on the job's own grid
            back = spec["every"] * math.ceil((t - before).total_seconds() / spec["every"])
            prior = t - timedelta(seconds=back)
        else:
            prior = before  # any earlier nominal occurrence: the next one is the burst's
        sql("UPDATE cron_at_scale_job SET fire_at = %s, occurrence_at = %s WHERE id = %s", [prior, prior, job.id])
    assert (t - db_now()).total_seconds() > 2, "the burst was set up too late to claim its earlier runs apart"
    setup_runs = Dispatcher(name="setup", lookahead=0, shards="all", batch_size=5000).claim()
    assert setup_runs and {str(r.job_id) for r in setup_runs} <= {jid for jid, how in setup.items() if how}
    for run in setup_runs:
        if setup[str(run.job_id)] == "running":
            assert start(run.job_id, run.attempt) is not None
        elif setup[str(run.job_id)] == "finished":
            finish(str(run.job_id), run.attempt)  # (its count: the one-off job rows it completed)
    for jid in ids:
        shift = rng.choices([0, 120, 300, 420], [70, 10, 10, 10])[0]
        if shift:
            sql("UPDATE cron_at_scale_job SET fire_at = fire_at - make_interval(secs => %s), "
                "occurrence_at = occurrence_at - make_interval(secs => %s) WHERE id = %s", [shift, shift, jid])
    outcomes = dict(sql("SELECT outcome, count(*) FROM cron_at_scale_jobattempt GROUP BY 1"))
    assert outcomes.get("running") and outcomes.get("succeeded") and outcomes.get("dispatched"), outcomes

    jobs_before, states = snapshot()
    initial = {jid: State(s.fire_at, s.occurrence_at, s.attempts, s.missed, s.skipped, s.buffered_at, dict(s.log))
               for jid, s in states.items()}

    # The claims, in batches, recording what each locked (its rows carry the claim's database
    # time) and the look-ahead it planned with.
    claims: list[tuple[list, float, list]] = []
    import cron_at_scale.dispatcher.loop as dispatcher_module

    real_advance = dispatcher_module.advance

    def recording_advance(rows, **kw):
        claims.append((list(rows), kw.get("lookahead", 0.0), []))
        return real_advance(rows, **kw)

    monkeypatch.setattr(dispatcher_module, "advance", recording_advance)
    d = Dispatcher(name="burst", shards="all", batch_size=50)
    assert d.lookahead == 1.0
    start_at = t - timedelta(seconds=0.5) if claim_from == "before_due" else t + timedelta(seconds=MAX_JITTER + 0.3)
    end_at = t + timedelta(seconds=MAX_JITTER + 1.5)
    time.sleep(max(0.0, (start_at - db_now()).total_seconds()))
    give_up = time.monotonic() + 60
    while True:
        seen = len(claims)
        runs = d.claim()
        if len(claims) > seen:
            claims[-1][2].extend(runs)
        else:
            assert not runs
            if db_now() > end_at:
                break  # empty, and everything of the burst is due by now
            time.sleep(0.02)
        assert time.monotonic() < give_up, "the claims never ran out of due rows"
    assert len(claims) >= 3  # in batches

    # Job by job, claim by claim, against the reference.
    fired = ahead = shared = 0
    for rows, lookahead, runs in claims:
        expected = []
        keys = {}
        for row in rows:
            jid, st = str(row.id), states[str(row.id)]
            assert (row.fire_at, row.occurrence_at, row.attempts, row.buffered_at) == (
                st.fire_at, st.occurrence_at, st.attempts, st.buffered_at), jid
            mine = replay(jobs_before[jid], st, row.db_now, lookahead)
            expected += mine
            fired += len(mine)
            ahead += sum(1 for r in mine if r[2] > row.db_now)
            key = (row.cron_expr, row.timezone, row.interval, row.catchup, row.catchup_window, row.overlap,
                   row.occurrence_at, row.buffered_at, row.jitter or jid, st.running())
            keys[key] = keys.get(key, 0) + 1
        shared += sum(n for n in keys.values() if n > 1)
        got = sorted((str(r.job_id), r.attempt, r.fire_at, r.occurrence) for r in runs)
        assert got == sorted(expected)

    final, _ = snapshot()
    db_log = {}
    for job_id, attempt, at, outcome in JobAttempt.objects.values_list("job_id", "attempt", "scheduled_at", "outcome"):
        db_log.setdefault(str(job_id), {})[attempt] = (at, outcome)
    mismatched = []
    for jid, st in states.items():
        row = final[jid]
        want = (st.fire_at, st.occurrence_at, st.attempts, st.missed, st.skipped, st.buffered_at,
                {a: (at, outcome) for a, (at, outcome, _done) in st.log.items()})
        got = (row["fire_at"], row["occurrence_at"], row["attempts"], row["missed_occurrences"],
               row["skipped_occurrences"], row["buffered_at"], db_log.get(jid, {}))
        if got != want:
            mismatched.append((jid, {k: v for k, v in jobs_before[jid].items() if k != "id"}, got, want))
    assert not mismatched, f"{len(mismatched)} jobs differ from their own plan, e.g. {mismatched[:3]}"

    # Independently of plan(): a job without jitter that missed nothing handled every occurrence
    # from its pending one to its new one (fired, skipped or buffered), and its new fire_at is the
    # schedule's next occurrence after the last of them.
    checked = 0
    for jid, st in states.items():
        job, was = jobs_before[jid], initial[jid]
        if job["jitter"] or st.missed != was.missed or st.fire_at == was.fire_at:
            continue
        handled = sorted([at for a, (at, _outcome, _done) in st.log.items() if a > was.attempts]
                         + ([st.buffered_at] if st.buffered_at else []))
        assert handled == occurrences_from(job, was.occurrence_at, st.occurrence_at), jid
        last = handled[-1]
        if job["schedule_type"] == "interval":
            nxt = last + timedelta(seconds=job["interval"])
        else:
            (nxt,) = cron.next_fire_times(job["cron_expr"], job["timezone"], last, 1)
        assert final[jid]["fire_at"] == final[jid]["occurrence_at"] == nxt, jid
        checked += 1

    # The burst really was one: everything due was claimed and moved on, most fired, some skipped
    # (overlap), missed (catch-up) and buffered; jobs alike shared plans within a batch.
    for jid, was in initial.items():
        if was.fire_at <= end_at - timedelta(seconds=0.5):
            assert final[jid]["fire_at"] > was.fire_at, jid
    assert fired >= 150 and checked >= 100, (fired, checked)
    assert sum(s.skipped - initial[j].skipped for j, s in states.items()) >= 5
    assert sum(s.missed - initial[j].missed for j, s in states.items()) >= 5
    assert any(s.buffered_at for s in states.values())
    # how many alike jobs share a batch depends on the random specs and the time of day (6 seen once,
    # usually more): enough that the shared plans were exercised, which the per-job checks then judge
    assert shared >= 4, shared
    if claim_from == "before_due":
        assert ahead >= 20, ahead  # runs claimed within the look-ahead, before their time


def test_an_occurrence_due_now_is_never_missed_for_one_within_the_look_ahead():
    job = cron_at_scale.schedule(noop, every=1, catchup="latest", overlap="skip")
    sql("UPDATE cron_at_scale_job SET fire_at = date_trunc('milliseconds', statement_timestamp()) - interval '0.3 s',"
        " occurrence_at = date_trunc('milliseconds', statement_timestamp()) - interval '0.3 s' WHERE id = %s",
        [job.id])
    due = Job.objects.get(id=job.id).fire_at
    d = Dispatcher(name="b", shards="all", lookahead=1.0)
    runs = d.claim()
    ((now,),) = sql("SELECT statement_timestamp()")
    assert now < due + timedelta(seconds=1), "the claim came too late for the test to mean anything"
    assert [(r.attempt, r.fire_at, r.occurrence) for r in runs] == [(1, due, due)]
    row = Job.objects.get(id=job.id)
    assert (row.missed_occurrences, row.skipped_occurrences) == (0, 0)
    assert row.fire_at == row.occurrence_at == due + timedelta(seconds=1)
    assert list(JobAttempt.objects.filter(job_id=job.id).values_list("attempt", "scheduled_at", "outcome")) == [
        (1, due, "dispatched")]


def run_loop(d: Dispatcher, seconds: float) -> threading.Thread:
    errors = []

    def loop():
        try:
            d.run(max_seconds=seconds)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
            raise
        finally:
            connections.close_all()

    thread = threading.Thread(target=loop, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def join(thread: threading.Thread, timeout: float) -> None:
    thread.join(timeout)
    assert not thread.is_alive(), "the dispatcher loop did not stop"
    assert not thread.errors, thread.errors  # type: ignore[attr-defined]


BURST_ZONES = ["UTC", "Asia/Kolkata", "America/New_York", "Australia/Adelaide", "Pacific/Chatham"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_an_unrelated_every_second_job_fires_every_occurrence_during_a_burst(broker):
    now = db_now()
    t = whole_second_after(now, 12)  # creating 20,000 cron jobs takes seconds on this box
    cron_at_scale.schedule_many(burst_specs([t], 20_000, after=now, task=noop.name, zones=BURST_ZONES))
    left = (t - db_now()).total_seconds()
    assert left > 3, f"the burst was created too late ({left:.1f}s before its instant)"
    queue = f"cas_burst_side_{random.randrange(10**9)}"
    first = whole_second_after(db_now(), 1)
    side = cron_at_scale.schedule(noop, every=1, at=first, overlap="allow", queue=queue)
    until = t + timedelta(seconds=4)
    occurrences = occurrences_from({"schedule_type": "interval", "interval": 1.0}, first, until + timedelta(seconds=1))
    side_runs = JobAttempt.objects.filter(job_id=side.id, scheduled_at__lte=until)
    burst_runs = JobAttempt.objects.exclude(job_id=side.id)
    d = Dispatcher(name="loop", shards="all", hold_unconsumed=False)
    try:
        # Until the burst and the side job's runs through `until` are out: a slow box claims the
        # burst later, and a loop stopped at a fixed time would leave the side job's last runs unfired.
        thread = run_loop(d, (t - db_now()).total_seconds() + 120)
        try:
            wait_until(lambda: side_runs.count() >= len(occurrences) and burst_runs.count() >= 20_000,
                       timeout=(t - db_now()).total_seconds() + 110, what="the burst and the side job's runs")
        finally:
            d.stop()
        join(thread, 60)
    finally:
        with redis.Redis.from_url(settings.CELERY_BROKER_URL) as r:  # the side queue and its bindings
            r.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")

    attempts = list(side_runs.order_by("attempt").values_list("scheduled_at", "outcome", "dispatched_at"))
    assert [(at, outcome) for at, outcome, _ in attempts] == [(o, "dispatched") for o in occurrences]
    # Earliest fire_at first: a side run due at or after the burst's instant may wait for its claim
    # (slow on a loaded box), never longer; on a quick box the burst is out before t, so it is on time.
    burst_out = max(burst_runs.values_list("dispatched_at", flat=True))
    late = [(at, round((dispatched - at).total_seconds(), 3)) for at, _, dispatched in attempts
            if dispatched > max(at, burst_out if at >= t else at) + timedelta(seconds=1)]
    assert not late, (f"runs of the every-second job claimed more than 1 s late (the burst was out "
                      f"{(burst_out - t).total_seconds():+.3f} s from its instant): {late}")
    assert Job.objects.get(id=side.id).missed_occurrences == 0
    # every burst job: exactly one run, for the burst's instant, and nothing missed
    assert sql("""SELECT count(*), count(DISTINCT a.job_id), min(a.scheduled_at), max(a.scheduled_at)
                  FROM cron_at_scale_jobattempt a WHERE a.job_id <> %s""", [side.id])[0] == (20_000, 20_000, t, t)
    assert sql("SELECT count(*), sum(missed_occurrences), sum(attempts) FROM cron_at_scale_job "
               "WHERE id <> %s", [side.id])[0] == (20_000, 0, 20_000)


class BrokerWatch:
    """Pops every message off the default queue's Redis list, keeping (time popped, header) for
    each: a message is popped after it was published, so a pop earlier than a run's fire_at less
    the ETA lead proves it was published too early."""

    def __init__(self, app):
        self.key = app.conf.task_default_queue
        self.redis = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        self.seen: list[tuple[float, dict]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            got = self.redis.brpop([self.key], timeout=0.2)
            if got is None:
                continue
            messages = [got[1]]
            while more := self.redis.rpop(self.key, 1000):
                messages += more
            popped = time.time()
            self.seen += [(popped, json.loads(m)["headers"]) for m in messages]

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.redis.close()


def clock_offset() -> tuple[float, float]:
    """(database clock - this process's clock, uncertainty), seconds."""
    best = None
    for _ in range(5):
        a = time.time()
        ((db,),) = sql("SELECT extract(epoch FROM clock_timestamp())::float8")
        b = time.time()
        if best is None or b - a < best[1] * 2:
            best = (db - (a + b) / 2, (b - a) / 2)
    return best


def claims_of(t: datetime) -> tuple:
    """(runs, jobs, first claim, last claim) of the runs dispatched for ``t``."""
    return sql("""SELECT count(*), count(DISTINCT job_id), min(dispatched_at), max(dispatched_at)
                  FROM cron_at_scale_jobattempt WHERE scheduled_at = %s AND outcome = 'dispatched'""", [t])[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
def test_pre_loading_claims_a_burst_before_its_instant(broker):
    # 20,000 jobs whose expressions fire at t1 and, 15 s later, at t2: at t1 a dispatcher without
    # pre-loading claims the burst (only within its look-ahead), at t2 a fresh one with PRELOAD 30
    # does (started more than 8 s ahead: long before).
    now = db_now()
    t1 = whole_second_after(now, 12)
    t2 = t1 + timedelta(seconds=15)
    # overlap allow: no worker runs the t1 runs, and t2 must not be skipped for them
    cron_at_scale.schedule_many(burst_specs([t1, t2], 20_000, after=now, task=noop.name, zones=BURST_ZONES,
                                            overlap="allow"))
    left = (t1 - db_now()).total_seconds()
    assert left > 3, f"the burst was created too late ({left:.1f}s before its instant)"
    offset, uncertainty = clock_offset()
    watch = BrokerWatch(broker)
    try:
        plain = Dispatcher(name="plain", shards="all", hold_unconsumed=False, preload=0)
        loop = run_loop(plain, 60)
        wait_until(lambda: db_now() > t1 and claims_of(t1)[0] == 20_000, timeout=30, what="the t1 burst claimed")
        plain.stop()
        join(loop, 30)
        d = Dispatcher(name="preload", shards="all", hold_unconsumed=False, preload=30)
        assert (d.lookahead, d.eta_lead) == (1.0, 1.0)
        ahead = (t2 - db_now()).total_seconds()
        assert ahead > 8, f"the pre-loading dispatcher started {ahead:.1f}s before the burst"
        join(run_loop(d, ahead + 1.5), 60)
        time.sleep(0.5)  # the last messages reach the watch
    finally:
        watch.close()

    lead = timedelta(seconds=d.eta_lead)
    # Without pre-loading the burst is claimed only within LOOKAHEAD of its instant...
    n, jobs, first, _last = claims_of(t1)
    assert (n, jobs) == (20_000, 20_000)
    assert first >= t1 - timedelta(seconds=plain.lookahead), f"claimed from {t1 - first} ahead"
    # ... pre-loaded, every run of it is claimed before its instant less the ETA lead (the claim's
    # own look-ahead, 1 s, takes none of them before then)...
    n, jobs, first, last = claims_of(t2)
    assert (n, jobs) == (20_000, 20_000)
    assert last < t2 - lead, f"the burst's last claim at {last}, {t2 - last} before its instant"
    # ... yet none of its messages is on the broker before its fire_at less the ETA lead.
    mine = [(popped, h) for popped, h in watch.seen
            if datetime.fromisoformat(h["cron_at_scale"]["fire_at"]) == t2]
    assert len(mine) == 20_000 and len({h["cron_at_scale"]["job_id"] for _, h in mine}) == 20_000
    early = [(popped, h) for popped, h in mine if popped + offset + uncertainty < (t2 - lead).timestamp()]
    assert not early, f"{len(early)} messages on the broker before fire_at - ETA_LEAD, e.g. {early[:2]}"
    assert all(datetime.fromisoformat(h["eta"]) == t2 for _, h in mine)
    assert uncertainty < 0.05  # the clocks the pop times were compared on


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
def test_jobs_with_an_unfinished_run_do_not_hold_back_the_rest_of_a_burst(broker):
    # 6,000 daily jobs due at t, half of them (overlap skip) with the run of an earlier occurrence
    # still unfinished: whether those overlap is decided when t is due, so they are not written
    # before it. The other half must still be pre-loaded and claimed ahead like any burst.
    now = db_now()
    t = whole_second_after(now, 14)
    jobs = cron_at_scale.schedule_many(burst_specs([t], 6_000, after=now, task=noop.name, zones=BURST_ZONES))
    busy = [str(j.id) for j in jobs[::2]]
    sql("UPDATE cron_at_scale_job SET fire_at = statement_timestamp() - interval '15 s', "
        "occurrence_at = statement_timestamp() - interval '15 s' WHERE id = ANY(%s::uuid[])", [busy])
    setup = Dispatcher(name="setup", lookahead=0, shards="all", batch_size=5000)
    assert len(setup.claim()) == len(busy)  # their earlier runs: dispatched, never finished
    assert sql("SELECT count(*) FROM cron_at_scale_job WHERE fire_at = %s", [t])[0][0] == 6_000
    d = Dispatcher(name="preload", shards="all", hold_unconsumed=False, preload=30)
    ahead = (t - db_now()).total_seconds()
    assert ahead > 8, f"the dispatcher started {ahead:.1f}s before the burst"
    join(run_loop(d, ahead + 2), 60)

    rows = {busy_: (n, first, last) for busy_, n, first, last in sql(
        """SELECT a.job_id = ANY(%s::uuid[]), count(*), min(a.dispatched_at), max(a.dispatched_at)
           FROM cron_at_scale_jobattempt a WHERE a.scheduled_at = %s GROUP BY 1""", [busy, t])}
    n, first, last = rows[True]
    assert n == 3_000 and first >= t  # the unfinished ones: skipped when due, not a look-ahead early
    assert sql("SELECT count(*) FROM cron_at_scale_jobattempt WHERE scheduled_at = %s AND outcome = 'skipped'",
               [t])[0][0] == 3_000
    n, first, last = rows[False]
    assert n == 3_000
    lead = timedelta(seconds=d.eta_lead)
    assert last < t - lead, (
        f"jobs of the burst claimed from {(first - t).total_seconds():+.2f}s to {(last - t).total_seconds():+.2f}s "
        f"of its instant: the ones with an unfinished run held the rest back")
