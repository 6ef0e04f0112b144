"""Operator commands: ``delayq grants`` (least-privilege roles) and ``delayq metrics``."""

from __future__ import annotations

import sys

import click

from ..core.counts import COUNT_CAP
from ..core.grants import ROLE_PROFILES, grants_for
from .main import Context, console, register


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


register(grants_cmd)
register(metrics_cmd)
