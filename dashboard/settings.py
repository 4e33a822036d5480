"""The dashboard's settings (`TOCK_DASHBOARD_*`), validated at start-up.

Outside dev mode an operator token is required and must be long enough to resist
guessing; `TOCK_DASHBOARD_DEV=1` (used by `make run` only) fills in well-known tokens so the
local stack can print them, and is therefore refused unless the dashboard listens on
loopback only.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from typing import Annotated, Self

from pydantic import BeforeValidator, Field, model_validator
from pydantic_settings import NoDecode

from shared.core.errors import ConfigError
from shared.runtime.settings import CommonSettings

DEV_OPERATOR_TOKEN = "dev-operator-token"
DEV_VIEWER_TOKEN = "dev-viewer-token"
MIN_TOKEN_LENGTH = 16
_TOKEN_TEXT = re.compile(r"[!-~]+")
"""Printable ASCII, no space: what an Authorization header carries as it was set."""
LOOPBACK_NAMES = ("localhost", "127.0.0.1")
ANY_HOST = "*"


def normalize_host(host: str) -> str:
    """A host name as the allow-list compares it: lower case, no IPv6 brackets, no
    trailing dot."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.removesuffix(".")


def split_host(value: str) -> tuple[str, int | None]:
    """(host, port) of a Host header (`name`, `name:port`, `[v6]`, `[v6]:port`); the port is
    None when absent or malformed, the host "" when the header is."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return "", None
        host, rest = value[1:end], value[end + 1:]
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            return "", None
    else:
        host, _, port_text = value.partition(":")
        if ":" in port_text:  # an unbracketed IPv6 address is not a valid Host header
            return "", None
    port = int(port_text) if port_text.isdigit() and 0 < int(port_text) < 65536 else None
    if port_text and port is None:
        return "", None
    return normalize_host(host), port


def _host_list(value: object) -> object:
    """TOCK_DASHBOARD_ALLOWED_HOSTS is comma-separated text (a list when set in code)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple):
        return [str(part).strip() for part in value if str(part).strip()]
    return value


class DashboardSettings(CommonSettings):
    """`python -m dashboard`."""

    dashboard_host: str = Field(default="127.0.0.1", min_length=1)
    dashboard_port: int = Field(default=8080, ge=1, le=65535)
    dashboard_operator_token: str | None = Field(
        default=None, description="Bearer token / password of the operator role (read+write).")
    dashboard_viewer_token: str | None = Field(
        default=None, description="Bearer token / password of the read-only viewer role.")
    dashboard_secret_key: str | None = Field(
        default=None, description="Signs session cookies; random per process when unset, "
        "so set it when you run several dashboard replicas.")
    dashboard_dev: bool = False
    dashboard_session_hours: float = Field(default=12.0, gt=0, le=24 * 30)
    dashboard_secure_cookies: bool = Field(
        default=False, description="Mark cookies Secure: set when TLS terminates in front.")
    dashboard_allowed_hosts: Annotated[list[str] | None, NoDecode,
                                       BeforeValidator(_host_list)] = Field(
        default=None, description="Host names (no scheme, no port) the dashboard answers "
        "to, comma-separated; `*` allows any. Default: the bind address, localhost and "
        "127.0.0.1 (only the last two when binding 0.0.0.0 or ::).")
    dashboard_max_body_bytes: int = Field(
        default=1024 * 1024, ge=1024, le=1024 * 1024 * 1024,
        description="Larger request bodies are refused (413) before they are parsed.")
    dashboard_metrics_token: str | None = Field(
        default=None, description="A bearer token that may read /metrics and nothing else "
        "(the operator and viewer tokens may too).")
    dashboard_metrics_public: bool = Field(
        default=False, description="Serve /metrics without a token (it names kinds and "
        "queues).")
    dashboard_stats_ttl_seconds: float = Field(
        default=2.0, ge=0, le=300,
        description="Cluster statistics are computed at most once per TTL, however many "
        "browsers and scrapers ask.")
    dashboard_finished_ttl_seconds: float = Field(
        default=15.0, ge=0, le=3600,
        description="Counts of finished jobs (a pass over the table's history) are "
        "refreshed at most this often.")
    dashboard_worker_stale_seconds: float = Field(
        default=30.0, gt=0, description="A worker is shown as stale once its lease has "
                                   "expired, or at the latest once silent this long.")
    pool_max_size: int = Field(default=10, ge=1, le=200)

    @model_validator(mode="after")
    def _check(self) -> Self:
        # ConfigError, not ValueError: pydantic passes it through, so the message names
        # the variable instead of a field location.
        for name in ("dashboard_operator_token", "dashboard_viewer_token",
                     "dashboard_metrics_token"):
            token = getattr(self, name)
            if token is None or (self.dashboard_dev and not token):
                continue  # unset (in dev mode, empty is unset: the dev token fills in)
            if not self.dashboard_dev and len(token) < MIN_TOKEN_LENGTH:
                raise ConfigError(f"TOCK_{name.upper()} must be at least "
                                  f"{MIN_TOKEN_LENGTH} characters")
            # In dev mode too: a token given there must still be one a client can send.
            if not _TOKEN_TEXT.fullmatch(token):
                # A client sends it in an Authorization header, read stripped and as
                # Latin-1: a token with a space, a trailing newline (a secret written
                # with `echo`), or other text would never match, and nobody could log in.
                raise ConfigError(f"TOCK_{name.upper()} must be printable ASCII without "
                                  "spaces (it is sent in an Authorization header); is "
                                  "there a trailing newline from the file it came from?")
        if self.dashboard_dev:
            if not self.loopback_only:
                raise ConfigError(
                    f"TOCK_DASHBOARD_DEV=1 uses public development tokens, so it needs a "
                    f"loopback TOCK_DASHBOARD_HOST (127.0.0.1, ::1 or localhost), not "
                    f"{self.dashboard_host!r}: set real tokens instead of "
                    "TOCK_DASHBOARD_DEV to listen elsewhere")
            self.dashboard_operator_token = self.dashboard_operator_token or DEV_OPERATOR_TOKEN
            self.dashboard_viewer_token = self.dashboard_viewer_token or DEV_VIEWER_TOKEN
        elif not self.dashboard_operator_token:
            raise ConfigError(
                "TOCK_DASHBOARD_OPERATOR_TOKEN is required (TOCK_DASHBOARD_DEV=1 fills in "
                "a development token for make run)")
        if self.dashboard_operator_token == self.dashboard_viewer_token:
            raise ConfigError("TOCK_DASHBOARD_OPERATOR_TOKEN and TOCK_DASHBOARD_VIEWER_TOKEN "
                              "must differ")
        if self.dashboard_metrics_token is not None and self.dashboard_metrics_token in (
                self.dashboard_operator_token, self.dashboard_viewer_token):
            raise ConfigError("TOCK_DASHBOARD_METRICS_TOKEN must differ from the operator "
                              "and viewer tokens (which may read /metrics anyway)")
        self.dashboard_allowed_hosts = self._allowed_hosts()
        if self.dashboard_secret_key and len(self.dashboard_secret_key) < MIN_TOKEN_LENGTH:
            # It signs every session: a short one can be guessed, and a cookie forged.
            raise ConfigError(f"TOCK_DASHBOARD_SECRET_KEY must be at least {MIN_TOKEN_LENGTH} "
                              "characters (it signs the session cookies; leave it unset for "
                              "a random key per process)")
        if not self.dashboard_secret_key:
            self.dashboard_secret_key = secrets.token_hex(32)
        return self

    def _allowed_hosts(self) -> list[str]:
        if self.dashboard_allowed_hosts is None:
            bind = normalize_host(self.dashboard_host)
            unspecified = bind in ("0.0.0.0", "::")
            names = [*([] if unspecified else [bind]), *LOOPBACK_NAMES]
            return list(dict.fromkeys(names))
        if not self.dashboard_allowed_hosts:
            raise ConfigError("TOCK_DASHBOARD_ALLOWED_HOSTS is empty: name the host(s) the "
                              "dashboard is reached at, or `*` for any")
        hosts = []
        for entry in self.dashboard_allowed_hosts:
            host = normalize_host(entry)
            if host != ANY_HOST and (not host or any(c in host for c in "/@?# \t")
                                     or (":" in host and not _is_ip(host))):
                raise ConfigError(
                    f"TOCK_DASHBOARD_ALLOWED_HOSTS entry {entry!r} is not a host name: give "
                    "names or addresses without scheme, path or port (e.g. "
                    "tock.example.com,10.0.0.5), comma-separated")
            hosts.append(host)
        return list(dict.fromkeys(hosts))

    def host_allowed(self, host: str) -> bool:
        """Whether a host name (from a Host header or an Origin, without port) is one the
        dashboard answers to."""
        allowed = self.dashboard_allowed_hosts or []
        return ANY_HOST in allowed or (bool(host) and normalize_host(host) in allowed)

    @property
    def loopback_only(self) -> bool:
        try:
            return ipaddress.ip_address(normalize_host(self.dashboard_host)).is_loopback
        except ValueError:
            return normalize_host(self.dashboard_host) == "localhost"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
