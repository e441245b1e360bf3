"""Pre-loading: a burst seen coming is claimed early enough that its runs go out at their instant.

The claim takes what falls due within ``LOOKAHEAD`` (1 s). A burst larger than a
second of claiming (a million daily jobs at midnight, every hourly job at the top
of the hour) would then leave seconds late, and every job due after it would wait
behind it (the claim takes the earliest ``fire_at`` first). So, between claims
(at most once per ``interval``), the dispatcher reads how many jobs of its shards
fall due in each second ahead, up to ``PRELOAD`` seconds (``due_ahead``: one
index range read per shard, no lock), and compares it with its own measured claim
rate. If the jobs due by the end of second *k* could not all be claimed before
*k* − ``ETA_LEAD`` − ``margin`` at that rate, it claims up to *k* now, earliest
first, and holds the runs in memory until their time (:class:`cron_at_scale.dispatcher.timers.HeldRuns`),
at most ``PRELOAD_MAX_RUNS`` of them: each run is published ``ETA_LEAD`` before its
``fire_at`` with Celery's eta, never started before it (the worker's start statement
refuses an early start on the database clock).

What it costs: a dispatcher killed while it holds a pre-loaded burst leaves those
runs claimed until their ``fire_at`` + ``DISPATCH_LEASE``; the reaper then fires them
again (late by the lease, never twice). A clean stop publishes them at their time first.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

# The claim rate assumed before any full batch was measured (jobs/s): low on purpose (a burst
# seen before the first measurement is claimed earlier than needed, never later).
FIRST_RATE = 2000.0
# A burst that takes less than this to claim is the ordinary look-ahead's (seconds).
MIN_CLAIM_TIME = 0.25


def reach(counts: Iterable[tuple[int, int]], *, rate: float, lead: float, margin: float, base: float,
          room: int) -> float:
    """Seconds ahead to claim now: ``base`` unless a burst must be claimed early.

    ``counts``: ``(second, jobs)`` ascending, second 0 being the next second; ``rate``: jobs/s
    claimed; ``lead``: the ETA lead (seconds before ``fire_at`` a run is published); ``margin``:
    seconds to spare (the time to the next look, and some); ``room``: runs that may still be held.
    The end of second *k* is reached when claiming what falls due by then would take at least
    ``MIN_CLAIM_TIME`` and not end ``lead + margin`` before it. At most ``room`` runs count: of a
    burst larger than that, the first ``room`` (the claim stops pre-loading once it holds them).
    """
    total = 0
    out = base
    for second, n in counts:
        full = total + n > room  # only part of this second fits: claim that part (earliest first)
        total = min(room, total + n)
        end = second + 1.0
        need = total / rate
        if need >= MIN_CLAIM_TIME and need + lead + margin >= end:
            out = max(out, end)
        if full:
            break
    return out


class Preload:
    """A dispatcher's pre-loading: its claim rate, and how far ahead to claim now.

    ``horizon``: seconds it looks ahead (``PRELOAD``; 0 turns it off); ``max_runs``: held runs
    at most (``PRELOAD_MAX_RUNS``); ``base``: the claim's own look-ahead (``LOOKAHEAD``);
    ``lead``: the ETA lead; ``interval``: seconds between two looks.
    """

    def __init__(self, horizon: float, max_runs: int, base: float, lead: float, interval: float = 1.0):
        self.horizon = horizon
        self.max_runs = max_runs
        self.base = base
        self.lead = lead
        self.interval = interval
        self.rate = FIRST_RATE
        self._until = 0.0  # monotonic time up to which a look decided to claim
        self._next_look = 0.0

    def observe(self, n: int, seconds: float, full: bool) -> None:
        """A claim of ``n`` runs took ``seconds`` (statement and recurring plans); only full
        batches say what the dispatcher can do."""
        if full and n and seconds > 0:
            self.rate = 0.7 * self.rate + 0.3 * (n / seconds)

    def lookahead(self, now: float | None = None, held: int = 0) -> float:
        """Seconds ahead the next claim takes (``base``, or more while a burst is pre-loaded and
        fewer than ``max_runs`` runs are ``held``: past its bound the ordinary look-ahead goes on)."""
        if held >= self.max_runs:
            return self.base
        now = time.monotonic() if now is None else now
        return max(self.base, self._until - now)

    def due(self, now: float) -> bool:
        """Whether it is time to look ahead again."""
        return self.horizon > 0 and now >= self._next_look

    def look(self, counts: list[tuple[int, int]], held: int, now: float) -> float:
        """Decide from ``counts`` (``due_ahead``'s rows, read at monotonic time ``now``) with
        ``held`` runs already held; return the look-ahead now in force (seconds)."""
        self._next_look = now + self.interval
        ahead = reach(counts, rate=self.rate, lead=self.lead, margin=self.interval + 0.25, base=self.base,
                      room=max(0, self.max_runs - held))
        if ahead > self.base:
            self._until = max(self._until, now + ahead)
        return self.lookahead(now)
