"""Who may use the page and how: bind address, credentials, CSRF, read-only, hidden arguments.

* Bound to 127.0.0.1 by default; any other address needs credentials (a token, or a basic-auth
  user:password), else the server refuses to start.
* With credentials, every request needs them: ``Authorization: Bearer TOKEN``, or basic auth
  (any user name with the token as password, or the configured user:password) so a browser's
  own login prompt works.
* State changes are POST/DELETE only, and need the CSRF token (form field ``csrf_token`` or
  header ``X-CSRF-Token``; ``GET /api/csrf`` returns it) unless they carry a Bearer token, which
  a browser never adds by itself. A cross-origin ``Origin`` header is refused outright.
* The Host header must name the bound address (or localhost) when bound to loopback, which stops
  DNS-rebinding pages from reading the CSRF token.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.requests import Request

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


class ConfigError(ValueError):
    """The web server's options are unsafe or inconsistent."""


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class WebConfig:
    host: str = "127.0.0.1"
    port: int = 8377
    token: str | None = None
    basic_auth: str | None = None  # "user:password"
    read_only: bool = False
    hide_args: bool = False
    refresh_s: float = 3.0
    result_backend: str | None = None  # Celery's result_backend URL: the task page's outcomes
    csrf_secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def validate(self) -> WebConfig:
        if self.basic_auth is not None and ":" not in self.basic_auth:
            raise ConfigError("basic auth must be USER:PASSWORD")
        for secret in (self.token, self.basic_auth):
            if secret is not None and len(secret) < 8:
                raise ConfigError("credentials must be at least 8 characters")
        if not is_loopback(self.host) and not self.has_credentials:
            raise ConfigError(
                f"refusing to serve on {self.host} without credentials: pass --token or "
                "--basic-auth (or DELAYQ_WEB_TOKEN / DELAYQ_WEB_BASIC_AUTH), or bind 127.0.0.1")
        return self

    @property
    def has_credentials(self) -> bool:
        return bool(self.token or self.basic_auth)

    def allowed_hosts(self) -> list[str]:
        if not is_loopback(self.host):
            return ["*"]
        return sorted(LOOPBACK_NAMES | {self.host})


def _eq(a: str, b: str | None) -> bool:
    return b is not None and hmac.compare_digest(a.encode(), b.encode())


def bearer_ok(request: Request, config: WebConfig) -> bool:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and _eq(value.strip(), config.token)


def authenticated(request: Request, config: WebConfig) -> bool:
    if not config.has_credentials or bearer_ok(request, config):
        return True
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, _, password = base64.b64decode(value.strip()).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    return _eq(password, config.token) or _eq(f"{user}:{password}", config.basic_auth)


def same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if not origin or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


def csrf_ok(request: Request, config: WebConfig, form_token: str | None) -> bool:
    if bearer_ok(request, config):
        return True
    if not same_origin(request):
        return False
    sent = form_token or request.headers.get("x-csrf-token")
    return sent is not None and _eq(sent, config.csrf_secret)
