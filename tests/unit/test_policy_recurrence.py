"""Catch-up, overlap and jitter policies of recurring jobs (cron_at_scale.policy.recurrence.plan)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cron_at_scale.policy.recurrence import Recurrence, plan

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)
MIN = timedelta(minutes=1)


def every_minute(**kw) -> Recurrence:
    return Recurrence("job-1", "cron", "* * * * *", "UTC", **kw)


def test_on_time_occurrence_fires_and_the_next_follows_the_schedule():
    p = plan(every_minute(), T0, T0 + timedelta(milliseconds=40), running=False)
    assert p.fire == [(T0, T0)] and p.missed == 0 and not p.skipped
    assert p.next_occurrence == p.next_fire_at == T0 + MIN  # from the schedule, not from now: no drift


@pytest.mark.parametrize(("catchup", "fired", "missed"), [
    ("latest", [T0 + 10 * MIN], 10),
    ("all", [T0 + i * MIN for i in range(6, 11)], 6),
    ("skip", [], 11),
])
def test_catchup_after_ten_minutes_down_with_a_five_minute_window(catchup, fired, missed):
    rec = every_minute(catchup=catchup, catchup_window=300, overlap="allow")
    now = T0 + 10 * MIN + timedelta(seconds=1)
    p = plan(rec, T0, now, running=False)
    assert [occ for occ, _ in p.fire] == fired
    assert p.missed == missed  # never silently dropped: everything not fired is counted
    assert len(p.fire) + p.missed == 11
    assert p.next_occurrence == T0 + 11 * MIN


def test_skip_mode_still_fires_an_on_time_occurrence():
    p = plan(every_minute(catchup="skip"), T0, T0 + timedelta(seconds=2), running=False)
    assert [occ for occ, _ in p.fire] == [T0]


def test_a_very_long_outage_is_counted_without_walking_every_occurrence_forever():
    rec = Recurrence("j", "interval", interval=1.0, catchup_window=10)
    now = T0 + timedelta(days=3)
    p = plan(rec, T0, now, running=False)
    assert [occ for occ, _ in p.fire] == [now]
    assert p.missed >= 100_000  # a floor once the count is capped
    assert p.next_occurrence == now + timedelta(seconds=1)


@pytest.mark.parametrize(("overlap", "fires", "skipped", "buffer"), [
    ("skip", 0, 1, None),
    ("buffer_one", 0, 0, T0),
    ("allow", 1, 0, None),
])
def test_overlap_when_the_previous_run_is_unfinished(overlap, fires, skipped, buffer):
    p = plan(every_minute(overlap=overlap), T0, T0, running=True)
    assert (len(p.fire), len(p.skipped), p.buffer) == (fires, skipped, buffer)


def test_buffer_one_keeps_one_and_skips_the_rest_then_fires_it_when_free():
    rec = every_minute(overlap="buffer_one")
    p = plan(rec, T0 + MIN, T0 + MIN, running=True, buffered=T0)
    assert p.buffer == T0 and len(p.skipped) == 1 and not p.fire
    p = plan(rec, T0 + 2 * MIN, T0 + MIN + timedelta(seconds=30), running=False, buffered=T0)
    assert p.fire == [(T0, T0)] and p.buffer is None and p.next_occurrence == T0 + 2 * MIN


def test_catchup_all_without_allow_starts_one_run_and_records_the_others_skipped():
    rec = every_minute(catchup="all", overlap="skip")
    p = plan(rec, T0, T0 + 3 * MIN, running=False)
    assert [o for o, _ in p.fire] == [T0 + 3 * MIN] and len(p.skipped) == 3


def test_jitter_is_deterministic_bounded_and_spreads():
    rec = every_minute(jitter=3600)  # larger than the gap: capped by the next occurrence
    for i in range(200):
        occ = T0 + i * MIN
        j = rec.jittered(occ)
        assert occ <= j < occ + MIN
        assert rec.jittered(occ) == j  # recomputation gives the same instant
    offsets = {(rec.jittered(T0 + i * MIN) - (T0 + i * MIN)).total_seconds() // 10 for i in range(200)}
    assert len(offsets) == 6  # spread over the whole minute
    other = Recurrence("job-2", "cron", "* * * * *", "UTC", jitter=3600)
    assert other.jittered(T0) != rec.jittered(T0)  # per job: a million midnight jobs do not share an instant


def test_a_jittered_occurrence_is_not_fired_before_its_jittered_time():
    rec = every_minute(jitter=30)
    due = rec.jittered(T0 + MIN)
    p = plan(rec, T0 + MIN, due - timedelta(microseconds=1), running=False)
    assert not p.fire and p.next_fire_at == due
    p = plan(rec, T0 + MIN, due, running=False)
    assert p.fire == [(T0 + MIN, due)]


def test_interval_jobs_count_from_the_scheduled_occurrence():
    rec = Recurrence("j", "interval", interval=7.5)
    p = plan(rec, T0, T0 + timedelta(seconds=1), running=False)
    assert p.next_occurrence == T0 + timedelta(seconds=7.5)


def test_dst_fall_back_fixed_time_job_fires_once_through_the_dispatcher_plan():
    rec = Recurrence("j", "cron", "30 1 * * *", "America/New_York", catchup="all", catchup_window=86400, overlap="allow")
    first = datetime(2024, 11, 3, 5, 30, tzinfo=timezone.utc)  # 01:30 EDT
    p = plan(rec, first, first + timedelta(hours=2), running=False)
    assert [o for o, _ in p.fire] == [first]  # not again at 01:30 EST
    assert p.next_occurrence == datetime(2024, 11, 4, 6, 30, tzinfo=timezone.utc)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2000), st.integers(0, 5000), st.sampled_from(["latest", "all", "skip"]),
       st.integers(0, 900))
def test_every_due_occurrence_is_fired_missed_or_skipped(start_s, late_s, catchup, window):
    rec = Recurrence("j", "interval", interval=60.0, catchup=catchup, catchup_window=window, overlap="allow")
    occ = T0 + timedelta(seconds=start_s)
    now = occ + timedelta(seconds=late_s)
    p = plan(rec, occ, now, running=False)
    due = late_s // 60 + 1
    assert len(p.fire) + p.missed + len(p.skipped) == due
    assert p.next_occurrence > now and p.next_occurrence == occ + timedelta(seconds=60 * due)
    assert all(now - timedelta(seconds=window) <= o <= now for o, _ in p.fire)


@pytest.mark.parametrize("seed", range(20))
def test_jitter_never_turns_an_on_time_run_into_a_missed_one(seed):
    # An hourly job with jitter up to 30 minutes and the default 5-minute catch-up window: a run fired
    # at its jittered time is on time, however far that is from the un-jittered hour.
    rec = Recurrence(f"job-{seed}", "cron", "0 * * * *", "UTC", jitter=1800, catchup_window=300)
    due = rec.jittered(T0)
    for late in (0.0, 1.0, 299.0):
        p = plan(rec, T0, due + timedelta(seconds=late), running=False)
        assert p.fire == [(T0, due)] and p.missed == 0, (due - T0, late)
    p = plan(rec, T0, due + timedelta(seconds=301), running=False)  # due more than the window ago: missed
    assert p.fire == [] and p.missed == 1
