from __future__ import annotations

from .celery import app


@app.task(bind=True, max_retries=5)
def send_reminder(self, user_id: int) -> str:
    """Retries wait in PostgreSQL too: ``retry(countdown=...)`` replaces the task's row."""
    if user_id < 0:
        raise self.retry(countdown=30)
    return f"reminded user {user_id}"
