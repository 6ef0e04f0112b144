"""Operator commands: ``delayq grants`` (least-privilege roles), ``delayq metrics`` and
``delayq uninstall``."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from ..commands import Context, console, register
from ..core.db import Database, mask_password
from ..core.queue import COUNT_CAP
from ..core.schema import (
    ROLE_PROFILES,
    UninstallPlan,
    UninstallRefused,
    grants_for,
    plan_uninstall,
    uninstall,
)
from ..output import emit, json_option


@click.command("grants")
@click.option("--role", required=True, help="The PostgreSQL role to grant to (quoted for you)")
@click.option("--as", "profile", required=True, type=click.Choice(sorted(ROLE_PROFILES)),
              help="admin: runs `delayq migrate` (DDL), owns the tables; worker: Celery "
                   "workers and beat; producer: publishes, and revokes a waiting task by id "
                   "(through the revoke function: no DELETE or UPDATE on the queue table); "
                   "monitor: status and metrics, read-only")
@click.option("--schema", default="public", show_default=True,
              help="Schema holding the delayq tables")
@click.pass_obj
def grants_cmd(obj: Context, role: str, profile: str, schema: str) -> None:
    """Print the GRANT statements a role needs (run them as the tables' owner). No DDL right
    is given to worker, producer or monitor: `delayq migrate` is the one step that needs it."""
    statements = grants_for(profile, table=obj.table, role=role, schema=schema)
    sys.stdout.write("\n".join(statements) + "\n")


@click.command("metrics")
@click.option("--serve", is_flag=True, help="Serve over HTTP until interrupted")
@click.option("--port", type=click.IntRange(0, 65535), default=9808, show_default=True,
              help="Port to serve on (0: any free port)")
@click.option("--addr", default="127.0.0.1", show_default=True,
              help="Address to bind (localhost by default: the figures name sessions)")
@click.option("--cap", type=click.IntRange(min=1), default=COUNT_CAP, show_default=True,
              help="Most rows each count reads")
@click.pass_obj
def metrics_cmd(obj: Context, serve: bool, port: int, addr: str, cap: int) -> None:
    """Prometheus metrics of the queue table: printed once, or served with --serve."""
    from ..metrics import render, serve_metrics  # prometheus_client only when asked for

    if not serve:
        with obj.queue() as queue:
            sys.stdout.write(render(queue, cap=cap).decode())
        return
    server = serve_metrics(obj.require_url(), table=obj.table, port=port, addr=addr, cap=cap)
    console.print(f"serving delayq metrics on {server.url}", highlight=False)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


@click.command("uninstall")
@click.option("--yes", is_flag=True,
              help="Drop the objects listed (without it: list them, change nothing)")
@click.option("--lock-timeout", default="5s", show_default=True,
              help="Longest wait for each table lock; sessions still using the tables "
                   "(workers, producers, beat, web) hold them: stop those first")
@json_option
@click.pass_obj
def uninstall_cmd(obj: Context, yes: bool, lock_timeout: str, as_json: bool) -> None:
    """List every object delayq created for --table (tables, indexes, triggers, sequence,
    functions, its ledger and beat rows; the shared tables once no other queue table is
    left); --yes drops them in one transaction. Nothing delayq did not create is dropped:
    uninstall refuses while another index or trigger sits on those tables."""
    with Database(obj.require_url(), max_size=1) as db:
        plan = plan_uninstall(db, obj.table)
        if as_json:
            emit({"table": plan.table, "drop": [vars(o) for o in plan.drop],
                  "foreign": [vars(o) for o in plan.foreign],
                  "kept_for_tables": plan.other_tables,
                  "dropped": bool(yes and not plan.foreign)})
        else:
            _print_plan(plan, mask_password(obj.require_url()))
        if plan.foreign:
            names = ", ".join(f"{o.kind} {o.name}" for o in plan.foreign)
            raise UninstallRefused(f"{names}: not created by delayq, would be dropped with "
                                   f"the tables of {obj.table}; drop or move them first")
        if not yes:
            if not as_json:
                console.print("dry run: nothing dropped; run again with --yes to drop the above")
            return
        uninstall(db, obj.table, lock_timeout=lock_timeout)
    if not as_json:
        console.print(f"dropped delayq's objects for {obj.table}")


def _print_plan(plan: UninstallPlan, where: str) -> None:
    view = Table(title=f"delayq objects of table {plan.table} on {where}")
    for column in ("kind", "name", "detail"):
        view.add_column(column, overflow="fold")  # on a terminal; one line per row elsewhere
    for item in plan.drop:
        view.add_row(item.kind, item.name, item.detail)
    for item in plan.foreign:
        view.add_row(item.kind, item.name, f"[red]NOT delayq's[/red]: {item.detail}")
    console.print(view)
    if plan.other_tables:
        console.print(f"kept: the shared tables, still used by {', '.join(plan.other_tables)}")
    console.print("kept: roles (delayq creates none) and the pg_trgm extension, if present "
                  "(the search index may have created it; other things may use it)")


register(grants_cmd)
register(metrics_cmd)
register(uninstall_cmd)
