"""The pre-loading decision (cron_at_scale.dispatcher.preload): how far ahead a dispatcher claims now."""

from cron_at_scale.dispatcher.preload import MIN_CLAIM_TIME, Preload, reach

KW = {"rate": 10_000.0, "lead": 1.0, "margin": 1.25, "base": 1.0, "room": 200_000}


def test_nothing_ahead_keeps_the_ordinary_look_ahead():
    assert reach([], **KW) == 1.0


def test_a_burst_is_claimed_once_waiting_longer_would_make_it_late():
    # 100,000 due: 10 s to claim, + 1 s lead + 1.25 s margin: to start once 12.25 s away or less
    assert reach([(30, 100_000)], **KW) == 1.0  # 31 s away: not yet
    assert reach([(12, 100_000)], **KW) == 1.0  # 13 s away: not yet
    assert reach([(11, 100_000)], **KW) == 12.0  # 12 s away: now, up to the end of that second
    assert reach([(9, 100_000)], **KW) == 10.0  # already short of time: claim it all now


def test_what_claims_faster_than_a_quarter_second_is_left_to_the_look_ahead():
    small = int(KW["rate"] * MIN_CLAIM_TIME) - 1
    assert reach([(0, small), (1, 0)], **KW) == 1.0
    assert reach([(1, small + 2)], **KW) == 2.0


def test_steady_load_does_not_pre_load():
    # 1,000 jobs a second for a minute at 10,000 jobs/s: each second claims in 0.1 s
    assert reach([(k, 1_000) for k in range(60)], **KW) <= 3.0


def test_the_runs_counted_never_pass_the_room_left():
    # a million at one instant, 200,000 of room: the first 200,000 take 20 s to claim
    assert reach([(25, 1_000_000)], **KW) == 1.0
    assert reach([(21, 1_000_000)], **KW) == 22.0
    assert reach([(21, 1_000_000)], **{**KW, "room": 0}) == 1.0


def test_a_decision_holds_until_its_time_has_passed():
    p = Preload(horizon=60.0, max_runs=200_000, base=1.0, lead=1.0)
    p.rate = 10_000.0
    assert p.due(100.0)
    assert p.look([(9, 100_000)], held=0, now=100.0) == 10.0
    assert not p.due(100.5)
    assert p.lookahead(104.0) == 6.0  # the window counts down to its instant
    assert p.lookahead(104.0, held=200_000) == 1.0  # at its bound of held runs: the ordinary look-ahead
    assert p.lookahead(200.0) == 1.0  # then back to the ordinary look-ahead


def test_the_claim_rate_is_learned_from_full_batches_only():
    p = Preload(horizon=60.0, max_runs=1000, base=1.0, lead=1.0)
    p.observe(10, 1.0, full=False)
    assert p.rate == 2000.0
    p.observe(1000, 0.05, full=True)  # 20,000 jobs/s
    assert 2000.0 < p.rate < 20_000.0


def test_off_never_looks():
    assert not Preload(horizon=0.0, max_runs=1000, base=1.0, lead=1.0).due(0.0)
