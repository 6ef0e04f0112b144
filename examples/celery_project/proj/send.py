"""Publish a few countdown tasks; they wait in the delayed_queue table, not in the worker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from .tasks import send_reminder

if __name__ == "__main__":
    for user_id in range(5):
        send_reminder.apply_async((user_id,), countdown=10 * (user_id + 1))
    send_reminder.apply_async((99,), eta=datetime.now(UTC) + timedelta(minutes=1))
    print("6 tasks scheduled: see them with `delayq status`")
