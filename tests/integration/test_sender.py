"""The dispatcher's sender thread: the run loop's batches are published off the claiming thread."""

from __future__ import annotations

import logging

import pytest
from demo.tasks import noop

import cron_at_scale
from cron_at_scale.dispatcher import Dispatcher
from cron_at_scale.models import JobAttempt
from cron_at_scale.publish import Publisher

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


def test_a_batch_that_fails_to_publish_is_logged_and_the_next_ones_go_out(broker, monkeypatch, caplog):
    cron_at_scale.schedule_many([{"task": noop.name, "args": [i]} for i in range(300)])
    real = Publisher.publish
    calls = []

    def flaky(self, batch):
        calls.append(len(batch))
        if len(calls) == 1:
            raise ConnectionError("broker down")
        return real(self, batch)

    monkeypatch.setattr(Publisher, "publish", flaky)
    d = Dispatcher(name="s", shards="all", batch_size=100, app=broker)
    with caplog.at_level(logging.ERROR, logger="cron_at_scale.publish"):
        while d.step(wait=False):
            pass
        d.close()
    assert calls == [100, 100, 100]
    assert "publishing 100 claimed jobs failed; the reaper will re-fire them" in caplog.text
    assert queued(broker) == 200 == d.published_total
    # the unsent batch stays claimed under its dispatch lease: the reaper fires it again
    assert JobAttempt.objects.filter(outcome="dispatched", started_at__isnull=True).count() == 300
