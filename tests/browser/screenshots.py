"""Regenerate the screenshots of docs/how-to/manage-tasks.md (``python
tests/browser/screenshots.py``).

Fills a scratch database with a day of realistic tasks (three queues, a morning peak, a small
overdue backlog, a few in flight, two beat entries), serves ``delayq web`` on it and saves the
overview, task list and task pages from headless Chromium into docs/img/.
"""

from __future__ import annotations

import multiprocessing
import random
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import sync_playwright  # noqa: E402

from delayq_transport import DelayedQueue  # noqa: E402
from delayq_transport.formats.celery import encode, kind_for, task_message  # noqa: E402
from delayq_transport.web.security import WebConfig  # noqa: E402
from delayq_transport.web.server import BackgroundServer  # noqa: E402
from tests.conftest import create_database, drop_database  # noqa: E402

DB = "delayq_i12_screenshots"
CHROMIUM = shutil.which("chromium") or "chromium"


def fill(queue: DelayedQueue) -> str:
    rnd = random.Random(12)
    now = datetime.now(UTC)
    peak = (now + timedelta(hours=6)).replace(minute=0, second=0, microsecond=0)
    batches: dict[str, list[tuple[str, bytes, datetime]]] = {}

    def add(task: str, args: list, at: datetime, qname: str = "celery", prio: int = 0) -> str:
        msg = task_message(task, args, {}, eta=at, queue=qname, priority=prio)
        batches.setdefault(kind_for(qname, prio), []).append((msg["headers"]["id"], encode(msg),
                                                              at))
        return str(msg["headers"]["id"])

    for i in range(6000):  # reminders through the day, a peak six hours ahead: the fullest
        # bars hold more than the page counts (500), so they are drawn as hatched estimates
        at = now + timedelta(minutes=rnd.expovariate(1 / 300)) if i % 3 else \
            peak + timedelta(minutes=rnd.gauss(0, 40))
        add("billing.remind", [{"account": 1000 + i, "invoice": f"INV-{4000 + i}"}], at)
    for i in range(500):
        add("mail.send_digest", [f"user{i}@example.com"],
            now + timedelta(hours=rnd.uniform(0.2, 23.5)), "mail", 6 if i % 4 == 0 else 0)
    for i in range(60):
        add("reports.build", ["weekly", {"team": f"team-{i % 7}"}],
            now + timedelta(hours=2 + (i % 12) * 2, minutes=rnd.uniform(0, 5)), "reports")
    for i in range(25):
        add("mail.send_digest", [f"late{i}@example.com"],
            now - timedelta(seconds=rnd.uniform(1, 40)), "mail")
    shown = add("billing.remind", [{"account": 42, "invoice": "INV-0042"}],
                now + timedelta(hours=3, minutes=12))
    for kind, items in batches.items():
        queue.with_kind(kind).offer_batch(items)
    queue.with_kind("mail").try_poll_many(3)  # three in flight
    queue.db.execute("ANALYZE delayed_queue")  # the histogram the estimates come from
    return shown


class CardDeclined(Exception):
    """A payment gateway's refusal, for the dead letters of the screenshots."""


def charge(order: dict) -> None:
    raise CardDeclined(f"insufficient funds for order {order['order']}")


def render(context: dict) -> None:
    raise KeyError("first_name")


def fill_dead_letters(url: str) -> None:
    """Dramatiq messages that failed for good, through the broker's own nack."""
    from dramatiq.message import Message

    from delayq_transport.dramatiq import DelayqBroker

    failures = [("payments.charge", {"order": 1042}, charge),
                ("payments.charge", {"order": 1077}, charge),
                ("mail.render", {"template": "welcome"}, render)]
    broker = DelayqBroker(url=url)
    try:
        broker.declare_queue("default")
        for actor, arg, _ in failures:
            broker.enqueue(Message(queue_name="default", actor_name=actor, args=(arg,),
                                   kwargs={}, options={"retries": 5}))
        consumer = broker.consume("default", prefetch=len(failures), timeout=2000)
        for _ in failures:
            proxy = next(consumer)
            assert proxy is not None
            run = next(f for a, arg, f in failures if a == proxy.actor_name)
            try:
                run(proxy.args[0])
            except Exception as exc:  # noqa: BLE001 - what a worker would catch
                proxy.stuff_exception(exc)
            consumer.nack(proxy)
        consumer.close()
    finally:
        broker.close()


def poll_elsewhere(url: str) -> None:
    with DelayedQueue(url, kind="mail", ensure_schema=False) as q:
        q.try_poll_many(6)


def outcome_shots(queue: DelayedQueue, page: object, base: str, out: Path) -> None:
    """Dead letters, one dead letter, and the workers page (leases of fill())."""
    from delayq_transport.core.integrations import Bindings

    fill_dead_letters(queue.db.url)
    bindings = Bindings(queue.db, queue.queries)
    for name in ("celery", "mail", "reports"):
        bindings.bind(name, name, name, "", "direct", False)
    bindings.bind("celery.pidbox", "", "celery@web-1.celery.pidbox", "", "fanout", True)
    queue.with_kind("mail").try_poll_many(4)  # a second poll: two leases of one worker
    other = multiprocessing.get_context("fork").Process(target=poll_elsewhere,
                                                        args=(queue.db.url,))
    other.start()  # a forked process has a worker tag of its own
    other.join(30)
    goto = page.goto  # type: ignore[attr-defined]
    shot = page.screenshot  # type: ignore[attr-defined]
    goto(base + "/dead-letters")
    shot(path=str(out / "web-dead-letters.png"), full_page=True)
    page.locator("#dead-table tbody tr a").first.click()  # type: ignore[attr-defined]
    shot(path=str(out / "web-dead-letter.png"), full_page=True)
    goto(base + "/workers")
    page.locator("#workers summary").first.click()  # type: ignore[attr-defined]
    shot(path=str(out / "web-workers.png"), full_page=True)
    retry_shot(queue, page, out)


REDIS_URL = "redis://127.0.0.1:6379/14"


def retry_shot(queue: DelayedQueue, page: object, out: Path) -> None:
    """A Celery retry waiting, with the failure that caused it read from a Redis result
    backend (``delayq web --result-backend``)."""
    import redis
    from celery import Celery

    at = datetime.now(UTC) + timedelta(minutes=9)
    msg = task_message("billing.charge", [{"account": 42, "invoice": "INV-0042"}], {}, eta=at,
                       retries=2)
    task_id = str(msg["headers"]["id"])
    queue.with_kind("celery").offer(task_id, encode(msg), at)
    app = Celery("screens", backend=REDIS_URL, set_as_current=False)
    redis.Redis.from_url(REDIS_URL).flushdb()
    try:
        charge({"order": 42})
    except CardDeclined as exc:
        import traceback

        app.backend.store_result(task_id, exc, "RETRY",
                                 traceback="".join(traceback.format_exception(exc)))
    server = BackgroundServer(queue, WebConfig(port=0, refresh_s=0,
                                               result_backend=REDIS_URL)).start()
    try:
        page.goto(f"{server.url}/tasks/{task_id}")  # type: ignore[attr-defined]
        page.screenshot(path=str(out / "web-retry-outcome.png"),  # type: ignore[attr-defined]
                        full_page=True)
    finally:
        server.stop()
        redis.Redis.from_url(REDIS_URL).flushdb()
        app.close()


def main() -> None:
    drop_database(DB)
    url = create_database(DB)
    out = ROOT / "docs" / "img"
    try:
        with DelayedQueue(url, kind="celery") as queue:
            shown = fill(queue)
            server = BackgroundServer(queue, WebConfig(port=0, refresh_s=0)).start()
            try:
                with sync_playwright() as pw:
                    browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                    context = browser.new_context(viewport={"width": 1280, "height": 760},
                                                  timezone_id="Europe/Paris")
                    page = context.new_page()
                    page.goto(server.url + "/")
                    page.screenshot(path=str(out / "web-overview.png"), full_page=True)
                    page.goto(server.url + "/tasks?task=billing.*&q=INV-40")
                    page.locator("input.pick").nth(1).check()
                    page.locator("input.pick").nth(2).check()
                    page.screenshot(path=str(out / "web-tasks.png"))
                    page.check("#all-matching")
                    page.fill("#bulk-shift", "+2h")
                    page.click("#bulk-reschedule")
                    page.screenshot(path=str(out / "web-bulk-confirm.png"))
                    page.goto(f"{server.url}/tasks/{shown}")
                    page.screenshot(path=str(out / "web-task.png"), full_page=True)
                    outcome_shots(queue, page, server.url, out)
                    browser.close()
            finally:
                server.stop()
    finally:
        drop_database(DB)
    print("wrote", *(p.name for p in sorted(out.glob("web-*.png"))))


if __name__ == "__main__":
    main()
