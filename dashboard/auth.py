"""Who is asking, and may they? Two roles: `operator` (read and write) and `viewer`
(read only).

Scripts send `Authorization: Bearer <token>`. Browsers log in once with the token as a
password and get a signed, HttpOnly, SameSite=Strict session cookie. Because a cookie is
sent by the browser on its own, every state-changing request authenticated by the cookie
must also carry the session's CSRF token in the `X-CSRF-Token` header (the page's
JavaScript reads it from /api/me) and, when the browser says where it comes from, an
`Origin` of this very host. A form posted from another site has neither, so it is refused.
Bearer-token requests carry no ambient credential and need no CSRF token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Annotated, Literal
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dashboard.settings import DashboardSettings

Role = Literal["operator", "viewer"]
SESSION_COOKIE = "tock_session"
LOGIN_CSRF_COOKIE = "tock_login_csrf"
CSRF_HEADER = "X-CSRF-Token"
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

bearer = HTTPBearer(auto_error=False, description="An operator or viewer token.")


@dataclass(frozen=True)
class Principal:
    role: Role
    via_cookie: bool
    csrf_token: str | None = None

    @property
    def can_write(self) -> bool:
        return self.role == "operator"


def _fingerprint(token: str) -> str:
    # A session names the token it was made from, so rotating a token ends its sessions.
    return hashlib.sha256(token.encode()).hexdigest()[:16]


class Authenticator:
    """Checks tokens and signs/reads session cookies with the settings' secret key."""

    def __init__(self, settings: DashboardSettings) -> None:
        self.settings = settings
        assert settings.dashboard_secret_key
        self._key = settings.dashboard_secret_key.encode()

    def role_of(self, token: str) -> Role | None:
        """The role a token grants, compared in constant time; None for a wrong token."""
        found: Role | None = None
        for role, expected in (("operator", self.settings.dashboard_operator_token),
                               ("viewer", self.settings.dashboard_viewer_token)):
            if expected and hmac.compare_digest(token.encode(), expected.encode()):
                found = role  # type: ignore[assignment]
        return found

    def _token_for(self, role: Role) -> str | None:
        return (self.settings.dashboard_operator_token if role == "operator"
                else self.settings.dashboard_viewer_token)

    def _sign(self, data: bytes) -> str:
        return hmac.new(self._key, data, hashlib.sha256).hexdigest()

    def make_session(self, role: Role) -> tuple[str, str]:
        """(cookie value, csrf token) for a fresh session."""
        token = self._token_for(role)
        assert token
        csrf = secrets.token_urlsafe(24)
        expires = int(time.time() + self.settings.dashboard_session_hours * 3600)
        body = json.dumps({"r": role, "c": csrf, "e": expires, "f": _fingerprint(token)},
                          separators=(",", ":")).encode()
        encoded = base64.urlsafe_b64encode(body).decode().rstrip("=")
        return f"{encoded}.{self._sign(encoded.encode())}", csrf

    def read_session(self, cookie: str) -> Principal | None:
        """The session a cookie stands for, or None if forged, expired or revoked."""
        encoded, _, signature = cookie.partition(".")
        if not signature or not hmac.compare_digest(signature, self._sign(encoded.encode())):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
            role, csrf, expires, fingerprint = data["r"], data["c"], data["e"], data["f"]
        except (ValueError, KeyError, TypeError):
            return None
        if role not in ("operator", "viewer") or expires < time.time():
            return None
        token = self._token_for(role)
        if not token or not hmac.compare_digest(fingerprint, _fingerprint(token)):
            return None
        return Principal(role, via_cookie=True, csrf_token=csrf)

    def login_csrf(self) -> str:
        return secrets.token_urlsafe(24)


def authenticator(request: Request) -> Authenticator:
    auth: Authenticator = request.app.state.auth
    return auth


def same_origin(request: Request) -> bool:
    """False when the browser says the request comes from another origin. Browsers send
    Origin on every cross-origin POST; a request without it (curl, old clients) is judged
    by the CSRF token alone."""
    origin = request.headers.get("origin")
    if origin is None:
        return request.headers.get("sec-fetch-site") not in ("cross-site", "same-site")
    if origin == "null":  # sandboxed frames and file:// pages
        return False
    parts = urlsplit(origin)
    host = request.headers.get("host", "")
    return parts.netloc == host and parts.scheme in ("http", "https")


def current_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    auth: Annotated[Authenticator, Depends(authenticator)],
) -> Principal:
    """Any authenticated caller (viewer or operator); 401 otherwise."""
    if credentials is not None:
        role = auth.role_of(credentials.credentials)
        if role is None:
            raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
        return Principal(role, via_cookie=False)
    cookie = request.cookies.get(SESSION_COOKIE)
    principal = auth.read_session(cookie) if cookie else None
    if principal is None:
        raise HTTPException(401, "authentication required: send Authorization: Bearer "
                            "<token>, or log in at /login",
                            headers={"WWW-Authenticate": "Bearer"})
    return principal


def check_csrf(request: Request, principal: Principal) -> None:
    """Refuse a cookie-authenticated state change that did not come from our own page."""
    if not principal.via_cookie or request.method not in UNSAFE_METHODS:
        return
    if not same_origin(request):
        raise HTTPException(403, "cross-site request refused (Origin does not match)")
    sent = request.headers.get(CSRF_HEADER, "")
    if not principal.csrf_token or not hmac.compare_digest(sent, principal.csrf_token):
        raise HTTPException(403, f"missing or wrong {CSRF_HEADER} header: state changes "
                            "from a browser session need the session's CSRF token")


def operator(request: Request,
             principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    """An operator; 403 for a viewer; CSRF-checked when authenticated by cookie."""
    check_csrf(request, principal)
    if not principal.can_write:
        raise HTTPException(403, "the viewer role is read-only: this needs the operator role")
    return principal
