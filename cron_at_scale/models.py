"""The job store: ``Job`` (what to run and when) and ``JobAttempt`` (the attempt log).

The job's state machine is drawn in docs/state_machine.md. Every time the
scheduler sets is a ``timestamptz`` from the database clock
(``statement_timestamp()``), never a node's clock; ``at=`` is stored as given.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from cron_at_scale import conf
from cron_at_scale.ids import new_job_id


class Status(models.TextChoices):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PAUSED = "paused"  # a recurring job on hold; resume() follows its catch-up policy


class ScheduleType(models.TextChoices):
    ONCE = "once"
    CRON = "cron"
    INTERVAL = "interval"  # every ``interval`` seconds from the previous scheduled fire_at


class Catchup(models.TextChoices):
    """What a recurring job does with occurrences that fell due while nobody fired them."""

    LATEST = "latest"  # fire the latest missed occurrence within the window, once
    ALL = "all"  # fire every missed occurrence within the window
    SKIP = "skip"  # fire none; wait for the next future occurrence


class Overlap(models.TextChoices):
    """What a recurring job does when an occurrence falls due while its previous run is unfinished."""

    SKIP = "skip"  # do not fire it (recorded as a skipped attempt)
    BUFFER_ONE = "buffer_one"  # fire it when the previous run ends (at most one waits)
    ALLOW = "allow"  # fire it anyway; runs overlap


class Outcome(models.TextChoices):
    DISPATCHED = "dispatched"  # claimed and sent to the broker, not started yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # raised; the job failed (no retry left)
    RETRIED = "retried"  # raised; the job was put back to pending with a backoff
    CANCELLED = "cancelled"  # the job was cancelled before or while this attempt ran
    SKIPPED = "skipped"  # not run: the previous run was unfinished (overlap skip), its job already completed,
    # or it expired (not started within the job's ``expires`` seconds; the error says so)
    LOST = "lost"  # lease expired with nobody finishing it (dead worker, lost message)


LIVE_STATUSES = (Status.PENDING, Status.IN_PROGRESS, Status.PAUSED)

NUM_SHARDS = conf.NUM_SHARDS  # fixed by migration 0004
DEFAULT_CATCHUP_WINDOW = 300.0  # seconds: a restart or deploy is caught up, a day-long outage is not


class Job(models.Model):
    """One scheduled job: a one-off (``schedule_type='once'``) or a cron schedule.

    ``fire_at`` is the next time it is due (aware UTC). A cron job stays
    ``pending`` for its whole life; each occurrence runs as a ``JobAttempt``.
    """

    id = models.UUIDField(primary_key=True, default=new_job_id, editable=False)  # UUIDv7: time-ordered
    schedule_type = models.CharField(max_length=8, choices=ScheduleType.choices, db_default=ScheduleType.ONCE)
    fire_at = models.DateTimeField(help_text="Next time the job is due (UTC).")
    cron_expr = models.CharField(max_length=200, blank=True, db_default="")
    timezone = models.CharField(max_length=64, db_default="UTC")
    task = models.CharField(max_length=200)
    payload = models.JSONField(default=dict, help_text='{"args": [...], "kwargs": {...}}')
    queue = models.CharField(max_length=200, blank=True, db_default="")
    options = models.JSONField(default=dict, blank=True, help_text="Celery publish options (priority).")
    status = models.CharField(max_length=12, choices=Status.choices, db_default=Status.PENDING)
    retries = models.PositiveIntegerField(db_default=0, help_text="Retries used so far.")
    # NULL: the task's (its retry_kwargs or max_retries, Celery's meaning), resolved by the worker.
    max_retries = models.PositiveIntegerField(
        null=True, blank=True, help_text="Retries allowed after the first attempt (empty: the task's).")
    attempts = models.PositiveIntegerField(db_default=0, help_text="Number of the latest attempt (0: never fired).")
    lost_attempts = models.PositiveIntegerField(db_default=0)
    # Attempts lost before any worker started them (a lost message, a long queue), since the
    # last requeue: each doubles the next dispatch lease (up to 16x).
    dispatch_losses = models.IntegerField(db_default=0)  # no CHECK: adding one would scan the table under lock
    cancel_requested = models.BooleanField(db_default=False)
    locked_by = models.CharField(max_length=200, blank=True, db_default="")
    locked_until = models.DateTimeField(null=True, blank=True)
    key = models.CharField(max_length=255, null=True, blank=True, help_text="Idempotency key, unique among live jobs.")
    # Recurring jobs (cron, interval): the policies of issue "cron that is right".
    interval = models.FloatField(null=True, blank=True, help_text="Seconds between occurrences (interval jobs).")
    occurrence_at = models.DateTimeField(
        null=True, blank=True, help_text="The nominal occurrence fire_at stands for (fire_at minus jitter)."
    )
    catchup = models.CharField(max_length=8, choices=Catchup.choices, db_default=Catchup.LATEST)
    catchup_window = models.FloatField(db_default=DEFAULT_CATCHUP_WINDOW, help_text="Seconds.")
    overlap = models.CharField(max_length=12, choices=Overlap.choices, db_default=Overlap.SKIP)
    jitter = models.FloatField(db_default=0.0, help_text="Seconds; each occurrence fires in [t, t + jitter).")
    buffered_at = models.DateTimeField(null=True, blank=True, help_text="An occurrence waiting for the running one.")
    missed_occurrences = models.PositiveIntegerField(db_default=0)
    skipped_occurrences = models.PositiveIntegerField(db_default=0)
    # Runs skipped because they were not started within options["expires"] seconds of their
    # scheduled time (cron_at_scale.policy.expiry). No CHECK: adding one would scan the table under lock.
    expired_runs = models.IntegerField(db_default=0)
    pause_note = models.TextField(blank=True, db_default="")
    # The W3C trace context of the span current at schedule() ({"traceparent": ..., "tracestate": ...},
    # cron_at_scale.ops.tracing); NULL when OpenTelemetry is absent or no span was current.
    trace_context = models.JSONField(null=True, blank=True, editable=False)
    # "Has it run?" (cron_at_scale.maintenance.overdue): NULL grace is the OVERDUE_GRACE setting's.
    grace = models.FloatField(null=True, blank=True, help_text="Seconds an occurrence may go without a success "
                              "before the job is overdue (empty: the OVERDUE_GRACE setting).")
    last_success_at = models.DateTimeField(null=True, blank=True, help_text="When a run last succeeded (UTC).")
    last_success_occurrence = models.DateTimeField(
        null=True, blank=True, help_text="The latest scheduled time a successful run was fired for.")
    due_since = models.DateTimeField(
        null=True, blank=True, help_text="The earliest occurrence fired since the last success (empty: none).")
    resumed_at = models.DateTimeField(null=True, blank=True,
                                      help_text="Last resume: earlier occurrences never make it overdue.")
    overdue_since = models.DateTimeField(
        null=True, blank=True, help_text="When the dispatchers opened its current overdue episode (empty: none).")
    # Which shard the job belongs to, from the random last 32 bits of its id
    # (dispatchers lease shards to split the work).
    shard = models.GeneratedField(
        expression=models.Func(
            models.F("id"),
            template="((('x' || right(%(expressions)s::text, 8))::bit(32)::int "
                     f"& 2147483647) %% {NUM_SHARDS})",
        ),
        output_field=models.SmallIntegerField(),
        db_persist=True,
    )
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes = [
            # Which index serves which statement, who runs it and how often: docs/indexes.md.
            # The claim: each held shard's head (pending rows, ordered by fire_at).
            models.Index(fields=["shard", "fire_at"], name="cron_job_pending_shard", condition=Q(status="pending")),
            # The admin at 10M rows: its default order (what needs attention first) reads a range per
            # status; its "next fire" order merges them (cron_at_scale.ops.fire_order: no (fire_at, id)
            # index, which cost every job three entries); the dead-letter and paused counts. Each list
            # filter walks an index. Pending rows are left out: the claim's index above holds them,
            # read shard by shard and merged (fire_order.pending_keys), so a job's insert costs no entry here.
            models.Index(fields=["status", "fire_at", "id"], name="cron_job_status_fire_at",
                         condition=~Q(status="pending")),
            models.Index(fields=["task", "fire_at", "id"], name="cron_job_task_fire_at"),
            # Named queues only: a job of the default queue ('') costs this index nothing; the admin's
            # "(default)" filter reads the status ranges instead.
            models.Index(fields=["queue", "fire_at", "id"], name="cron_job_named_queue_fire_at", condition=~Q(queue="")),
            models.Index(fields=["fire_at", "id"], name="cron_job_recurring_fire_at", condition=~Q(schedule_type="once")),
            # Admin search by key (exact or prefix) over every job, live or finished.
            models.Index(fields=["key"], name="cron_job_key_prefix", opclasses=["varchar_pattern_ops"],
                         condition=Q(key__isnull=False)),
            # Retention: finished jobs by age (cron_purge walks it with a keyset cursor).
            models.Index(fields=["updated_at", "id"], name="cron_job_finished_updated",
                         condition=Q(status__in=["completed", "cancelled"])),
        ]
        permissions = [
            ("cancel_job", "Can cancel jobs"),
            ("requeue_job", "Can requeue failed jobs"),
            ("pause_job", "Can pause and resume recurring jobs"),
            ("run_job", "Can run jobs now"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["key"],
                name="cron_job_live_key",
                condition=Q(key__isnull=False) & Q(status__in=["pending", "in_progress", "paused"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task} [{self.schedule_type}] {self.id}"


class JobAttempt(models.Model):
    """One attempt of a job: one row per (job, attempt number), the attempt log.

    ``scheduled_at`` is the occurrence's fire time; ``dispatched_at``,
    ``started_at`` and ``finished_at`` come from the database clock, so
    ``started_at - scheduled_at`` is the firing lag.
    """

    id = models.BigAutoField(primary_key=True)
    # No database constraint: every attempt row is written by the statement that
    # locks or creates its job row, and the deferred check of 1,000 such rows cost
    # ~10% of a claim. Deletes still cascade (Django's collector; retention deletes
    # attempts first).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempt_log", db_index=False,
                            db_constraint=False)
    attempt = models.PositiveIntegerField()
    scheduled_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    locked_until = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True, db_default="")
    # The id of the start that runs this attempt: a start retried after a lost reply knows its own.
    run_token = models.UUIDField(null=True, blank=True)
    outcome = models.CharField(max_length=12, choices=Outcome.choices, db_default=Outcome.DISPATCHED)
    error = models.TextField(blank=True, db_default="")
    traceback = models.TextField(blank=True, db_default="")
    result = models.JSONField(null=True, blank=True, help_text="The task's return value, where kept (Django Tasks).")
    # Runs of this attempt's occurrence lost while running, before this attempt: the reaper's
    # re-fire limit, carried from attempt to attempt (the older rows may be trimmed away).
    occurrence_losses = models.IntegerField(db_default=0)
    # Runs of this attempt's occurrence lost before any worker started them, since the last one that
    # started: the re-fire's dispatch lease doubles per loss (carried like occurrence_losses).
    dispatch_losses = models.IntegerField(db_default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt"], name="cron_attempt_job_attempt"),
        ]
        # No index holds locked_until (a lease's end) or anything else a start or a heartbeat
        # changes: those updates stay HOT. The reaper reads the unfinished ones through the index
        # below, whose predicate is theirs (docs/indexes.md).
        indexes = [
            # The overlap check: is a run of this job unfinished? And the reaper's scan of the
            # unfinished attempts' leases.
            models.Index(fields=["job"], name="cron_attempt_open_job", condition=Q(finished_at__isnull=True)),
        ]

    @property
    def task_id(self) -> str:
        return task_id_for(self.job_id, self.attempt)

    def __str__(self) -> str:
        return f"{self.job_id} #{self.attempt} {self.outcome}"


def task_id_for(job_id, attempt: int) -> str:
    """Celery task id of attempt ``attempt`` of job ``job_id``: ``"<job uuid>:<attempt>"``."""
    return f"{job_id}:{attempt}"


class ShardLease(models.Model):
    """Which dispatcher owns shard ``shard`` until ``expires_at`` (database time).

    Leases only spread the work: two dispatchers claiming the same shard still
    never claim the same job (row locks), so a forged or stale lease is harmless.
    """

    shard = models.SmallIntegerField(primary_key=True)
    owner = models.CharField(max_length=200, blank=True, db_default="")
    expires_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"shard {self.shard}: {self.owner or '-'}"


class DispatcherHeartbeat(models.Model):
    """A running dispatcher: its name, when it last said so, and the shards it held then."""

    name = models.CharField(max_length=200, primary_key=True)
    last_seen = models.DateTimeField(db_default=Now())
    shards = models.JSONField(default=list)

    def __str__(self) -> str:
        return self.name


class WorkerHealth(models.Model):
    """A Celery worker's main process, as its watchdog last reported it (cron_at_scale.worker.health).

    Written every ``WORKER_HEARTBEAT_INTERVAL`` seconds by the worker itself (database clock);
    ``cron_status`` and the metrics read it. ``state``: ``ok``, ``stuck`` (messages wait in its
    queues, it has free pool slots and received nothing), ``recovering`` (its lost queue consumers
    were added back), ``exiting`` (it shuts down so that its supervisor restarts it), ``stopped``.
    """

    name = models.CharField(max_length=200, primary_key=True)  # Celery node name, e.g. w1@host
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.IntegerField(default=0)
    running = models.IntegerField(default=0)  # tasks executing in its pool at the last heartbeat
    received = models.BigIntegerField(default=0)  # task messages received since it started
    started_at = models.DateTimeField(db_default=Now())
    last_seen = models.DateTimeField(db_default=Now())
    last_received = models.DateTimeField(null=True)  # latest task message received (None: none yet)
    waiting = models.IntegerField(null=True)  # messages seen in its queues at its last check (None: not checked)
    state = models.CharField(max_length=20, default="ok")
    stuck_since = models.DateTimeField(null=True)
    stuck_count = models.IntegerField(default=0)  # stuck episodes of this process
    note = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return self.name


class JobHistory(models.Model):
    """A finished job moved out of the live table (:mod:`cron_at_scale.maintenance.archive`).

    A completed or cancelled job whose attempts have all finished leaves ``Job`` for this table
    ``HISTORY_AFTER`` seconds after it finished, with its attempts (:class:`AttemptHistory`), in
    one statement. The table is range-partitioned by ``archived_at`` (database clock), one
    partition per ``HISTORY_PARTITION`` seconds (a day by default), appended to and never updated;
    a partition goes whole, detached and dropped, once it is older than ``RETENTION``.

    The table has every column of ``cron_at_scale_job`` (after ``archived_at``, in the same order);
    this model names those the admin shows. Read-only: nothing writes it through the ORM.
    """

    archived_at = models.DateTimeField(help_text="When the job left the live table (UTC).")
    id = models.UUIDField(primary_key=True)  # the table's key is (id, archived_at): partitioned
    schedule_type = models.CharField(max_length=8, choices=ScheduleType.choices)
    fire_at = models.DateTimeField()
    cron_expr = models.CharField(max_length=200, blank=True)
    timezone = models.CharField(max_length=64)
    task = models.CharField(max_length=200)
    payload = models.JSONField(default=dict)
    queue = models.CharField(max_length=200, blank=True)
    options = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=12, choices=Status.choices)
    retries = models.PositiveIntegerField()
    max_retries = models.PositiveIntegerField(null=True)
    attempts = models.PositiveIntegerField()
    lost_attempts = models.PositiveIntegerField()
    key = models.CharField(max_length=255, null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "cron_at_scale_jobhistory"
        verbose_name = "finished job (history)"
        verbose_name_plural = "finished jobs (history)"

    def __str__(self) -> str:
        return f"{self.task} [{self.schedule_type}] {self.id} ({self.status})"


class AttemptHistory(models.Model):
    """A finished attempt moved out of the live attempt log with its job (see :class:`JobHistory`)."""

    archived_at = models.DateTimeField()
    id = models.BigIntegerField(primary_key=True)  # the table's key is (id, archived_at)
    job_id = models.UUIDField()
    attempt = models.PositiveIntegerField()
    scheduled_at = models.DateTimeField()
    dispatched_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    outcome = models.CharField(max_length=12, choices=Outcome.choices)
    error = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    result = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "cron_at_scale_attempthistory"
        verbose_name = "finished attempt (history)"
        verbose_name_plural = "finished attempts (history)"

    def __str__(self) -> str:
        return f"{self.job_id} #{self.attempt} {self.outcome}"
