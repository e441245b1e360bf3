"""The maintenance loops' one shape (cron_at_scale.maintenance.loop): the interval, the error policy,
a timer per instance. Pure: no database, no broker (the loops' passes are stand-ins here)."""

from __future__ import annotations

import logging
import time

import pytest
from django.db import InterfaceError, OperationalError

from cron_at_scale.dispatcher.floors import FloorProbe, ShardFloors
from cron_at_scale.maintenance.history import HistoryTrim
from cron_at_scale.maintenance.loop import Loop
from cron_at_scale.maintenance.overdue import OverdueWatch
from cron_at_scale.maintenance.reaper import Reaper
from cron_at_scale.maintenance.retention import Retention


class Counting(Loop):
    name = "counting loop"

    def __init__(self, interval: float, fail: BaseException | None = None) -> None:
        super().__init__(interval)
        self.passes = 0
        self.fail = fail

    def run_once(self) -> int:
        self.passes += 1
        if self.fail is not None:
            raise self.fail
        return 7


def test_the_first_call_runs_a_pass_and_the_next_waits_the_interval():
    loop = Counting(10.0)
    assert loop.due(100.0)
    assert loop.maybe_run(100.0) == 7
    assert not loop.due(109.9)
    assert loop.maybe_run(109.9) == 0 and loop.passes == 1  # idle: 0
    assert loop.maybe_run(110.0) == 7 and loop.passes == 2
    assert loop.maybe_run(115.0) == 0 and loop.passes == 2


def test_an_exception_in_a_pass_is_logged_with_the_loops_name_and_the_next_pass_waits_the_interval(caplog):
    loop = Counting(5.0, fail=ValueError("boom"))
    with caplog.at_level(logging.ERROR):
        assert loop.maybe_run(50.0) == 0  # not raised
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "counting loop failed" in record.getMessage() and "5s" in record.getMessage()
    assert record.exc_info and isinstance(record.exc_info[1], ValueError)
    assert loop.maybe_run(54.9) == 0 and loop.passes == 1  # no retry before the interval
    assert loop.maybe_run(55.0) == 0 and loop.passes == 2


@pytest.mark.parametrize("error", [OperationalError("server closed the connection"), InterfaceError("closed")])
def test_a_database_connection_error_goes_to_the_caller_and_the_next_pass_still_waits(error):
    loop = Counting(5.0, fail=error)
    with pytest.raises(type(error)):
        loop.maybe_run(50.0)  # the dispatcher's loop pauses and resets the connection
    assert not loop.due(54.9)
    assert loop.due(55.0)


def test_an_interrupt_is_not_swallowed():
    loop = Counting(5.0, fail=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        loop.maybe_run(1.0)
    assert not loop.due(2.0)


def test_two_instances_keep_their_own_timers():
    # two dispatchers in one process: each loop's timer is its own, nothing at module level
    first, second = Counting(10.0), Counting(10.0)
    assert first.maybe_run(100.0) == 7
    assert second.due(100.0)  # the first one's pass does not delay the second's
    assert second.maybe_run(101.0) == 7
    assert not first.due(105.0) and first.due(110.0)
    assert not second.due(110.0) and second.due(111.0)


@pytest.mark.parametrize("make", [
    lambda: Retention(retention=60.0),
    lambda: HistoryTrim(),
    lambda: OverdueWatch(),
    lambda: Reaper(lambda runs: None, None, lease=30.0, batch_size=10, interval=1.0, max_lost=5),
    lambda: FloorProbe(ShardFloors(), lambda: {}),
], ids=["retention", "history", "overdue", "reaper", "floor probe"])
def test_each_loop_has_the_shape_and_its_own_timer(make):
    a, b = make(), make()
    passes = []
    for loop in (a, b):
        loop.run_once = lambda loop=loop: passes.append(loop) or loop.idle  # no database here
        assert isinstance(loop, Loop) and loop.interval > 0
    a.maybe_run(1000.0)
    assert passes == [a]
    a.maybe_run(1000.0 + a.interval / 2)
    assert passes == [a]  # a's interval has not passed
    b.maybe_run(1000.0 + a.interval / 2)
    assert passes == [a, b]  # b has a timer of its own
    a.maybe_run(1000.0 + a.interval)
    assert passes == [a, b, a]


def test_each_loop_logs_an_error_and_keeps_its_interval(caplog):
    loops = [Retention(retention=60.0), HistoryTrim(), OverdueWatch(),
             Reaper(lambda runs: None, None, lease=30.0, batch_size=10, interval=1.0, max_lost=5),
             FloorProbe(ShardFloors(), lambda: {})]
    for loop in loops:
        def fail():
            raise RuntimeError("a bug")
        loop.run_once = fail  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR):
            assert loop.maybe_run(500.0) == loop.idle
        assert any(r.getMessage().startswith(f"{loop.name} failed") for r in caplog.records), loop.name
        assert not loop.due(500.0 + loop.interval - 0.01) and loop.due(500.0 + loop.interval)
        caplog.clear()


def test_the_intervals_and_budgets_are_the_modules_constants():
    from cron_at_scale.maintenance import history, overdue, retention

    assert Retention().interval == retention.RETENTION_INTERVAL == 60.0
    assert Retention().budget == retention.RETENTION_BUDGET == 0.5
    assert HistoryTrim().interval == history.TRIM_INTERVAL == 10.0
    assert HistoryTrim().budget == history.TRIM_BUDGET == 0.5
    assert OverdueWatch().interval == overdue.CHECK_INTERVAL == 5.0
    floors = ShardFloors()
    assert FloorProbe(floors, lambda: {}).interval == floors.interval == 5.0


def test_retention_is_off_with_retention_none_and_its_timer_left_alone(settings):
    settings.CRON_AT_SCALE = {"RETENTION": None}
    loop = Retention()
    loop.run_once = lambda: pytest.fail("a pass while off")  # type: ignore[method-assign]
    assert not loop.due(10.0)
    assert loop.maybe_run(10.0) == (0, 0)
    settings.CRON_AT_SCALE = {"RETENTION": 86400}
    loop.run_once = lambda: (1, 2)  # type: ignore[method-assign]
    assert loop.maybe_run(11.0) == (1, 2)  # turned on: the first call purges


def test_the_reaper_resets_after_a_pass_that_reaped():
    reset = []
    r = Reaper(lambda runs: None, None, lease=30.0, batch_size=10, interval=1.0, max_lost=5, on_reaped=reset.append)
    r.reap = lambda: 0  # type: ignore[method-assign]
    r.maybe_run(1.0)
    assert reset == []
    r.reap = lambda: 3  # type: ignore[method-assign]
    assert r.maybe_reap(2.0) == 3
    assert reset == [3]


def test_a_loop_thread_runs_its_loops_off_the_calling_thread_until_stopped():
    import threading

    from cron_at_scale.maintenance.loop import LoopThread

    ran: list[str] = []

    class Counting(Loop):
        name = "counting"
        interval = 0.0

        def run_once(self):
            ran.append(threading.current_thread().name)
            return 1

    t = LoopThread([Counting()], "maintenance-test", tick=0.01)
    assert not t.running
    t.start()
    deadline = time.monotonic() + 5
    while len(ran) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    t.stop()
    n = len(ran)
    time.sleep(0.05)
    assert n >= 3 and set(ran) == {"maintenance-test"} and len(ran) == n and not t.running
