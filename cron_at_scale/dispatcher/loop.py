"""The dispatcher: claim due jobs from PostgreSQL, publish them; its loop runs the reaper.

Any number of dispatchers may run at once: the claim statement locks rows
with ``FOR UPDATE SKIP LOCKED`` and changes their state in the same
statement, so no row is claimed twice. Every "is it due" and lease decision
uses the database's ``now()``.
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time

from django.core.exceptions import ImproperlyConfigured
from django.db import InterfaceError, OperationalError, transaction

from cron_at_scale import conf
from cron_at_scale import sql as db
from cron_at_scale.broker.publish import Publisher, Sender
from cron_at_scale.celery_app import get_app, refuse_pickle
from cron_at_scale.dispatcher import failpoints
from cron_at_scale.dispatcher.advance import advance
from cron_at_scale.dispatcher.backpressure import QueueGate
from cron_at_scale.dispatcher.claimed import Claimed, drop_expired
from cron_at_scale.dispatcher.floors import FloorProbe
from cron_at_scale.dispatcher.preload import Preload
from cron_at_scale.dispatcher.shards import AllShards, ShardLeases
from cron_at_scale.dispatcher.timers import TIMER_SLICE, HeldRuns
from cron_at_scale.dispatcher.wakeup import Wakeup
from cron_at_scale.maintenance.archive import Archive
from cron_at_scale.maintenance.history import HistoryTrim
from cron_at_scale.maintenance.loop import Loop, LoopThread
from cron_at_scale.maintenance.overdue import OverdueWatch
from cron_at_scale.maintenance.reaper import Reaper
from cron_at_scale.maintenance.retention import Retention
from cron_at_scale.ops import metrics
from cron_at_scale.ops.identity import process_name
from cron_at_scale.policy.recurrence import Occurrences

log = logging.getLogger(__name__)

default_name = process_name  # the old name


class Dispatcher:
    """Claims due jobs in batches and publishes them to the Celery broker.

    ``batch_size`` jobs per claim statement; ``poll_interval`` seconds of
    sleep when nothing is due (none after a full batch); ``lease`` seconds
    of dispatch lease per claimed attempt.
    """

    def __init__(self, name: str | None = None, batch_size: int | None = None,
                 poll_interval: float | None = None, lease: float | None = None, app=None,
                 shards: str = "auto", lookahead: float | None = None, hold_unconsumed: bool | None = None,
                 eta_lead: float | None = None, preload: float | None = None, publisher: Publisher | None = None):
        conf.check()
        self.name = name or process_name()
        self.batch_size = int(batch_size or conf.get("BATCH_SIZE"))
        self.poll_interval = float(conf.get("POLL_INTERVAL") if poll_interval is None else poll_interval)
        self.lease = float(lease or conf.get("DISPATCH_LEASE"))
        self.lookahead = float(conf.get("LOOKAHEAD") if lookahead is None else lookahead)
        # seconds before its fire_at a held run is published, with Celery's eta set to its fire_at;
        # a look-ahead given here (tools, tests) bounds the setting's lead unless a lead is given too
        if eta_lead is None:
            eta_lead = conf.eta_lead({**conf.values(), "LOOKAHEAD": self.lookahead})
            if lookahead is not None:
                eta_lead = min(eta_lead, self.lookahead)
        self.eta_lead = float(eta_lead)
        found = conf.contradictions({**conf.values(), "LOOKAHEAD": self.lookahead, "DISPATCH_LEASE": self.lease,
                                     "ETA_LEAD": self.eta_lead})
        if found:  # the arguments given here may contradict each other too
            raise ImproperlyConfigured("; ".join(found))
        # bursts seen coming are claimed early (cron_at_scale.dispatcher.preload): the claim's look-ahead comes from it
        self.preload = Preload(float(conf.get("PRELOAD") if preload is None else preload),
                               int(conf.get("PRELOAD_MAX_RUNS")), base=self.lookahead, lead=self.eta_lead)
        self.max_broker_depth = int(conf.get("MAX_BROKER_DEPTH"))
        self.app = app or get_app()
        refuse_pickle(self.app)
        self.publisher = Publisher(self.app) if publisher is None else publisher  # tests hand in a recording one
        # per destination queue: which are full or unconsumed (their jobs stay in the database)
        self.queues = QueueGate(self.app, self.max_broker_depth, bool(
            conf.get("HOLD_UNCONSUMED_QUEUES") if hold_unconsumed is None else hold_unconsumed),
            max_wait=conf.max_queue_wait({**conf.values(), "DISPATCH_LEASE": self.lease}),
            on_pace=metrics.observe_pace)
        # publishes on its own thread; a failing batch is retried for half its dispatch lease
        self.sender = Sender(self.publisher, self._sent, retry_for=self.lease / 2)
        # re-fired runs go out through this dispatcher's sender; they keep an expiring fire_at, maybe
        # below a floor: the claim's floors are reset after a pass that reaped
        self.reaper = Reaper(self._publish, self.app, lease=self.lease, batch_size=self.batch_size,
                             on_reaped=lambda _n: self.shards.floors.reset())
        # overdue recurring jobs: the signals, once per episode (cron_at_scale.maintenance.overdue)
        self.overdue = OverdueWatch()
        # this dispatcher's maintenance loops, each with its own timer, run by step() in this order:
        # every step before the claim; the idle_only ones (retention, history trim) on the maintenance
        # thread below in run(), or inline when idle in a bare step().
        # The floor probe (below) has the same shape but runs on a thread of its own.
        self.maintenance: list[Loop] = [self.reaper, self.overdue, Archive(), Retention(), HistoryTrim()]
        # in run(): the idle_only loops on a thread of their own, so that a purge catching up with
        # the fire rate never delays a claim (step() runs them inline when the thread is not running)
        self.background = LoopThread([loop for loop in self.maintenance if loop.idle_only], "cron_at_scale-maintenance")
        ttl = float(conf.get("SHARD_LEASE"))
        self.shards = (AllShards(self.batch_size) if shards == "all"
                       else ShardLeases(self.name, ttl, self.batch_size))
        self.shard_refresh = ttl / 4
        # a claim transaction left idle this long (a stalled dispatcher) is ended by the server,
        # its row locks with it: its jobs are free again by the time its shards move
        self.claim_idle_ms = max(1, int(ttl * 1000))
        # in run(): finds rows below the claim's floors from a thread of its own (cron_at_scale.dispatcher.floors)
        self.floor_probe = FloorProbe(self.shards.floors, self.queues.claim_params)
        self.wakeup = Wakeup()
        self.stopping = threading.Event()
        self.claimed_total = 0
        self.published_total = 0
        self._next_shards = 0.0
        self.held = HeldRuns()  # runs claimed ahead, until their time (monotonic) to go out
        self.occurrences = Occurrences()  # cron occurrences by (expression, zone, previous), across claims
        self._clock: tuple[float, float] | None = None  # (database time, monotonic) at the last claim
        self.more_due = False  # the last claim left rows due: claim again without waiting
        self._held_queues: dict | None = None  # of the last claim (QueueGate.claim_params)

    # -- one step -------------------------------------------------------------------------

    def claim(self) -> list[Claimed]:
        """Claim up to ``batch_size`` due jobs; return the runs to publish.

        One transaction: the claim statement, then (only if recurring jobs
        were claimed) one statement moving them to their next occurrence and
        logging the runs they fire now (see :mod:`cron_at_scale.policy.recurrence`).
        """
        if self._next_shards == 0.0:  # claim() called on its own (tools, tests): take shards first
            self._next_shards = time.monotonic() + self.shard_refresh
            self.shards.refresh()
        t0 = time.monotonic()
        while True:
            held_queues = self.queues.claim_params()
            if held_queues != self._held_queues:  # a queue let go: its jobs may lie below the shards' floors
                self._held_queues = held_queues
                self.shards.floors.reset()
            shards = self.shards.claim_params()
            lookahead = self.preload.lookahead(held=len(self.held))
            nested = db.get_connection().in_atomic_block
            with transaction.atomic(using=conf.db_alias()):
                db.run("claim_settings", {"idle_ms": None if nested else self.claim_idle_ms}, fetch="count",
                       retries=0)
                t1 = time.monotonic()
                # a queue being paced (MAX_QUEUE_WAIT) bounds the batch by the room left in it
                rows = db.run("claim", {"limit": self.queues.claim_limit(self.batch_size), "dispatcher": self.name,
                                        "lease": self.lease,
                                        "lookahead": lookahead, **shards, **held_queues}, retries=0)
                if rows:  # the rows locked, nothing committed (the fault suite stalls a dispatcher here)
                    failpoints.hit("dispatcher.in_claim")
                if self.queues.learn(rows):  # a queue first seen in this batch is held: claim again without it
                    transaction.set_rollback(True, using=conf.db_alias())
                    continue
                self.more_due = self.shards.heads.learn([r.shard for r in rows])
                self.shards.floors.learn(rows, rows[0].db_now if rows else None, time.monotonic() - t1)
                metrics.observe_claim(len(rows), time.monotonic() - t0)
                if rows:  # the statement's end on both clocks (late by the rows' transfer, never early)
                    self._clock = (max(r.db_clock for r in rows).timestamp(), time.monotonic())
                runs = [Claimed.from_row(r) for r in rows if r.schedule_type == "once"]
                recurring = [r for r in rows if r.schedule_type != "once"]
                if recurring:
                    db.run("claim_plan_done", fetch="count", retries=0)
                    runs += advance(recurring, lease=self.lease, lookahead=lookahead, shared=self.occurrences)
                if rows:  # runs already past their expiry are recorded skipped, not published
                    runs = drop_expired(runs, rows[0].db_now)
            self.queues.note(runs)
            self.preload.observe(len(rows), time.monotonic() - t1, full=len(rows) >= self.batch_size)
            return runs

    def look_ahead(self) -> float:
        """Read the due count per second ahead of this dispatcher's shards and let the pre-loading
        decide (see :mod:`cron_at_scale.dispatcher.preload`); return the look-ahead now in force (seconds)."""
        now = time.monotonic()
        shards = self.shards.claim_params()["shards"]
        room = max(0, self.preload.max_runs - len(self.held))
        counts = db.run("due_ahead", {"shards": shards, "horizon": self.preload.horizon,
                                      "per_shard": room // max(1, len(shards)) + 1, **self.queues.claim_params()})
        return self.preload.look([(r.second, r.n) for r in counts], len(self.held), now)

    def tick(self, wait: bool = True) -> int:
        """Claim one batch; publish what is due now, hold the rest on timers; return the count claimed.

        A run not yet due goes out ``eta_lead`` seconds before its ``fire_at`` (on this process's
        estimate of the database clock), its message carrying Celery's ``eta`` = its ``fire_at``;
        the worker holds it until then, and its start statement refuses it earlier (the database
        clock decides, see ``start_attempt``). A run already due goes out at once, without an eta.

        ``wait=False`` (the run loop) returns once the batch is queued for the sender thread.
        """
        batch = self.claim()
        if batch:
            failpoints.hit("dispatcher.after_claim")
            self.claimed_total += len(batch)
            assert self._clock is not None  # set by the claim that returned rows
            db_time, mono = self._clock
            due: list[Claimed] = []
            later: list[tuple[float, Claimed]] = []
            for run in batch:
                at = mono + (run.fire_at.timestamp() - db_time)  # when it is due, on this process's clock
                if at <= mono:
                    due.append(run)
                elif at - self.eta_lead <= mono:
                    due.append(run.with_eta())
                else:  # the eta set now, while the burst is still ahead, not when it comes due
                    later.append((at - self.eta_lead, run.with_eta() if self.eta_lead else run))
            self._publish(due, wait=False)
            if later:  # their messages built now, while they wait: at their time they are only sent
                try:
                    with self.sender.lock:
                        runs = self.publisher.prepare([run for _at, run in later])
                    later = [(at, run) for (at, _old), run in zip(later, runs, strict=True)]
                except Exception:  # the broker away: built when sent instead
                    log.warning("could not build the messages of %d held runs now", len(later), exc_info=True)
            self.held.hold(later)
            if wait:
                self.sender.wait()
            log.info("dispatcher %s claimed %d jobs (%d held for their fire_at); first job %s", self.name,
                     len(batch), len(batch) - len(due), batch[0].job_id,
                     extra={"claimed": len(batch), "dispatcher": self.name, "first_job": str(batch[0].job_id)})
        return len(batch)

    def fire_timers(self, until: float | None = None, wait: bool = True) -> int:
        """Publish the held runs whose time has come (all up to ``until``, a monotonic time)."""
        until = time.monotonic() if until is None else until
        due = self.held.pop_due(until)
        # a pre-loaded burst comes due at once: sent a batch at a time, so that one pipeline to the
        # broker stays a batch's size and the sender's queue bounds what waits in it
        for i in range(0, len(due), self.batch_size):
            self._publish(due[i:i + self.batch_size], wait=False)
        if wait:
            self.sender.wait()
        return len(due)

    def _publish(self, runs: list[Claimed], wait: bool = True) -> None:
        """Publish ``runs`` on the sender thread; ``wait=False`` returns at once (the run loop:
        the next claim overlaps this publish). A few runs with the sender idle go out on this
        thread before it returns (``Sender.send``)."""
        if runs:
            self.sender.send(runs)
        if wait:
            self.sender.wait()

    def _sent(self, n: int, seconds: float) -> None:
        self.published_total += n
        metrics.observe_published(n, seconds)

    def reap(self) -> int:
        """One pass of the reaper now (see :class:`cron_at_scale.maintenance.reaper.Reaper`); return how many
        expired attempts were reaped."""
        return self.reaper.run_once()  # runs sent back keep an expiring fire_at: the floors reset

    @property
    def max_lost(self) -> int:
        """Lost attempts after which a one-off job fails (the reaper's)."""
        return self.reaper.max_lost

    @max_lost.setter
    def max_lost(self, value: int) -> None:
        self.reaper.max_lost = value

    @property
    def reaper_interval(self) -> float:
        """Seconds between two passes of the reaper."""
        return self.reaper.interval

    @reaper_interval.setter
    def reaper_interval(self, value: float) -> None:
        self.reaper.interval = value

    # -- the loop -------------------------------------------------------------------------

    def step(self, wait: bool = True, claim: bool = True) -> int:
        """One pass of the loop: refresh shard leases, reap and check for overdue jobs when due, fire
        timers, claim a batch; when idle, purge (retention) and trim run history.

        Returns how many jobs were claimed. ``wait=False`` (the run
        loop) leaves the batch publishing on the sender thread while the next claim runs;
        ``claim=False`` (the run loop, woken only by a held run's time) fires timers only.
        """
        now = time.monotonic()
        if now >= self._next_shards:
            self._next_shards = now + self.shard_refresh
            self.shards.refresh()
        for loop in self.maintenance:  # the reaper, the overdue watch
            if not loop.idle_only:
                loop.maybe_run(now)
        if not self.held.running:  # else the timer thread sends them
            self.fire_timers(wait=wait)
        if claim:
            # Back-pressure: a queue over MAX_BROKER_DEPTH or with no consumer holds its own jobs in the
            # database (the claim skips them, see cron_at_scale.dispatcher.backpressure); the others fire.
            self.queues.refresh()
            n = self.tick(wait=wait)
        else:
            n, self.more_due = 0, False
        if not self.held.running:
            self.fire_timers(wait=wait)
        if claim and not self.more_due and self.preload.due(now):  # a burst coming: claim it now
            self.more_due = self.look_ahead() > self.preload.base
        if not self.more_due and not self.background.running:  # idle time only: never holds up a busy loop
            for loop in self.maintenance:  # retention, the history trim
                if loop.idle_only:
                    loop.maybe_run()
        return n

    def run(self, max_seconds: float | None = None) -> None:
        """Loop until ``stop()`` (or SIGTERM/SIGINT via ``install_signal_handlers``).

        Sleeps only when the last claim left nothing due (a batch not full, no shard
        at its limit, see :class:`cron_at_scale.dispatcher.shards.ShardHeads`): until the next held run is due,
        a wake-up notification arrives, or ``poll_interval`` passes. On stop,
        runs already claimed are published at their time before it exits.
        Database errors (a restart) are logged and retried after a short pause.
        """
        deadline = time.monotonic() + max_seconds if max_seconds else None
        log.info("dispatcher %s started (batch %d, poll %.3fs, lease %.1fs, look-ahead %.1fs)",
                 self.name, self.batch_size, self.poll_interval, self.lease, self.lookahead)
        pause = 0.0
        claim_at = 0.0  # monotonic time of the next claim: the poll, sooner on a full batch or a wake-up
        self.held.start(lambda: self.fire_timers(wait=False))  # held runs go out whatever the loop does
        self.floor_probe.start()
        self.queues.start()  # the queues' re-checks off the loop: a claim woken by a new job never waits for one
        self.background.start()
        # Django, Celery and kombu leave ~10^6 objects behind their imports; each full collection
        # walked them all (40-60 ms, about once a second at 10,000 jobs/s: every thread stopped,
        # held runs late). Frozen, a collection walks only what the loop made since (Python's gc.freeze).
        gc.collect()
        gc.freeze()
        while not self.stopping.is_set():
            if deadline and time.monotonic() > deadline:
                break
            try:
                claim = time.monotonic() >= claim_at
                self.step(wait=False, claim=claim)
                if claim:
                    claim_at = 0.0 if self.more_due else time.monotonic() + self.poll_interval
                pause = 0.0
            except (OperationalError, InterfaceError) as e:
                pause = min(5.0, (pause or 0.1) * 2)
                log.warning("database unavailable (%s); retrying in %.1fs", str(e).strip()[:200], pause)
                db.reset_connection()
                self.stopping.wait(pause)
                continue
            if claim_at and self.wakeup.wait(self.next_wait(claim_at), self.stopping):
                claim_at = 0.0  # new work due (maybe scheduled into the past): claim now, from the start
                self.shards.floors.reset()
        self.close()

    def next_wait(self, claim_at: float | None = None) -> float:
        """Seconds to sleep: until the next claim (``claim_at``, monotonic; by default one poll
        interval from now) or the next held run, whichever comes first. Waking for a held run does
        not claim: at 500 runs/s that would be a claim statement every 2 ms."""
        now = time.monotonic()
        wait = self.poll_interval if claim_at is None else claim_at - now
        held_at = None if self.held.running else self.held.next_at()  # the timer thread sends them
        if held_at is not None:
            # held runs go out in slices of TIMER_SLICE: a few ms late at most, never early,
            # and not a wake-up (and a publish) per run at hundreds of runs a second
            wait = min(wait, max(held_at - now, TIMER_SLICE))
        return max(0.0, wait)

    def close(self) -> None:
        """Publish held runs at their time, give back shard leases, close connections."""
        self.floor_probe.stop()
        self.background.stop()
        self._drain_timers()
        self.sender.close()
        try:
            self.shards.release_all()
        except (OperationalError, InterfaceError):
            log.warning("could not release shard leases; they expire in %.0fs", self.shard_refresh * 4)
        self.wakeup.close()
        self.publisher.close()
        self.queues.close()
        log.info("dispatcher %s closed: %d claimed, %d published", self.name, self.claimed_total, self.published_total)

    def _drain_timers(self) -> None:
        self.held.stop()
        while (at := self.held.next_at()) is not None:
            time.sleep(max(0.0, at - time.monotonic()))
            self.fire_timers()

    def stop(self, *_args) -> None:
        self.stopping.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
