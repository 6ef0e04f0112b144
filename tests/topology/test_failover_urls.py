"""Every entry point starts on each way of naming a primary and its standbys (issue 26).

``celery worker`` and ``celery beat`` exited at start on libpq's multi-host URL: kombu's banner
(``Connection.as_uri``) parsed it with HTTP rules (``Port could not be cast to integer value as
'5451,127.0.0.1:5452'``). Here each form names a dead port first and the shared server second,
and for each: a worker, a beat (``delayq_beat.Scheduler``), a Dramatiq worker, ``delayq web``
and ``delayq status`` start, print the URL with its password masked, and a task, a beat tick
and a Dramatiq message go through.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from delayq_transport.dramatiq import DelayqBroker

from .clusters import free_port, wait_for
from .conftest import SECRET
from .services import Service, beat_args, executions, process_env, worker_args

pytestmark = pytest.mark.timeout(120)

#: Nothing listens there: a connection is refused at once.
DEAD_PORT = 1
TICK = {"tick": {"task": "celery_app.mark", "schedule": 1.0, "args": ["tick"]}}


def forms(database_url: str) -> dict[str, str]:
    """The three spellings, each with the dead port first (and the password to hide)."""
    live = urlsplit(database_url)
    host, port, db = live.hostname, live.port or 5432, live.path
    user = f"postgres:{SECRET}"
    return {
        "comma": f"delayq+postgresql://{user}@{host}:{DEAD_PORT},{host}:{port}{db}"
                 "?target_session_attrs=read-write",
        "query": f"delayq+postgresql://{user}@{db}?host={host},{host}&port={DEAD_PORT},{port}"
                 "&target_session_attrs=read-write",
        "kombu": f"delayq+postgresql://{user}@{host}:{DEAD_PORT}{db};"
                 f"delayq+postgresql://{user}@{host}:{port}{db}",
    }


#: What the masked URL of each form must show: its dead host too (the kombu form may be shown
#: as given or, outside kombu, as the libpq multi-host URL it becomes).
SHOWN = {"comma": re.compile(rf"127\.0\.0\.1:{DEAD_PORT},127\.0\.0\.1:"),
         "query": re.compile(rf"port={DEAD_PORT},"),
         "kombu": re.compile(rf"127\.0\.0\.1:{DEAD_PORT}[,/]")}


def assert_masked(service: Service, form: str) -> None:
    out = service.log()
    assert SECRET not in out, f"password printed by {service.args[2:4]}:\n{out[-2000:]}"
    lines = [line for line in out.splitlines() if SHOWN[form].search(line)]
    assert lines, f"no masked URL in the output of {service.args[2:4]}:\n{out[-2000:]}"
    assert any("postgres:**" in line for line in lines), lines


@pytest.mark.parametrize("form", ["comma", "query", "kombu"])
def test_every_entry_point_starts_on_the_failover_url(
        form: str, results_url: str, start_service: Callable[..., Service],
        make_producer: Callable[..., object]) -> None:
    url = forms(results_url)[form]
    env = process_env(DELAYQ_BROKER_URL=url, DELAYQ_DATABASE_URL=url,
                      DELAYQ_RESULTS_URL=results_url, BEAT_SCHEDULE=json.dumps(TICK),
                      DELAYQ_TRANSPORT_OPTIONS=json.dumps({"polling_interval": 1}))
    web_port = free_port()
    # Started together: each spends seconds importing.
    worker = start_service("worker", *worker_args("urls"), env=env)
    beat = start_service("beat", *beat_args(), env=env)
    dramatiq = start_service("dramatiq", "dramatiq", "topology_dramatiq", "--processes", "1",
                             "--threads", "1", env=env)
    web = start_service("web", "delayq_transport", "web", "--port", str(web_port), env=env)
    status = start_service("status", "delayq_transport", "status", env=env)

    assert status.proc.wait(timeout=60) == 0, status.log()
    assert_masked(status, form)
    worker.wait_for_log("ready.")
    assert_masked(worker, form)  # the banner's transport line
    beat.wait_for_log("delayq beat: refreshed")
    assert_masked(beat, form)  # the banner's broker line
    dramatiq.wait_for_log("is ready for action")
    assert_masked(dramatiq, form)
    web.wait_for_log("Ctrl-C stops it")
    assert_masked(web, form)

    producer = make_producer(url)
    sent = producer.send_task("celery_app.mark", args=[f"through-{form}"])
    sender = DelayqBroker(url=url)
    try:
        sender.declare_queue("topology")
        sender.enqueue(_dramatiq_message(f"dramatiq-{form}"))
    finally:
        sender.close()
    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/", timeout=30) as page:
        assert page.status == 200

    def ran() -> bool:
        names = {(r["name"], r["arg"]) for r in executions(results_url)}
        return {("mark", json.dumps(f"through-{form}")), ("mark", json.dumps("tick")),
                ("dramatiq", f"dramatiq-{form}")} <= names

    wait_for(ran, "a task, a beat tick and a Dramatiq message to run", timeout=60)
    assert [r["task_id"] for r in executions(results_url, "mark")
            if r["arg"] == json.dumps(f"through-{form}")] == [sent.id]


def _dramatiq_message(tag: str) -> object:
    from dramatiq.message import Message

    return Message(queue_name="topology", actor_name="note", args=(tag,), kwargs={},
                   options={})
