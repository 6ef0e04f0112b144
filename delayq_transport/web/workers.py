"""Workers: the processes holding leases now (grouped by the worker tag that starts each lock
id, core/queue/leases.py), what they hold and until when, and the queues Celery workers
heartbeat."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..browse.service import iso
from ..core.integrations import DEFAULT_BINDING_TTL_S
from ..core.queue import LEASES_CAP, DelayedQueue, queues_seen, workers
from ..formats.celery import queue_of_kind
from .context import Guard, render, state

#: A queue whose consumers' heartbeat is older than this is shown as not consumed.
LIVE_MS = int(DEFAULT_BINDING_TTL_S * 1000)
PIDBOX_SUFFIX = ".celery.pidbox"


def queue_name(kind: str) -> str:
    """A kind's queue for display: Celery's priority suffix or Dramatiq's namespace removed."""
    from ..formats.dramatiq import queue_of_kind as dramatiq_queue

    parsed = dramatiq_queue(kind)
    return f"{parsed[0]} (Dramatiq)" if parsed else queue_of_kind(kind)[0]


def snapshot(queue: DelayedQueue) -> dict[str, Any]:
    """Workers from their leases, and the queues consumers declared with their heartbeat."""
    found, capped, now = workers(queue)
    seen = queues_seen(queue)
    return {
        "now": iso(now), "capped": capped, "cap": LEASES_CAP,
        "workers": [{
            "worker": w.tag, "rows": w.rows, "live": w.live, "lease_end": iso(w.lease_end_ms),
            "queues": sorted({queue_name(k) for k in w.kinds}),
            "leases": [{"lock": lease.lock, "kind": lease.kind, "queue": queue_name(lease.kind),
                        "rows": lease.rows, "lease_end": iso(lease.lease_max_ms),
                        "oldest_eta": iso(lease.oldest_eta_ms)} for lease in w.leases],
        } for w in found],
        "celery_workers": [{"name": s.queue[:-len(PIDBOX_SUFFIX)], "seen_at": iso(s.seen_at_ms),
                            "live": now - s.seen_at_ms < LIVE_MS}
                           for s in seen if s.auto_delete and s.queue.endswith(PIDBOX_SUFFIX)],
        "queues": [{"queue": s.queue, "seen_at": iso(s.seen_at_ms),
                    "consumed": now - s.seen_at_ms < LIVE_MS}
                   for s in seen if not s.auto_delete],
    }


async def workers_page(request: Request) -> Response:
    st = state(request)
    data = await st.call(snapshot, st.queue)
    return render(request, "workers.html", page_name="workers", data=data)


async def api_workers(request: Request) -> Response:
    st = state(request)
    return JSONResponse(await st.call(snapshot, st.queue))


def routes(guard: Guard) -> list[Route]:
    return [Route("/workers", workers_page), Route("/api/workers", api_workers)]
