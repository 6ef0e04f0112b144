"""The transport feeds the core's low watermark (issue 10): a row another process inserts below
the consumer's floor (an ETA already past) is announced by NOTIFY and delivered at once, and a
lost LISTEN session (announcements missed) makes the next poll scan from the bottom.

Consumers run with a 30 s fallback poll and a one-hour full rescan: a delivery within the few
seconds each test waits for it can only come from the NOTIFY lowering the floor, or from the
reset after a reconnect.
"""

from __future__ import annotations

from datetime import timedelta

from delayq_transport.formats import celery as msg

from .test_transport_wakeups import (
    SLOW_POLL_S,
    Connect,
    consuming,
    offer_task,
    queue_of,
    terminate_listen_backend,
)

pytest_plugins = ("_kombu_env",)
NO_RESCAN_S = 3600.0


def offer_past(q, name: str) -> None:  # type: ignore[no-untyped-def]
    payload = msg.encode(msg.task_message("t.wake", [name], task_id=name, queue=q.kind))
    q.offer(name, payload, q.now() - timedelta(seconds=60))


def test_a_row_due_in_the_past_is_delivered_through_notify(
    kombu_connect: Connect, kombu_db: str, kombu_table: str
) -> None:
    with kombu_connect(polling_interval=SLOW_POLL_S, full_rescan_interval=NO_RESCAN_S) as conn, \
            consuming(conn, "wm") as got, queue_of(kombu_db, kombu_table, "wm") as q:
        offer_task(q, "first")
        conn.drain_events(timeout=5)  # the floor is now above everything already taken
        offer_past(q, "late")
        conn.drain_events(timeout=3)  # bounded: the fallback poll would take 30 s
    assert [body[0] for _, body in got] == [["first"], ["late"]]


def test_missed_announcements_reset_the_floor(
    kombu_connect: Connect, kombu_db: str, kombu_table: str
) -> None:
    with kombu_connect(polling_interval=SLOW_POLL_S, full_rescan_interval=NO_RESCAN_S) as conn, \
            consuming(conn, "wm2") as got, queue_of(kombu_db, kombu_table, "wm2") as q:
        offer_task(q, "first")
        conn.drain_events(timeout=5)
        terminate_listen_backend(kombu_db, kombu_table)
        offer_past(q, "unheard")  # its NOTIFY reaches no one
        # Sees the dead LISTEN socket, reconnects, polls; bounded: the fallback poll would
        # take 30 s, a rescan an hour.
        conn.drain_events(timeout=3)
    assert [body[0] for _, body in got] == [["first"], ["unheard"]]
