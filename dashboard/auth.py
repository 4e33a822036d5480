"""Who is asking, and may they? Two roles: `operator` (read and write) and `viewer`
(read only).

Scripts send `Authorization: Bearer <token>`. Browsers log in once with the token as a
password and get a signed, HttpOnly, SameSite=Strict session cookie. Because a cookie is
sent by the browser on its own, every state-changing request authenticated by the cookie
must also carry the session's CSRF token in the `X-CSRF-Token` header (the page's
JavaScript reads it from /api/me) and, when the browser says where it comes from, an
`Origin` that names an allowed host (TOCK_DASHBOARD_ALLOWED_HOSTS) and the very host and
port the request was sent to. A form posted from another site has neither, so it is
refused; so is a page of a rebound DNS name, whose Origin is not on the allow-list.
Bearer-token requests carry no ambient credential and need no CSRF token.

`RequestGuard` (dashboard.guard) asks `Authenticator.authenticated` before a request body
is read; the dependencies below then decide the role.
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

from dashboard.settings import DashboardSettings, normalize_host, split_host

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


def same_secret(given: object, expected: str) -> bool:
    """Whether `given` (a token, signature or CSRF token a client sent) is `expected`, in
    constant time. As bytes: `hmac.compare_digest` raises TypeError for text with a
    character outside ASCII, which a client may put in a cookie, header or form field."""
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"),
                               expected.encode("utf-8", "surrogatepass"))


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
            if expected and same_secret(token, expected):
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
        if not signature or not same_secret(signature, self._sign(encoded.encode())):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
            role, csrf, expires, fingerprint = data["r"], data["c"], data["e"], data["f"]
        except (ValueError, KeyError, TypeError):
            return None
        if role not in ("operator", "viewer") or expires < time.time():
            return None
        token = self._token_for(role)
        if not token or not same_secret(fingerprint, _fingerprint(token)):
            return None
        return Principal(role, via_cookie=True, csrf_token=csrf)

    def login_csrf(self) -> str:
        return secrets.token_urlsafe(24)

    def authenticated(self, authorization: str | None, cookie: str | None) -> bool:
        """Whether a request carries valid credentials of either role: a bearer token, or
        (without an Authorization header of the Bearer scheme) a valid session cookie.
        The same choice `current_principal` makes, from the raw headers."""
        token = bearer_token(authorization)
        if token is not None:
            return self.role_of(token) is not None
        return cookie is not None and self.read_session(cookie) is not None

    def may_read_metrics(self, authorization: str | None) -> bool:
        """/metrics: either role's token or TOCK_DASHBOARD_METRICS_TOKEN, unless it is
        public (TOCK_DASHBOARD_METRICS_PUBLIC=1)."""
        if self.settings.dashboard_metrics_public:
            return True
        token = bearer_token(authorization)
        if token is None:
            return False
        expected = self.settings.dashboard_metrics_token
        metrics = bool(expected) and same_secret(token, expected or "")
        return self.role_of(token) is not None or metrics


def bearer_token(authorization: str | None) -> str | None:
    """The credentials of an `Authorization: Bearer <token>` header, as HTTPBearer reads
    them; None for no header or another scheme."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    if scheme.lower() != "bearer" or not credentials:
        return None
    return credentials


def authenticator(request: Request) -> Authenticator:
    auth: Authenticator = request.app.state.auth
    return auth


DEFAULT_PORTS = {"http": 80, "https": 443}


def same_origin(request: Request) -> bool:
    """False when the browser says the request comes from another origin. Browsers send
    Origin on every cross-origin POST; a request without it (curl, old clients) is judged
    by the CSRF token alone.

    The Origin must name a host on the allow-list: a page served from a DNS name the
    attacker rebound to this address sends its own name as both Origin and Host, so
    comparing the two alone would let it through. It must also be the host and port the
    request was sent to (another port of an allowed host is another site's page), and
    https when cookies are Secure (they only exist on https pages then)."""
    origin = request.headers.get("origin")
    if origin is None:
        return request.headers.get("sec-fetch-site") not in ("cross-site", "same-site")
    if origin == "null":  # sandboxed frames and file:// pages
        return False
    settings: DashboardSettings = request.app.state.settings
    try:
        parts = urlsplit(origin)
        origin_port = parts.port
    except ValueError:
        return False
    schemes = ("https",) if settings.dashboard_secure_cookies else ("http", "https")
    if (parts.scheme not in schemes or not parts.hostname or parts.username is not None
            or parts.path or parts.query or parts.fragment):
        return False
    origin_host = normalize_host(parts.hostname)
    if not settings.host_allowed(origin_host):
        return False
    host, host_port = split_host(request.headers.get("host", ""))
    default = DEFAULT_PORTS[parts.scheme]
    return origin_host == host and (origin_port or default) == (host_port or default)


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
    if not principal.csrf_token or not same_secret(sent, principal.csrf_token):
        raise HTTPException(403, f"missing or wrong {CSRF_HEADER} header: state changes "
                            "from a browser session need the session's CSRF token")


def operator(request: Request,
             principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    """An operator; 403 for a viewer; CSRF-checked when authenticated by cookie."""
    check_csrf(request, principal)
    if not principal.can_write:
        raise HTTPException(403, "the viewer role is read-only: this needs the operator role")
    return principal
