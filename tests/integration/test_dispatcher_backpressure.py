"""Back-pressure per destination queue, in process, against PostgreSQL and the suite's broker
(Redis): a queue that is full or that no live worker consumes keeps its jobs pending, with no
attempt, while the other queues' jobs are claimed; routes by task name decide an empty queue column."""

from __future__ import annotations

import json

import demo.tasks  # noqa: F401 (registers the demo's shared tasks)
import pytest
from celery import Celery
from django.test import override_settings
from helpers import sql, wait_until
from kombu import Queue

import cron_at_scale
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.dispatcher.backpressure import NO_CONSUMER, QueueGate, destination
from cron_at_scale.ops import metrics, status

pytestmark = pytest.mark.django_db(transaction=True)

HOLD = {"HOLD_UNCONSUMED_QUEUES": True}


@pytest.fixture(autouse=True)
def empty_queues(broker):
    """This module's queues, emptied before and after (the broker fixture empties only ``celery``)."""
    def drop():
        with broker.connection_for_write() as conn:
            for name in ("busy", "idle", "live", "dead", "routed", "a", "b", "paced", "unpaced"):
                conn.default_channel.queue_purge(name)
    drop()
    yield
    drop()


def live_worker(name: str, queues: list[str]) -> None:
    """A live worker's health row, as its watchdog writes it."""
    sql("INSERT INTO cron_at_scale_workerhealth (name, pid, queues, concurrency, running, received, started_at, "
        "last_seen, state, stuck_count, note) VALUES (%s, 1, %s::jsonb, 1, 0, 0, now(), now(), 'ok', 0, '')",
        [name, json.dumps(queues)])


def routed_app(broker) -> Celery:
    """The suite's Celery configuration, with demo.tasks.noop routed to queue ``routed``."""
    app = Celery("cas_routes_tests", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.broker_url = broker.conf.broker_url
    app.conf.task_routes = {"demo.tasks.noop": {"queue": "routed"}}
    app.conf.task_queues = [Queue("celery"), Queue("routed")]
    assert "demo.tasks.noop" in app.tasks  # shared tasks: every app has them
    return app


def attempts() -> int:
    return sql("SELECT count(*) FROM cron_at_scale_jobattempt")[0][0]


def claimed_queues(batch) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in batch:
        out[c.queue or c.task] = out.get(c.queue or c.task, 0) + 1
    return out


def test_destination_follows_the_publishers_routes(broker):
    app = routed_app(broker)
    assert destination(app, "demo.tasks.record", "") == "celery"  # the default queue
    assert destination(app, "demo.tasks.noop", "") == "routed"  # the task's route
    assert destination(app, "demo.tasks.noop", "other") == "other"  # a job's queue beats the route


@override_settings(CRON_AT_SCALE=HOLD)
def test_a_queue_nobody_consumes_keeps_its_jobs_pending_while_the_others_fire(broker):
    live = [cron_at_scale.schedule("demo.tasks.record", queue="live") for _ in range(3)]
    dead = [cron_at_scale.schedule("demo.tasks.record", queue="dead") for _ in range(4)]
    live_worker("w1@h", ["live"])
    d = Dispatcher(name="d1", batch_size=100)
    try:
        batch = d.claim()  # both queues first seen in this batch: checked before it commits
        assert sorted(str(c.job_id) for c in batch) == sorted(str(j.id) for j in live)
        assert attempts() == 3, "a job of the unconsumed queue got an attempt"
        assert d.queues.states["dead"].state == NO_CONSUMER and d.queues.states["dead"].held
        assert d.queues.claim_params()["held_queues"] == ["dead"]
        assert d.claim() == []
        assert sql("SELECT count(*) FROM cron_at_scale_job WHERE queue = 'dead' AND status = 'pending' "
                   "AND attempts = 0")[0][0] == 4
        # A worker comes for it: at the next check (once a second) its jobs fire.
        live_worker("w2@h", ["dead"])
        d.queues.refresh(now=float("inf"))
        batch = d.claim()
        assert sorted(str(c.job_id) for c in batch) == sorted(str(j.id) for j in dead)
    finally:
        d.close()


@override_settings(CRON_AT_SCALE=HOLD)
def test_an_empty_queue_column_is_held_by_the_route_of_its_task(broker):
    app = routed_app(broker)
    routed = [cron_at_scale.schedule("demo.tasks.noop") for _ in range(2)]  # -> routed
    plain = [cron_at_scale.schedule("demo.tasks.record") for _ in range(2)]  # -> celery
    live_worker("w1@h", ["celery"])
    d = Dispatcher(name="d1", batch_size=100, app=app)
    try:
        assert sorted(str(c.job_id) for c in d.claim()) == sorted(str(j.id) for j in plain)
        assert d.queues.claim_params() == {"held_queues": ["routed"], "held_blank": False,
                                           "blank_tasks": ["demo.tasks.noop"]}
        # The other way round: the default queue is held, the routed one consumed.
        sql("DELETE FROM cron_at_scale_workerhealth")
        live_worker("w2@h", ["routed"])
        late = [cron_at_scale.schedule("demo.tasks.record") for _ in range(2)]
        d.queues.refresh(now=float("inf"))
        params = d.queues.claim_params()
        assert params["held_blank"] and params["blank_tasks"] == ["demo.tasks.noop"], params
        assert sorted(str(c.job_id) for c in d.claim()) == sorted(str(j.id) for j in routed)
        assert {str(j.id) for j in late} == {str(i) for (i,) in sql(
            "SELECT id FROM cron_at_scale_job WHERE status = 'pending'")}
    finally:
        d.close()


@override_settings(CRON_AT_SCALE={"MAX_BROKER_DEPTH": 5, "HOLD_UNCONSUMED_QUEUES": False})
def test_a_full_queue_holds_its_jobs_and_the_others_keep_firing(broker):
    # "busy" holds 6 messages (over 5): full. "idle" is empty. Nobody consumes either, but
    # HOLD_UNCONSUMED_QUEUES is off here: depth alone decides.
    from cron_at_scale.broker.publish import publish_batch

    filler = [cron_at_scale.schedule("demo.tasks.noop", queue="busy") for _ in range(6)]
    d = Dispatcher(name="d1", batch_size=100)
    try:
        publish_batch(broker, d.claim())
        assert len(filler) == 6
        more = [cron_at_scale.schedule("demo.tasks.noop", queue="busy") for _ in range(3)]
        idle = [cron_at_scale.schedule("demo.tasks.noop", queue="idle") for _ in range(3)]
        d.queues.refresh(now=float("inf"))
        assert d.queues.states["busy"].state == "full" and d.queues.states["busy"].depth == 6
        assert sorted(str(c.job_id) for c in d.claim()) == sorted(str(j.id) for j in idle)
        assert {str(j.id) for j in more} == {str(i) for (i,) in sql(
            "SELECT id FROM cron_at_scale_job WHERE status = 'pending'")}
        shown = {q["queue"]: q for q in status.snapshot().queues}
        assert shown["busy"]["state"] == "full" and shown["busy"]["held"] and shown["busy"]["depth"] == 6
        scrape = metrics.render().decode()
        assert 'cron_queue_held{queue="busy",state="full"} 1.0' in scrape, scrape
        assert 'cron_queue_messages{queue="busy"} 6.0' in scrape, scrape
    finally:
        d.close()


def test_the_gate_checks_each_queue_at_most_once_a_second(broker, monkeypatch):
    gate = QueueGate(broker, 100, True)
    looked: list[list[str]] = []
    real = gate.probe.look
    monkeypatch.setattr(gate.probe, "look", lambda names: looked.append(list(names)) or real(names))
    try:
        gate.destination("demo.tasks.noop", "a")
        gate.destination("demo.tasks.noop", "b")
        gate.refresh(now=100.0)
        gate.refresh(now=100.5)
        gate.refresh(now=100.99)
        gate.refresh(now=101.0)
        assert [sorted(x) for x in looked] == [["a", "b", "celery"], ["a", "b", "celery"]]
    finally:
        gate.close()


def test_a_queue_is_paced_to_what_its_consumers_drain(broker):
    """MAX_QUEUE_WAIT: a queue holds at most what its consumers take in that many seconds (their pace
    measured from its depth between checks); runs claimed for it count at once; a queue nobody
    consumes is never paced (HOLD_UNCONSUMED_QUEUES decides)."""
    import types

    import redis

    r = redis.Redis.from_url(broker.conf.broker_url)
    live_worker("w@h", ["paced"])
    gate = QueueGate(broker, 10**6, True, max_wait=2.0, on_pace=metrics.observe_pace)
    gate.hold_unconsumed = False
    gate.probe.hold_unconsumed = False
    try:
        for q in ("paced", "unpaced"):
            gate.destination("demo.tasks.noop", q)
            r.lpush(q, *[b"m"] * 40)
        gate.refresh(now=100.0)  # depth 40 each; no pace measured yet: nothing held
        assert not gate.held("paced") and gate.allowance("paced") == float("inf")
        r.rpop("paced", 10)  # its consumer took 10 in a second: 20 may wait (2 s of it), 30 do
        r.rpop("unpaced", 40)
        r.lpush("unpaced", *[b"m"] * 40)
        gate.refresh(now=101.0)
        assert gate.drain["paced"] == 10 and gate.states["paced"].state == "paced" and gate.held("paced")
        assert "paced" in gate.claim_params()["held_queues"]
        scrape = metrics.render().decode()
        assert 'cron_queue_paced{queue="paced"} 1.0' in scrape and 'cron_queue_drain_rate{queue="paced"} 10.0' in scrape
        assert not gate.held("unpaced")  # drained 40 too, but nobody consumes it per the health rows
        r.rpop("paced", 15)  # 15/s now (12.5/s smoothed: 25 may wait); 15 do
        gate.refresh(now=102.0)
        assert gate.drain["paced"] == 12.5 and not gate.held("paced")
        assert gate.claim_limit(1000) == 10  # a claim takes no more than the room left in it
        gate.note([types.SimpleNamespace(task="demo.tasks.noop", queue="paced")] * 9)
        assert not gate.held("paced")
        gate.note([types.SimpleNamespace(task="demo.tasks.noop", queue="paced")])
        assert gate.held("paced") and "paced" in gate.claim_params()["held_queues"]  # before the next check
    finally:
        gate.close()


def test_a_running_gate_rechecks_on_its_own_thread_and_the_loop_never_waits_for_the_broker(broker, monkeypatch):
    """start(): a queue's first check is made on the loop (its verdict before any claim for it), its
    re-checks on the gate's thread; refresh() hands them over and takes the verdicts in later."""
    import threading

    import redis

    r = redis.Redis.from_url(broker.conf.broker_url)
    gate = QueueGate(broker, 5, True)
    looked: list[tuple[str, list[str]]] = []
    release = threading.Event()
    real_first, real_again = gate.probe.look, gate.thread_probe.look

    def first(names):
        looked.append((threading.current_thread().name, sorted(names)))
        return real_first(names)

    def again(names):
        looked.append((threading.current_thread().name, sorted(names)))
        release.wait(10)  # a broker that takes its time
        return real_again(names)

    monkeypatch.setattr(gate.probe, "look", first)
    monkeypatch.setattr(gate.thread_probe, "look", again)
    live_worker("w@h", ["busy"])
    try:
        gate.start()
        gate.destination("demo.tasks.noop", "busy")
        gate.refresh(now=100.0)
        assert looked == [(threading.current_thread().name, ["busy", "celery"])]
        assert gate.states["busy"].state == "ok" and not gate.held("busy")
        r.lpush("busy", *[b"m"] * 6)  # full (over 5) from now on
        assert gate.refresh(now=101.0) == []  # handed over: no verdict yet, and no wait for it
        wait_until(lambda: len(looked) == 2, timeout=10, interval=0.01, what="the thread's re-check")
        assert looked[1] == ("cron_at_scale-queues", ["busy", "celery"])
        assert gate.refresh(now=101.5) == [] and not gate.held("busy")  # one question out at a time
        assert len(looked) == 2
        release.set()
        changed: list = []

        def taken_in() -> bool:
            changed.extend(gate.refresh(now=101.9))
            return bool(changed)

        wait_until(taken_in, timeout=10, interval=0.01, what="the re-check's verdict")
        assert [s.queue for s in changed] == ["busy"] and gate.held("busy") and gate.states["busy"].state == "full"
        assert "busy" in gate.claim_params()["held_queues"]
    finally:
        release.set()
        gate.close()
    assert not any(t.name == "cron_at_scale-queues" for t in threading.enumerate())  # close() ended it


def test_a_recheck_on_the_thread_counts_only_the_runs_claimed_before_it(broker, monkeypatch):
    """Pacing measures a queue's drain from its depth at two checks and the runs claimed between
    them: runs claimed while a re-check is out are counted for the next one, not this one."""
    import threading
    import types

    import redis

    r = redis.Redis.from_url(broker.conf.broker_url)
    live_worker("w@h", ["paced"])
    gate = QueueGate(broker, 10**6, False, max_wait=2.0)
    release = threading.Event()
    real = gate.thread_probe.look
    monkeypatch.setattr(gate.thread_probe, "look", lambda names: release.wait(10) and real(names))
    try:
        gate.start()
        gate.destination("demo.tasks.noop", "paced")
        r.lpush("paced", *[b"m"] * 40)
        gate.refresh(now=100.0)  # first check, on the loop: depth 40
        r.rpop("paced", 10)  # its consumer takes 10 in a second
        gate.refresh(now=101.0)  # the re-check goes out
        gate.note([types.SimpleNamespace(task="demo.tasks.noop", queue="paced")] * 5)  # claimed after it
        release.set()
        wait_until(lambda: gate.refresh(now=101.2) != [] or "paced" in gate.drain, timeout=10, interval=0.01,
                   what="the re-check's verdict")
        assert gate.drain["paced"] == 10  # (40 + 0 - 30) / 1 s, not (40 + 5 - 30)
        assert gate._sent == {"paced": 5}  # the 5 claimed since count toward the next check
    finally:
        release.set()
        gate.close()


def test_a_check_without_an_answer_keeps_a_held_queue_held(broker, monkeypatch):
    """A database blip (the workers' health rows unreadable: consumers unknown on Redis) or a broker
    blip (no answer at all) during a re-check must not release a queue held for having no consumer:
    its jobs would get attempts and wait in a queue nobody reads. A real answer releases it."""
    import redis

    from cron_at_scale.dispatcher import backpressure

    r = redis.Redis.from_url(broker.conf.broker_url)
    gate = QueueGate(broker, 5, True)
    try:
        gate.destination("demo.tasks.noop", "dead")
        gate.refresh(now=100.0)
        assert gate.held("dead") and gate.states["dead"].state == NO_CONSUMER
        monkeypatch.setattr(backpressure, "live_worker_queues", lambda: None)  # the database restarting
        assert gate.refresh(now=101.0) == [] and gate.held("dead")
        assert "dead" in gate.claim_params()["held_queues"]
        monkeypatch.undo()
        monkeypatch.setattr(gate.probe, "_declare", lambda name: 1 / 0)  # the broker not answering
        assert gate.refresh(now=102.0) == [] and gate.held("dead")
        monkeypatch.undo()
        live_worker("w@h", ["dead"])  # a consumer comes: a real answer releases it
        assert [s.queue for s in gate.refresh(now=103.0)] == ["dead"] and not gate.held("dead")
        monkeypatch.setattr(backpressure, "live_worker_queues", lambda: None)
        gate.refresh(now=104.0)  # unknown now, and never held for it
        assert gate.states["dead"].state == "unknown" and not gate.held("dead")
        r.lpush("dead", *[b"m"] * 6)  # over MAX_BROKER_DEPTH: full is known without the health rows
        gate.refresh(now=105.0)
        assert gate.states["dead"].state == "full" and gate.held("dead")
    finally:
        gate.close()
