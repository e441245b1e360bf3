"""The dispatcher's sender thread: the run loop's batches are published off the claiming thread."""

from __future__ import annotations

import logging

import pytest
from demo.tasks import noop
from helpers import RecordingPublisher

import cron_at_scale
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import JobAttempt

pytestmark = pytest.mark.django_db


def queued(app, queue: str = "celery") -> int:
    with app.connection_for_write() as conn:
        return conn.default_channel.client.llen(queue)


def test_the_loop_publishes_on_its_sender_and_close_publishes_what_is_queued(broker):
    cron_at_scale.schedule_many([{"task": noop.name, "args": [i]} for i in range(2_500)])
    d = Dispatcher(name="s", shards="all", batch_size=500, app=broker)
    claimed = 0
    while n := d.step(wait=False):  # as run() does: each batch handed to the sender
        claimed += n
    d.close()  # waits for the sender
    assert claimed == 2_500 == d.published_total
    assert queued(broker) == 2_500
    assert d.sender.thread is None


def test_a_broker_blip_is_retried_and_every_batch_goes_out(broker, monkeypatch):
    cron_at_scale.schedule_many([{"task": noop.name, "args": [i]} for i in range(300)])
    calls = []

    def flaky(batch):
        calls.append(len(batch))
        if len(calls) <= 2:
            raise ConnectionError("broker restarting")

    d = Dispatcher(name="s", shards="all", batch_size=100, app=broker,
                   publisher=RecordingPublisher(broker, send=True, fail=flaky))
    while d.step(wait=False):
        pass
    d.close()
    assert calls[0] == calls[1] == calls[2] and sum(calls[2:]) == 300  # the first batch three times
    assert queued(broker) == 300 == d.published_total


def test_a_batch_that_fails_for_half_its_lease_is_logged_and_the_next_ones_go_out(broker, monkeypatch, caplog):
    cron_at_scale.schedule_many([{"task": noop.name, "args": [i]} for i in range(300)])
    calls = []

    def down_for_a_while(batch):
        calls.append(batch[0].job_id)
        if batch[0].job_id == calls[0]:  # the first batch, every time: its retries run out after 0.5 s
            raise ConnectionError("broker down")

    d = Dispatcher(name="s", shards="all", batch_size=100, app=broker, lease=1.0, lookahead=0,
                   publisher=RecordingPublisher(broker, send=True, fail=down_for_a_while))
    with caplog.at_level(logging.ERROR, logger="cron_at_scale.broker.publish"):
        while d.step(wait=False):
            pass
        d.close()
    assert "publishing 100 claimed jobs failed; the reaper will re-fire them" in caplog.text
    assert queued(broker) == 200 == d.published_total
    # the unsent batch stays claimed under its dispatch lease: the reaper fires it again
    assert JobAttempt.objects.filter(outcome="dispatched", started_at__isnull=True).count() == 300
