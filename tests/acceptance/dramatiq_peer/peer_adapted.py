"""Dramatiq tests adapted to a broker whose delivery is asynchronous (copied in as
``test_delayq_adapted.py``): each replaces a test of Dramatiq's own that the runner deselects
(``REPLACED`` in tests/acceptance/test_dramatiq_peer.py, docs/contributing.md), keeping what the
test is named for and changing only the step that assumed a send lands in the worker's memory
at once."""

from __future__ import annotations

import time

import dramatiq

#: Bounded wait for sent messages to reach a worker (they arrive within milliseconds).
DELIVERY_TIMEOUT_S = 10.0


def test_workers_process_messages_in_order(stub_broker) -> None:  # type: ignore[no-untyped-def]
    """tests/test_worker.py::test_workers_process_messages_in_order, except that it waits for
    the five messages to be in the paused worker's work queue rather than counting them 1 ms
    after the last send: they reach it after their commit, a wake-up and the consumer's next
    poll (at most one per 20 ms). Then, as upstream: one worker thread takes them in order."""
    results = []

    @dramatiq.actor()
    def _do_work(value):  # type: ignore[no-untyped-def]
        results.append(value)

    stub_worker = dramatiq.worker.Worker(stub_broker, worker_threads=1)
    stub_worker.queue_prefetch = 10
    stub_worker.start()
    try:
        for worker_thread in stub_worker.workers:
            worker_thread.pause()
            worker_thread.paused_event.wait()
        for i in range(5):
            _do_work.send(i)
            time.sleep(0.001)
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while stub_worker.work_queue.qsize() < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert stub_worker.work_queue.qsize() == 5
        stub_worker.resume()
        stub_broker.join(queue_name=_do_work.queue_name)
    finally:
        stub_worker.stop()
    assert results == [0, 1, 2, 3, 4]
