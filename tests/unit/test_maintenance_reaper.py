"""The reaper's pacing: a slow pass (thousands of lost runs) leaves the dispatcher's loop time to claim."""

import time

from cron_at_scale.maintenance.reaper import Reaper


def test_a_slow_pass_spaces_out_the_next_one():
    passes = []
    r = Reaper(lambda runs: None, None, lease=30.0, batch_size=10, interval=0.01, max_lost=5)
    r.reap = lambda: passes.append(time.monotonic()) or time.sleep(0.2) or 0  # a pass of 0.2 s
    r.maybe_reap(now=100.0)
    assert len(passes) == 1
    assert r.maybe_reap(now=100.5) == 0 and len(passes) == 1  # 4 x 0.2 s later at the soonest, not 0.01 s
    r.maybe_reap(now=102.0)  # a loaded box may stretch the 0.2 s sleep: up to 0.5 s still passes here
    assert len(passes) == 2


def test_a_quick_pass_keeps_the_interval():
    passes = []
    r = Reaper(lambda runs: None, None, lease=30.0, batch_size=10, interval=1.0, max_lost=5)
    r.reap = lambda: passes.append(1) or 0
    r.maybe_reap(now=10.0)
    r.maybe_reap(now=10.9)
    r.maybe_reap(now=11.0)
    assert len(passes) == 2
