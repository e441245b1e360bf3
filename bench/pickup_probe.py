"""Timestamps of a job's hops for ``bench/pickup.py``, recorded by the processes it starts.

Imported by the benchmark's ``celery worker`` (``--include bench.pickup_probe``) and by its
dispatcher (``bench/pickup.py --role dispatcher``). With ``PICKUP_PROBE_DIR`` set, each process
appends ``hop job_id time`` lines (``time.time()``: this host's clock, every process on this host)
to a file of its own there; unset, it records nothing and changes nothing. The hooks are Celery's
signals and wrappers around the product's methods, installed here: no product code measures.
"""

from __future__ import annotations

import functools
import os
import time

from celery import shared_task
from celery.signals import task_prerun, task_received

DIR = os.environ.get("PICKUP_PROBE_DIR")
_files: dict[int, object] = {}


def record(hop: str, job_ids, at: float | None = None) -> None:
    """Append one line per job id of ``job_ids`` (``at``: by default now, this host's clock)."""
    if not DIR:
        return
    at = time.time() if at is None else at
    f = _files.get(os.getpid())
    if f is None:  # one file per process (a pool child opens its own after the fork)
        f = _files[os.getpid()] = open(os.path.join(DIR, f"{os.getpid()}.log"), "a", buffering=1)  # noqa: SIM115
    f.write("".join(f"{hop} {j} {at:.6f}\n" for j in job_ids))


def _job_id(request) -> str | None:
    from cron_at_scale.broker.message import HEADER
    from cron_at_scale.worker.task import job_header

    if getattr(request, "task", None) == PLAIN or getattr(request, "name", None) == PLAIN:
        return str(request.id)  # a plain Celery task: its task id stands for the job
    meta = job_header(request)
    if meta is None:
        meta = (getattr(request, "request_dict", None) or {}).get(HEADER)
    return str(meta["job_id"]) if isinstance(meta, dict) else None


PLAIN = "bench.pickup_plain"


@shared_task(name=PLAIN, ignore_result=True, bind=True)
def pickup_plain(self) -> None:
    """The baseline's task, sent with Celery's ``send_task`` (``bench/pickup.py --plain``): records
    that its body ran, under its task id."""
    record("body", [self.request.id])


@shared_task(name="bench.pickup", ignore_result=True)
def pickup() -> None:
    """The benchmark's task: records that its body ran."""
    from cron_at_scale.worker import current_job

    job = current_job()
    if job is not None:
        record("body", [job.job_id])


if DIR:
    @task_received.connect(weak=False)
    def _received(sender=None, request=None, **_kw):  # the worker's parent: the message in hand
        job = _job_id(request)
        if job:
            record("received", [job])

    @task_prerun.connect(weak=False)
    def _prerun(sender=None, task=None, **_kw):  # the pool child: Celery's trace starts it
        job = _job_id(task.request)
        if job:
            record("prerun", [job])

    from cron_at_scale.worker.attempts import BatchCompleter

    _start = BatchCompleter.start

    @functools.wraps(_start)
    def _timed_start(self, job_id, *args, **kwargs):  # the start statement (synchronous commit) returned
        row = _start(self, job_id, *args, **kwargs)
        record("started", [job_id])
        return row

    BatchCompleter.start = _timed_start  # type: ignore[method-assign]

    from cron_at_scale.worker import attempts as _attempts

    _write_many = _attempts.write_many

    @functools.wraps(_write_many)
    def _timed_write_many(messages, worker):  # BATCH_STARTS: the main process's batch start returned
        rows = _write_many(messages, worker)
        record("started", [m[0] for m in messages])
        return rows

    _attempts.write_many = _timed_write_many


def install_dispatcher_probes() -> None:
    """In the dispatcher's process: the wake-up (NOTIFY received), the claim's commit, the publish."""
    from cron_at_scale.broker.publish import Publisher
    from cron_at_scale.dispatcher.loop import Dispatcher
    from cron_at_scale.dispatcher.wakeup import Wakeup

    state = {"woke": None}
    wait, claim, publish = Wakeup.wait, Dispatcher.claim, Publisher.publish

    @functools.wraps(wait)
    def _wait(self, timeout, stop_event=None):
        woke = wait(self, timeout, stop_event)
        if woke:
            state["woke"] = time.time()
        return woke

    @functools.wraps(claim)
    def _claim(self):
        t0 = time.time()
        runs = claim(self)  # its transaction committed on return
        ids = [str(r.job_id) for r in runs]
        if ids:
            record("claim_start", ids, t0)
            record("claimed", ids)
            if state["woke"] is not None:
                record("woke", ids, state["woke"])
        state["woke"] = None  # a later claim without a wake-up of its own: a poll, or more due
        return runs

    @functools.wraps(publish)
    def _publish(self, batch):
        n = publish(self, batch)
        record("published", [str(r.job_id) for r in batch])
        return n

    Wakeup.wait, Dispatcher.claim, Publisher.publish = _wait, _claim, _publish  # type: ignore[method-assign]

    # the loop's other work, which a wake-up waits behind: ``loop <name> <ms>`` lines
    from cron_at_scale.dispatcher.backpressure import QueueGate
    from cron_at_scale.dispatcher.shards import ShardLeases
    from cron_at_scale.maintenance.loop import Loop

    for cls, name, label in ((QueueGate, "refresh", "queue_check"), (Dispatcher, "look_ahead", "preload_look"),
                             (ShardLeases, "refresh", "shard_refresh"), (Loop, "maybe_run", "maintenance")):
        setattr(cls, name, _spanned(getattr(cls, name), label))


def _spanned(fn, label: str):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            ms = (time.time() - t0) * 1000
            if ms >= 0.5:  # only the calls that did work
                record("loop", [label], ms)
    return timed
