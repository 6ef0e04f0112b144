"""delayq's pages in the Django admin: waiting tasks, task results, dead letters and periodic
entries, each with its actions, read and changed through delayq's services (the ones behind
``delayq tasks`` and ``delayq web``), never through the ORM.

* **Reads** are the services' bounded reads: keyset pages over an index (never OFFSET), no
  count of a table (the pages show no totals, and "Next" carries a cursor), filters the index
  cannot answer read a bounded slice per page and say so. A page costs the same at 5M waiting
  rows as at 50 (tests/djtasks/test_admin_at_size.py).
* **Actions** are the services' actions (delayq's named statements): a row a worker holds is
  never changed, and each selected row is reported done or why not.
* **Permissions** are Django's, on the app's models (:mod:`.models`): ``view`` to see a page;
  the actions as :data:`ACTIONS` says, ``change`` for what runs a task (again), ``delete`` for
  what drops one. Superusers have all of them.
* **Where**: the queue table of :func:`~delayq_transport.django.target.target` (the delayq
  ``TASKS`` backend ``default``, or the first of them, else ``DELAYQ_DATABASE`` and
  ``DELAYQ_TABLE``), read on delayq's own connections to that database, never a replica a
  database router would pick.

A page is three things: an unmanaged model (:mod:`.models`, its permissions), a
:class:`ServiceAdmin` subclass (``listing``, ``detail``, ``perform`` over a service) and its
entry in :data:`ACTIONS`; queues' pause and limits (:class:`QueueControlAdmin`) are one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from ...browse import TaskFilter, TaskNotFound, TaskService, decode_cursor, encode_cursor
from ...browse.beat import beat_entries, set_beat_enabled
from ...browse.controls import QueueControls, limit_changes
from ...browse.deadletters import DeadLetterService
from ...browse.failures import FailureService, exception_of
from ...browse.filters import STATES
from ...browse.service import iso, kept_kind
from ...core import DelayedQueue, DelayqError, TaskResults
from ...formats.django_tasks import KIND_PREFIX, result_truth
from ..target import target
from .models import DeadLetter, PeriodicEntry, QueueControl, Result, Task

log = logging.getLogger(__name__)

#: Rows per page.
PAGE = 100
#: Every action of every page: (label, the permission it needs, what the confirmation says).
ACTIONS: dict[str, dict[str, tuple[str, str, str]]] = {
    "task": {"run_now": ("Run now", "change", "Make the selected tasks due now?"),
             "cancel": ("Cancel", "delete", "Cancel the selected tasks? They will not run.")},
    "result": {"retry": ("Retry", "change", "Run the selected failed tasks once more, now?"),
               "discard": ("Discard", "delete", "Delete the selected results?")},
    "deadletter": {"retry": ("Retry (requeue)", "change",
                             "Requeue the selected messages, retries reset?"),
                   "discard": ("Discard", "delete", "Delete the selected dead letters?")},
    "periodicentry": {"enable": ("Enable", "change", "Enable the selected entries?"),
                      "disable": ("Disable", "change", "Disable the selected entries?")},
    "queuecontrol": {"pause": ("Pause", "change", "Pause the selected queues on every worker?"),
                     "resume": ("Resume", "change", "Resume the selected queues?"),
                     "limit": ("Set the limits given", "change",
                               "Set the limits given on the selected queues?")},
}
#: The results' "finished" filter: label -> how far back.
SINCE = {"past hour": timedelta(hours=1), "past 24 hours": timedelta(days=1),
         "past 7 days": timedelta(days=7)}


@dataclass
class Choice:
    label: str
    url: str
    selected: bool


@dataclass
class Filter:
    title: str
    choices: list[Choice]


@dataclass
class Row:
    ident: str
    cells: list[Any]
    link: str | None = None


@dataclass
class Listing:
    """What a list page shows (the template is the same for all four)."""

    columns: list[str]
    rows: list[Row]
    filters: list[Filter] = field(default_factory=list)
    inputs: list[tuple[str, str, str]] = field(default_factory=list)  # (name, label, value)
    next_url: str | None = None
    note: str = ""
    empty: str = "Nothing here."
    #: Fields the actions read (name, label), sent with the selected rows.
    action_inputs: list[tuple[str, str]] = field(default_factory=list)


def when(ms_or_iso: int | str | None) -> str:
    """A time as the pages show it: UTC, to the second."""
    if ms_or_iso is None or ms_or_iso == "":
        return "–"
    text = iso(ms_or_iso) if isinstance(ms_or_iso, int) else str(ms_or_iso)
    return (text or "")[:19].replace("T", " ") + " UTC"


class ServiceAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A page of delayq's over one of its services (the module docstring): the list, one
    item, and a POST endpoint for the actions; Django's add, change and delete views are not
    used."""

    list_template = "delayq_admin/change_list.html"
    detail_template = "delayq_admin/detail.html"

    # -- what a subclass gives ----------------------------------------------------------

    def listing(self, request: HttpRequest, queue: DelayedQueue) -> Listing:
        raise NotImplementedError

    def detail(self, queue: DelayedQueue, ident: str) -> dict[str, Any]:
        """``{"title", "fields": [(name, value)], "traceback"?}`` of one item."""
        raise NotImplementedError

    def perform(self, queue: DelayedQueue, action: str, ident: str) -> str:
        """Do ``action`` on one item; returns what was done (raises DelayqError when not)."""
        raise NotImplementedError

    def perform_posted(self, request: HttpRequest, queue: DelayedQueue, action: str,
                       ident: str) -> str:
        """:meth:`perform`, for an action that also reads the listing's ``action_inputs``."""
        return self.perform(queue, action, ident)

    # -- Django's admin -------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.list_view), name="{}_{}_changelist".format(*info)),
            path("act/", wrap(self.act_view), name="{}_{}_act".format(*info)),
            path("<path:object_id>/change/", wrap(self.detail_view),
                 name="{}_{}_change".format(*info)),
        ]

    def url(self, name: str, *args: str) -> str:
        return reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_{name}",
                       args=args, current_app=self.admin_site.name)

    def allowed(self, request: HttpRequest) -> dict[str, tuple[str, str, str]]:
        """The actions this user may take here."""
        checks: dict[str, Callable[[HttpRequest], bool]] = {
            "change": self.has_change_permission, "delete": self.has_delete_permission}
        return {name: spec for name, spec in ACTIONS[str(self.opts.model_name)].items()
                if checks[spec[1]](request)}

    def context(self, request: HttpRequest, **extra: Any) -> dict[str, Any]:
        where = target()
        return {**self.admin_site.each_context(request), "opts": self.opts,
                "app_label": self.opts.app_label, "actions": self.allowed(request),
                "changelist_url": self.url("changelist"), "act_url": self.url("act"),
                "where": f"table {where.table} of DATABASES[{where.database!r}]", **extra}

    # -- the views ------------------------------------------------------------------------

    def list_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            listing = self.listing(request, target().queue())
        except DelayqError as exc:
            listing = Listing([], [], empty=f"delayq could not read its tables: {exc}")
        return TemplateResponse(request, self.list_template, self.context(
            request, title=str(self.opts.verbose_name_plural).capitalize(), listing=listing,
            query=request.GET.urlencode()))

    def detail_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            item = self.detail(target().queue(), object_id)
        except DelayqError as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(self.url("changelist"))
        item["fields"] = [(name, _shown(value)) for name, value in item["fields"]]
        context = self.context(request, title=item["title"], item=item, ident=object_id)
        if "actions" in item:  # what this one item allows (a successful result: nothing)
            context["actions"] = {k: v for k, v in context["actions"].items()
                                  if k in item["actions"]}
        return TemplateResponse(request, self.detail_template, context)

    def act_view(self, request: HttpRequest) -> HttpResponse:
        """An action on the selected items (a list's checkboxes, or one item's button)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        action = request.POST.get("action", "")
        spec = ACTIONS[str(self.opts.model_name)].get(action)
        if spec is None:
            messages.error(request, f"no action {action!r} here")
        elif action not in self.allowed(request):
            raise PermissionDenied
        else:
            self._apply(request, action, spec[0], request.POST.getlist("ids"))
        back = request.POST.get("query", "")
        return HttpResponseRedirect(self.url("changelist") + (f"?{back}" if back else ""))

    def _apply(self, request: HttpRequest, action: str, label: str, ids: list[str]) -> None:
        if not ids:
            messages.warning(request, "Select at least one item.")
            return
        queue = target().queue()
        done, refused = [], []
        for ident in ids[:PAGE]:
            try:
                done.append(self.perform_posted(request, queue, action, ident))
            except DelayqError as exc:
                refused.append(str(exc))
        log.info("delayq admin: %s (user %s) %s %d of %d: %s", request.user,
                 getattr(request.user, "pk", None), action, len(done), len(ids), ids[:PAGE])
        if done:
            messages.success(request, f"{label}: {len(done)} done. " + " · ".join(done[:5]))
        for reason in refused[:10]:
            messages.warning(request, f"{label} refused: {reason}")


def _page_url(request: HttpRequest, **changes: str | None) -> str:
    """The list's URL with these query parameters changed (None: removed), cursor reset."""
    params = {k: v for k, v in request.GET.items() if k not in ("cursor", *changes)}
    params.update({k: v for k, v in changes.items() if v})
    return "?" + urlencode(params) if params else "?"


def _choices(request: HttpRequest, name: str, options: list[tuple[str, str | None]]
             ) -> list[Choice]:
    current = request.GET.get(name) or None
    return [Choice(label, _page_url(request, **{name: value}), current == value)
            for label, value in options]


def _next(request: HttpRequest, cursor: str | None) -> str | None:
    if not cursor:
        return None
    return "?" + urlencode({**{k: v for k, v in request.GET.items() if k != "cursor"},
                            "cursor": cursor})


@admin.register(Task)
class TaskAdmin(ServiceAdmin):
    """Waiting tasks of every front end, by ETA (``delayq tasks list``)."""

    def listing(self, request: HttpRequest, queue: DelayedQueue) -> Listing:
        svc = TaskService(queue)
        g = request.GET
        f = TaskFilter.parse(g.get("kind"), g.get("task"), g.get("state"), text=g.get("q"))
        kinds = [k for k in svc.kinds() if not kept_kind(k)]  # dead letters: their own page
        page = svc.list_page(f, decode_cursor(g.get("cursor")), PAGE,
                             None if f.queue else kinds)
        rows = [Row(str(v.row.id), [
            v.message.task if v.message and v.message.task else "(message)",
            v.row.kind, when(d["eta"]).removesuffix(" UTC"),
            d["state"].replace("_", " ") + (" · redelivered" if d["redelivered"] else ""),
            _short(d["key"]), d["args_preview"]], self.url("change", str(v.row.id)))
            for v in page.items for d in [v.as_dict()]]
        return Listing(
            ["task", "queue (kind)", "ETA (UTC)", "state", "task id", "arguments"], rows,
            [Filter("state", _choices(request, "state", [("All", None)] + [
                (s.replace("_", " "), s) for s in STATES])),
             Filter("queue (kind)", _choices(request, "kind", [("All", None)] + [
                 (k, k) for k in kinds]))],
            [("task", "task (glob)", g.get("task", "")), ("q", "arguments contain",
                                                            g.get("q", ""))],
            _next(request, encode_cursor(*page.next_cursor) if page.next_cursor else None),
            f"Scanned {page.scanned:,} rows and stopped before the page was full: more may "
            "match further on (Next)." if page.partial else "",
            "No waiting task matches." if f.narrows else "No waiting task.")

    def detail(self, queue: DelayedQueue, ident: str) -> dict[str, Any]:
        d = TaskService(queue).find(ident).as_dict(full=True)
        message = d.pop("message") or {}
        fields = [(k, d[k]) for k in ("id", "key", "queue", "priority", "kind", "state",
                                      "redelivered", "eta", "scheduled_at", "created_at",
                                      "lease")]
        fields += [(f"message {k}", message.get(k)) for k in ("format", "task", "args",
                                                               "kwargs", "retries", "expires")]
        return {"title": f"{message.get('task') or 'task'} {d['key']}", "fields": fields,
                "ident": str(d["id"])}

    def perform(self, queue: DelayedQueue, action: str, ident: str) -> str:
        svc = TaskService(queue)
        done = svc.run_now(ident) if action == "run_now" else svc.cancel(ident)
        return done.detail


@admin.register(Result)
class ResultAdmin(ServiceAdmin):
    """Finished results of ``django.tasks`` tasks, newest first."""

    def listing(self, request: HttpRequest, queue: DelayedQueue) -> Listing:
        g = request.GET
        since = SINCE.get(g.get("finished") or "")
        since_ms = None if since is None else int(
            (datetime.now(UTC) - since).timestamp() * 1000)
        page = FailureService(queue).results_page(
            g.get("status") or None, g.get("queue") or None, g.get("task") or None, since_ms,
            g.get("cursor"), PAGE)
        rows = [Row(s.id, [s.task.get("task"), s.task.get("queue"), _status(s.status),
                           when(s.finished_at_ms), s.attempts,
                           exception_of(s.last_error) if s.status == "FAILED" else "",
                           _short(s.id)],
                    self.url("change", s.id)) for s in page.items]
        queues = sorted(set(target().queues) | {str(s.task.get("queue")) for s in page.items})
        return Listing(
            ["task", "queue", "status", "finished", "attempts", "exception", "result id"], rows,
            [Filter("status", _choices(request, "status", [
                ("All", None), ("successful", "SUCCESSFUL"), ("failed", "FAILED")])),
             Filter("queue", _choices(request, "queue", [("All", None)] + [
                 (q, q) for q in queues])),
             Filter("finished", _choices(request, "finished", [("Any date", None)] + [
                 (label, label) for label in SINCE]))],
            [("task", "task (glob)", g.get("task", ""))],
            _next(request, page.next_cursor),
            "Read a slice of the results without filling the page: more may match (Next)."
            if page.partial else "",
            "No result matches." if any(g.get(k) for k in ("status", "queue", "task",
                                                           "finished"))
            else "No finished result (results are kept RESULT_RETENTION after they finish).")

    def detail(self, queue: DelayedQueue, ident: str) -> dict[str, Any]:
        stored = TaskResults(queue, KIND_PREFIX).get(ident)
        if stored is None or stored.status is None:
            raise TaskNotFound(f"no result {ident!r}: pruned, discarded, or not run yet")
        t = stored.task
        status, shown_errors = result_truth(stored)  # READY, interrupted, while nothing runs it
        fields = [("id", ident), ("task", t.get("task")), ("queue", t.get("queue")),
                  ("priority", t.get("priority")), ("status", status),
                  ("args", t.get("args")), ("kwargs", t.get("kwargs")),
                  ("enqueued", when(stored.enqueued_at_ms)),
                  ("started", when(stored.started_at_ms)),
                  ("last attempt", when(stored.last_attempted_at_ms)),
                  ("finished", when(stored.finished_at_ms)),
                  ("attempts", len(stored.worker_ids)), ("workers", stored.worker_ids),
                  ("return value", stored.return_value),
                  ("waiting again", "yes" if stored.queued else "no")]
        errors = [(f"attempt error {i}: {e['exception_class_path']}", e["traceback"])
                  for i, e in enumerate(shown_errors, 1)]
        return {"title": f"{t.get('task')} {ident}", "fields": fields, "tracebacks": errors,
                "ident": ident,
                "actions": ["retry", "discard"] if stored.status == "FAILED" else []}

    def perform(self, queue: DelayedQueue, action: str, ident: str) -> str:
        svc = FailureService(queue)
        if action == "retry":
            svc.failure(ident)  # a failed result only: a waiting task is the tasks page's
            return svc.retry(ident).detail
        return svc.discard(ident).detail


def _short(key: str) -> Any:
    """A long task id cut for a list (the whole id in its title)."""
    if len(key) <= 14:
        return key
    return format_html('<span title="{}">{}…</span>', key, key[:13])


def _shown(value: Any) -> str:
    """A field's value as the detail page shows it: JSON for what JSON holds."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str, ensure_ascii=False)
    return "–" if value is None else str(value)


def _status(status: str) -> Any:
    return format_html('<span class="delayq-status delayq-{}">{}</span>', status.lower(),
                       status)


@admin.register(DeadLetter)
class DeadLetterAdmin(ServiceAdmin):
    """Every front end's dead letters (formats/deadletters.py), newest first."""

    def listing(self, request: HttpRequest, queue: DelayedQueue) -> Listing:
        svc = DeadLetterService(queue)
        g = request.GET
        page = svc.list_page(g.get("queue") or None, decode_cursor(g.get("cursor")), PAGE)
        rows = [Row(str(d["id"]), [d["actor"], f"{d['front_end']}: {d['queue']}",
                                   when(d["failed_at"]), d["retries"], d["exception"],
                                   when(d["kept_until"])],
                    self.url("change", str(d["id"])))
                for d in (x.as_dict() for x in page.items)]
        counts = [(f"{q['queue']} ({q['dead_letters']:,}{'+' if q['capped'] else ''})",
                   q["queue"]) for q in svc.queues()]
        return Listing(
            ["task", "queue", "failed", "retries", "exception", "kept until"], rows,
            [Filter("queue", _choices(request, "queue", [("All", None), *counts]))],
            next_url=_next(request, encode_cursor(*page.next_cursor) if page.next_cursor
                           else None),
            empty="No dead letter. A Dramatiq message lands here after its last retry, a "
                  "Celery message when it is rejected without requeue.")

    def detail(self, queue: DelayedQueue, ident: str) -> dict[str, Any]:
        d = DeadLetterService(queue).find(ident).as_dict(full=True)
        fields = [(k, d[k]) for k in ("id", "front_end", "queue", "kind", "actor", "message_id",
                                      "failed_at", "kept_until", "retries", "exception",
                                      "args", "kwargs", "options")]
        return {"title": f"{d['actor']} {d['message_id']}", "fields": fields,
                "tracebacks": [("traceback", d["traceback"])] if d["traceback"] else [],
                "ident": str(d["id"])}

    def perform(self, queue: DelayedQueue, action: str, ident: str) -> str:
        svc = DeadLetterService(queue)
        done = svc.requeue(ident) if action == "retry" else svc.delete(ident)
        return str(done["detail"])


@admin.register(PeriodicEntry)
class PeriodicEntryAdmin(ServiceAdmin):
    """Every periodic entry the scheduling engine knows and its next occurrences."""

    def listing(self, request: HttpRequest, queue: DelayedQueue) -> Listing:
        entries = beat_entries(queue)
        rows = [Row(e["name"], [e["name"], e["origin"], "yes" if e["enabled"] else "no",
                                e["task"], e["schedule"], e["queue"],
                                " · ".join(when(n) for n in e["next"])],
                    self.url("change", e["name"])) for e in entries]
        return Listing(
            ["name", "origin", "enabled", "task", "schedule", "queue", "next occurrences"],
            rows, note="An occurrence's row is also on the waiting tasks page (run it now or "
            "cancel it there). Enable and disable take effect at the schedulers' next refresh.",
            empty="No periodic entry (none stored, and no scheduler installed any).")

    def detail(self, queue: DelayedQueue, ident: str) -> dict[str, Any]:
        found = [e for e in beat_entries(queue) if e["name"] == ident]
        if not found:
            raise TaskNotFound(f"no periodic entry {ident!r}")
        e = found[0]
        return {"title": f"periodic entry {ident}", "fields": list(e.items()), "ident": ident}

    def perform(self, queue: DelayedQueue, action: str, ident: str) -> str:
        return set_beat_enabled(queue, ident, action == "enable")


@admin.register(QueueControl)
class QueueControlAdmin(ServiceAdmin):
    """Queues paused or limited for every worker, and the queues that could be
    (``delayq queues``): ``change`` pauses, resumes and sets limits."""

    #: The limit fields of the action form; empty leaves a limit, "none" removes it.
    LIMITS = [("concurrency", "concurrency"), ("rate", "rate (50/s)"),
              ("key_concurrency", "per key: concurrency"), ("key_rate", "per key: rate")]

    def listing(self, request: HttpRequest, queue: DelayedQueue) -> Listing:
        controls = QueueControls(queue)
        shown = {v.use.control.name: v.as_dict() for v in controls.list()}
        names = sorted(set(shown) | controls.plain_names())
        rows = [Row(n, [n, *self._cells(shown.get(n))], self.url("change", n)) for n in names]
        return Listing(
            ["queue", "paused", "concurrency", "in use", "rate", "per key: concurrency",
             "per key: rate"], rows, action_inputs=self.LIMITS,
            note="A limit holds for every worker of every host; a change reaches them within "
                 "a second. Leave a field empty to keep that limit, 'none' removes it.",
            empty="No queue: no task is stored and no consumer declared one.")

    @staticmethod
    def _cells(c: dict[str, Any] | None) -> list[Any]:
        if c is None:
            return ["no", "–", "–", "–", "–", "–"]
        return ["yes" if c["paused"] else "no", c["concurrency"], c["in_use"], c["rate"],
                c["key_concurrency"], c["key_rate"]]

    def detail(self, queue: DelayedQueue, ident: str) -> dict[str, Any]:
        found = [v.as_dict() for v in QueueControls(queue).list() if v.use.control.name == ident]
        fields = list(found[0].items()) if found else [("queue", ident), ("paused", False)]
        return {"title": f"queue {ident}", "fields": fields, "ident": ident}

    def perform_posted(self, request: HttpRequest, queue: DelayedQueue, action: str,
                       ident: str) -> str:
        controls = QueueControls(queue)
        if action == "pause":
            return f"{controls.pause(ident).name} paused"
        if action == "resume":
            return f"{controls.resume(ident).name} resumed"
        return f"{controls.limit(ident, **limit_changes(request.POST.dict())).name} limited"
