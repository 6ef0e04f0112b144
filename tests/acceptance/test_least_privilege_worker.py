"""A real Celery round trip with DML-only roles (issue 10, part 6), plus the worker's metrics
endpoint (part 5): the schema is migrated by the admin (postgres), the worker and the producer
connect with the roles ``delayq grants`` describes and never attempt DDL."""

from __future__ import annotations

import socket
import urllib.request

from _celery_apps import close_connections
from _pg_roles import roles
from prometheus_client.parser import text_string_to_metric_families

from .celery_app import flaky, mark
from .conftest import broker_url, executions, wait_until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_apply_async_and_worker_with_dml_only_roles(database_url, producer, start_worker):
    with roles(database_url, "worker", "producer") as urls:
        port = _free_port()
        worker = start_worker(env={"DELAYQ_BROKER_URL": broker_url(urls["worker"]),
                                   "DELAYQ_METRICS_PORT": str(port)})
        producer.conf.broker_url = broker_url(urls["producer"])
        mark.apply_async(("now",))
        mark.apply_async(("later",), countdown=1)
        flaky.apply_async(("retried",), kwargs={"fail_times": 1, "countdown": 0.5})
        wait_until(lambda: {"mark", "flaky"} <= {r["name"] for r in executions(database_url)}
                   and len(executions(database_url, "mark")) == 2,
                   timeout=30, message="tasks published and run by DML-only roles")
        assert sorted(r["arg"] for r in executions(database_url, "mark")) == ['"later"', '"now"']
        samples = wait_until(lambda: _scrape(port), timeout=15, message="worker metrics")
        assert samples["delayq_up[('table', 'delayed_queue')]"] == 1.0
        assert "delayq_xmin_horizon_age_seconds[('table', 'delayed_queue')]" in samples
        log = worker.log()
        worker.stop()
        producer._pool and producer._pool.force_close_all()
    assert "permission denied" not in log.lower(), log[-3000:]


def test_control_revoke_of_a_waiting_task_under_each_role(database_url, producer):
    """``app.control.revoke`` as a web process calls it: under the producer role (no DELETE
    on the table) and the worker role the waiting task's row is gone when it returns; the
    read-only monitor role is refused and nothing is deleted."""
    from delayq_transport import DelayedQueue

    with roles(database_url, "producer", "worker", "monitor") as urls, \
            DelayedQueue(database_url, kind="celery") as admin:
        for profile in ("producer", "worker"):
            producer.conf.broker_url = broker_url(urls[profile])
            result = mark.apply_async((profile,), countdown=3600)
            kept = mark.apply_async((f"{profile} kept",), countdown=3600)
            assert admin.get(result.id) is not None
            producer.control.revoke(result.id)
            assert admin.get(result.id) is None, profile
            assert admin.get(kept.id) is not None, profile
            close_connections(producer)  # the next profile connects afresh
        producer.conf.broker_url = broker_url(urls["monitor"])
        doomed = admin.get(kept.id)
        try:
            producer.control.revoke(kept.id)
        except Exception as exc:  # the role may not publish the broadcast either
            assert "permission denied" in str(exc).lower(), exc
        else:
            raise AssertionError("the monitor role revoked a task")
        assert admin.get(kept.id) == doomed
        close_connections(producer)
