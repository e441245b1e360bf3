"""The operator's figures' pure parts: durations as the admin and the dashboard print them."""

from __future__ import annotations

from cron_at_scale.ops.status import duration_text


def test_durations_read_in_the_largest_two_units():
    assert duration_text(3.25) == "3.2 s"
    assert duration_text(42.9) == "42 s"
    assert duration_text(1201) == "20 min 1 s"
    assert duration_text(7830) == "2 h 10 min"
    assert duration_text(3 * 86400 + 4 * 3600 + 5) == "3 d 4 h"
