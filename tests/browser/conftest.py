"""Headless Chromium (Debian's ``chromium`` package, driven by Playwright through
``executable_path``) against a real ``delayq web`` server and real Celery workers."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from acceptance.conftest import (  # noqa: F401 - fixtures reused as they are
    celery_env,
    producer,
    start_celery,
    start_worker,
)

from delayq_transport import DelayedQueue
from delayq_transport.web.security import WebConfig
from delayq_transport.web.server import BackgroundServer

CHROMIUM = os.environ.get("DELAYQ_CHROMIUM") or shutil.which("chromium") or \
    shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test module. Not for the session: Playwright's sync API keeps an asyncio
    loop running in the main thread while it is open, and Django refuses the ORM there
    (SynchronousOnlyOperation), so tests a pytest-xdist process runs after these would fail."""
    if not CHROMIUM:
        pytest.fail("chromium not found: apt-get install -y chromium (see .ci/run)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def web(database_url: str) -> Iterator[Callable[..., BackgroundServer]]:
    """Start ``delayq web`` on a free port for this test's database; stopped at teardown."""
    servers: list[BackgroundServer] = []
    queues: list[DelayedQueue] = []

    def start(**options: Any) -> BackgroundServer:
        queue = DelayedQueue(database_url, kind="celery")
        queues.append(queue)
        options.setdefault("refresh_s", 0)
        server = BackgroundServer(queue, WebConfig(port=0, **options)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
    for queue in queues:
        queue.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())  # the confirmations of actions
    page.set_default_timeout(15_000)
    yield page
    context.close()
