"""The dashboard's settings (`TOCK_DASHBOARD_*`), validated at start-up.

Outside dev mode an operator token is required and must be long enough to resist
guessing; `TOCK_DASHBOARD_DEV=1` (used by `make run` only) fills in well-known tokens so the
local stack can print them.
"""

from __future__ import annotations

import ipaddress
import secrets
from typing import Self

from pydantic import Field, model_validator

from shared.core.errors import ConfigError
from shared.runtime.settings import CommonSettings

DEV_OPERATOR_TOKEN = "dev-operator-token"
DEV_VIEWER_TOKEN = "dev-viewer-token"
MIN_TOKEN_LENGTH = 16


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
    dashboard_stats_ttl_seconds: float = Field(
        default=2.0, ge=0, le=300,
        description="Cluster statistics are computed at most once per TTL, however many "
        "browsers and scrapers ask.")
    dashboard_finished_ttl_seconds: float = Field(
        default=15.0, ge=0, le=3600,
        description="Counts of finished jobs (a pass over the table's history) are "
        "refreshed at most this often.")
    dashboard_worker_stale_seconds: float = Field(
        default=30.0, gt=0, description="A worker silent this long is shown as stale.")
    pool_max_size: int = Field(default=10, ge=1, le=200)

    @model_validator(mode="after")
    def _check(self) -> Self:
        # ConfigError, not ValueError: pydantic passes it through, so the message names
        # the variable instead of a field location.
        if self.dashboard_dev:
            self.dashboard_operator_token = self.dashboard_operator_token or DEV_OPERATOR_TOKEN
            self.dashboard_viewer_token = self.dashboard_viewer_token or DEV_VIEWER_TOKEN
        elif not self.dashboard_operator_token:
            raise ConfigError(
                "TOCK_DASHBOARD_OPERATOR_TOKEN is required (TOCK_DASHBOARD_DEV=1 fills in "
                "a development token for make run)")
        else:
            for name in ("dashboard_operator_token", "dashboard_viewer_token"):
                token = getattr(self, name)
                if token is not None and len(token) < MIN_TOKEN_LENGTH:
                    raise ConfigError(f"TOCK_{name.upper()} must be at least "
                                     f"{MIN_TOKEN_LENGTH} characters")
        if self.dashboard_operator_token == self.dashboard_viewer_token:
            raise ConfigError("TOCK_DASHBOARD_OPERATOR_TOKEN and TOCK_DASHBOARD_VIEWER_TOKEN "
                              "must differ")
        if not self.dashboard_secret_key:
            self.dashboard_secret_key = secrets.token_hex(32)
        return self

    @property
    def loopback_only(self) -> bool:
        try:
            return ipaddress.ip_address(self.dashboard_host).is_loopback
        except ValueError:
            return self.dashboard_host == "localhost"
