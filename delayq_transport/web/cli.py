"""``delayq web``: serve the page. Starlette/uvicorn are imported only when it runs, so the
rest of the CLI works without the ``web`` extra."""

from __future__ import annotations

import click

from ..commands import Context, console, register
from ..core.db import mask_password

DEFAULT_PORT = 8377


@click.command("web")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Bind address; anything but loopback requires --token or --basic-auth")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="Port to serve on")
@click.option("--token", envvar="DELAYQ_WEB_TOKEN", default=None,
              help="Require this token (Bearer, or as basic-auth password) (env: DELAYQ_WEB_TOKEN)")
@click.option("--basic-auth", envvar="DELAYQ_WEB_BASIC_AUTH", default=None, metavar="USER:PASS",
              help="Require basic auth (env: DELAYQ_WEB_BASIC_AUTH)")
@click.option("--read-only", is_flag=True, help="No cancel/reschedule/run-now/enable/disable")
@click.option("--hide-args", is_flag=True, help="Never show task arguments (personal data)")
@click.option("--refresh", default=3.0, show_default=True, type=click.FloatRange(0, 3600),
              help="Live refresh interval in seconds (0: off)")
@click.option("--result-backend", envvar="DELAYQ_RESULT_BACKEND", default=None, metavar="URL",
              help="The Celery app's result_backend (e.g. redis://host/1): task pages show "
                   "state, result and traceback (env: DELAYQ_RESULT_BACKEND)")
@click.pass_obj
def web_cmd(obj: Context, host: str, port: int, token: str | None, basic_auth: str | None,
            read_only: bool, hide_args: bool, refresh: float,
            result_backend: str | None) -> None:
    """Serve the task page and its JSON API (docs/how-to/manage-tasks.md)."""
    try:
        from .security import ConfigError, WebConfig
        from .server import serve
    except ImportError as exc:
        raise click.ClickException(
            f"{exc}: install the web extra: pip install 'delayq[web]'") from exc
    config = WebConfig(host=host, port=port, token=token, basic_auth=basic_auth,
                       read_only=read_only, hide_args=hide_args, refresh_s=refresh,
                       result_backend=result_backend)
    try:
        config.validate()
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    with obj.queue() as queue:
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        console.print(f"delayq web on http://{shown}:{port}/ ({obj.table} on "
                      f"{mask_password(queue.db.url)}"
                      f"{', read-only' if read_only else ''}"
                      f"{', arguments hidden' if hide_args else ''}); Ctrl-C stops it",
                      markup=False, highlight=False, soft_wrap=True)
        serve(queue, config)


register(web_cmd)
