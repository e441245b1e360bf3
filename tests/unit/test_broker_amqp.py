"""Publisher-confirm bookkeeping of the RabbitMQ fast path (cron_at_scale.broker.amqp.Confirms).

RabbitMQ decides how it groups its acks (``multiple``) and in which order; these feed the
sequences it may send, including ones a test broker will not produce on demand: out of order,
repeated, and none at all (a confirm that never comes).
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from cron_at_scale.broker.amqp import Confirms, NotConfirmed


class Channel:
    def __init__(self):
        self.events = defaultdict(set)


class Connection:
    """Delivers the queued (event, tag, multiple) frames one per drain_events; then times out."""

    def __init__(self, channel, frames):
        self.channel, self.frames = channel, list(frames)

    def drain_events(self, timeout=None):
        if not self.frames:
            raise TimeoutError
        event, *args = self.frames.pop(0)
        for callback in self.channel.events[event]:
            callback(*args)


def published(n: int):
    channel = Channel()
    confirms = Confirms(channel)
    confirms.next_tag += n
    return channel, confirms


@pytest.mark.parametrize("frames", [
    [("basic_ack", 5, True)],
    [("basic_ack", 2, True), ("basic_ack", 5, True)],
    [("basic_ack", 4, False), ("basic_ack", 5, False), ("basic_ack", 1, False), ("basic_ack", 3, True)],
    [("basic_ack", 3, False), ("basic_ack", 3, False), ("basic_ack", 5, True), ("basic_ack", 2, True)],
])
def test_every_message_acked_in_any_grouping_or_order_settles_the_batch(frames):
    channel, confirms = published(5)
    confirms.wait(Connection(channel, frames), timeout=1)
    assert confirms.low == 6 and not confirms.singles


def test_a_nack_among_acks_fails_the_batch_and_counts_the_nacked():
    channel, confirms = published(5)
    frames = [("basic_ack", 1, False), ("basic_nack", 3, True), ("basic_ack", 5, True)]
    with pytest.raises(NotConfirmed, match="2 messages nacked, 0 returned, 0 not confirmed"):
        confirms.wait(Connection(channel, frames), timeout=1)


def test_a_returned_message_fails_the_batch_though_it_was_acked():
    channel, confirms = published(2)
    frames = [("basic_return", "NO_ROUTE", "x", "nowhere", None), ("basic_ack", 2, True)]
    with pytest.raises(NotConfirmed, match="1 returned .*NO_ROUTE"):
        confirms.wait(Connection(channel, frames), timeout=1)


def test_confirms_that_never_come_fail_the_batch():
    channel, confirms = published(4)
    with pytest.raises(NotConfirmed, match="2 not confirmed"):
        confirms.wait(Connection(channel, [("basic_ack", 1, True), ("basic_ack", 3, False)]), timeout=1)


def test_the_next_batch_starts_clean_after_a_settled_one():
    channel, confirms = published(2)
    confirms.wait(Connection(channel, [("basic_ack", 2, True)]), timeout=1)
    confirms.next_tag += 3
    confirms.wait(Connection(channel, [("basic_ack", 4, True), ("basic_ack", 5, False)]), timeout=1)
    assert confirms.low == 6
