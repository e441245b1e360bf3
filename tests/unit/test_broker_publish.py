"""The sender: a few runs, with nothing queued, go out on the caller's thread; a large batch, or
any batch behind one still being published, goes through the sender's thread, in order."""

from __future__ import annotations

import threading

from cron_at_scale.broker.publish import Sender


class Recording:
    """Stands in for the broker publisher: records each batch and the thread that sent it; a batch
    waits for ``gate`` while it is cleared."""

    def __init__(self) -> None:
        self.sent: list[tuple[list, int]] = []
        self.gate = threading.Event()
        self.gate.set()

    def publish(self, runs: list) -> int:
        self.gate.wait(10)
        self.sent.append((list(runs), threading.get_ident()))
        return len(runs)


def test_a_few_runs_with_the_sender_idle_go_out_on_the_callers_thread():
    pub = Recording()
    counted: list[int] = []
    sender = Sender(pub, lambda n, _s: counted.append(n), inline_max=3)
    sender.send([1, 2, 3])
    assert pub.sent == [([1, 2, 3], threading.get_ident())]  # published before send returned
    assert sender.thread is None  # no thread for it
    assert counted == [3]
    sender.close()


def test_a_large_batch_goes_to_the_thread_and_a_small_one_behind_it_keeps_its_place():
    pub = Recording()
    sender = Sender(pub, lambda n, _s: None, inline_max=3)
    pub.gate.clear()  # the large batch is held in the publish
    sender.send(list(range(10)))
    sender.send([100])  # small, but a batch is still being published: queued behind it
    assert pub.sent == []
    pub.gate.set()
    sender.wait()
    assert [runs for runs, _ in pub.sent] == [list(range(10)), [100]]
    assert {ident for _, ident in pub.sent} == {sender.thread.ident} != {threading.get_ident()}
    sender.send([7])  # idle again: on this thread
    assert pub.sent[-1] == ([7], threading.get_ident())
    sender.close()


def test_a_failed_inline_publish_is_logged_and_left_to_the_reaper(caplog):
    class Failing:
        def publish(self, runs):
            raise ConnectionError("broker away")

    sender = Sender(Failing(), lambda n, _s: None, retry_for=0.0, inline_max=3)
    sender.send([1])  # does not raise: the claimed runs' leases expire and the reaper fires them
    assert "the reaper will re-fire them" in caplog.text
    sender.close()
