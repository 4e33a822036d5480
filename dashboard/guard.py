"""`RequestGuard`: the checks every request passes before FastAPI sees it (pure ASGI, so
nothing has read the body yet), in this order:

0. Headers said twice: a request that sends Host, Authorization, Origin, Content-Type,
   the CSRF header or Sec-Fetch-Site more than once is 400, naming it. Each is read as
   one value, and which of two a check reads (the first) is not what every proxy in
   front forwards or logs.
1. Host: the Host header (without port) must be on TOCK_DASHBOARD_ALLOWED_HOSTS, or the
   answer is 400 "host not allowed". This stops DNS rebinding: a page on a name the
   attacker points at this address sends that name as Host. The probes (/healthz,
   /readyz) are exempt: kubelets and load balancers address them by the pod's IP, and
   they change nothing and show no data.
2. Credentials: /api/* needs a valid bearer token or session cookie, /metrics a token
   (unless TOCK_DASHBOARD_METRICS_PUBLIC=1); 401 otherwise, before a byte of the body is
   read. Roles (viewer, operator) and CSRF are checked later, by the route's dependencies.
3. Body size: over TOCK_DASHBOARD_MAX_BODY_BYTES is 413, by Content-Length before reading
   and by counting while a chunked body streams in. The body is then handed on whole.
4. Media type: an /api body sent without a JSON Content-Type is 415, naming the header
   to send. FastAPI would not parse it and answer 422 "Input should be a valid
   dictionary" (curl -d sends application/x-www-form-urlencoded); taking such text as
   JSON anyway would let a plain cross-site form post reach the API.
5. Encoding: a body sent with a Content-Encoding (gzip, br) is 415: nothing here decodes
   it, and read as it is it would be refused for a misleading reason, or taken as text.
   A JSON body that is not UTF-8 (RFC 8259) is 400, with the offending byte,
   where FastAPI would say only "There was an error parsing the body".
6. JSON depth: a JSON body nested deeper than MAX_JSON_DEPTH levels is 400. Parsing and
   error reporting recurse per level; very deep input would exhaust the stack (FastAPI
   answers "There was an error parsing the body", or worse, 500 when serializing).
"""

from __future__ import annotations

import json
import re

from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dashboard.auth import CSRF_HEADER, SESSION_COOKIE, Authenticator, bearer_token
from dashboard.settings import DashboardSettings, split_host
from shared.core.text import shown

PROBES = frozenset({"/healthz", "/readyz"})
SAID_ONCE = ("Host", "Authorization", "Origin", "Content-Type", CSRF_HEADER, "Sec-Fetch-Site")
"""Headers a request may send at most once (step 0)."""
MAX_JSON_DEPTH = 100
"""Levels of [ and { in a request body. An enqueued payload may nest
shared.core.validation's limit (64) deep, inside the body's own object."""

# A string (to its closing quote, or to the end if it has none: every match that starts
# at a quote succeeds, so the scan is linear) or a bracket.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)|[\[\]{}]', re.DOTALL)
_OPEN = frozenset(b"[{")
_QUOTE = ord('"')


def json_depth_exceeds(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON text nests more than `limit` arrays/objects deep (brackets inside
    strings do not count). Linear in the size of the body; malformed text may be
    over-counted, and is refused anyway."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    depth = 0
    for match in _TOKEN.finditer(body):
        char = body[match.start()]
        if char == _QUOTE:
            continue
        if char in _OPEN:
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI parses a body of this type as JSON: application/json or +json."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                            and media.endswith("+json"))


def _charset(content_type: str | None) -> str | None:
    """The charset parameter of a Content-Type, unquoted; None if it names none."""
    for param in (content_type or "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"')
    return None


def _body_refusal(body: bytes, content_type: str | None, *,
                  api: bool) -> tuple[int, str] | None:
    """(status, detail) refusing a non-empty body, or None to pass it on."""
    if not _is_json(content_type):
        if not api:
            return None  # the login form; FastAPI parses no other body as JSON
        sent = f"sent as {content_type}" if content_type else "sent without a Content-Type"
        return 415, (f"request body must be JSON, but it was {sent}: send the header "
                     "Content-Type: application/json (curl: -H 'Content-Type: "
                     "application/json'; -d alone sends a form type)")
    charset = _charset(content_type)
    if charset is not None and charset.lower() not in ("utf-8", "utf8"):
        # JSON is UTF-8 (RFC 8259); reading another charset's bytes as UTF-8 would store
        # other text than the caller sent, or refuse it with a misleading reason.
        return 415, (f"request body must be JSON encoded as UTF-8, but it was sent as "
                     f"charset={charset}: send UTF-8 (Content-Type: application/json)")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        return 400, (f"request body must be JSON encoded as UTF-8, but byte "
                     f"0x{body[e.start]:02x} at offset {e.start} is not UTF-8")
    if json_depth_exceeds(body):
        return 400, f"request body is JSON nested deeper than {MAX_JSON_DEPTH} levels"
    return None


def _session_cookie(header: str | None) -> str | None:
    """The session cookie, parsed as `request.cookies` parses it."""
    return cookie_parser(header).get(SESSION_COOKIE) if header else None


class RequestGuard:
    """The ASGI middleware described in the module docstring."""

    def __init__(self, app: ASGIApp, settings: DashboardSettings,
                 auth: Authenticator) -> None:
        self.app = app
        self.settings = settings
        self.auth = auth
        self.max_body = settings.dashboard_max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        headers = Headers(scope=scope)
        twice = next((name for name in SAID_ONCE if len(headers.getlist(name)) > 1), None)
        if twice is not None:
            await _reply(send, 400, f"the {twice} header was sent "
                                    f"{len(headers.getlist(twice))} times: send it once")
            return
        if path not in PROBES:
            host, _ = split_host(headers.get("host", ""))
            if not self.settings.host_allowed(host):
                await _reply(send, 400, "host not allowed: add it to "
                             "TOCK_DASHBOARD_ALLOWED_HOSTS if the dashboard is reached "
                             "by that name")
                return
        authorization = headers.get("authorization")
        if path == "/api" or path.startswith("/api/"):
            if not self.auth.authenticated(authorization,
                                           _session_cookie(headers.get("cookie"))):
                detail = ("invalid token" if bearer_token(authorization) is not None else
                          "authentication required: send Authorization: Bearer <token>, "
                          "or log in at /login")
                await _reply(send, 401, detail, bearer=True)
                return
        elif path == "/metrics" and not self.auth.may_read_metrics(authorization):
            await _reply(send, 401, "/metrics needs a token: send Authorization: Bearer "
                         "<token> (TOCK_DASHBOARD_METRICS_TOKEN, or the operator or viewer "
                         "token), or set TOCK_DASHBOARD_METRICS_PUBLIC=1", bearer=True)
            return
        if "content-length" not in headers and "transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body
            return
        length = headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_body:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client has gone: nobody to answer
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await self._too_large(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if body and encoding not in ("", "identity"):
            await _reply(send, 415, f"request body is sent with Content-Encoding: "
                                    f"{shown(encoding)}, which is not decoded here: send it "
                                    "uncompressed, without that header")
            return
        refusal = _body_refusal(body, headers.get("content-type"), api=path == "/api"
                                or path.startswith("/api/")) if body else None
        if refusal is not None:
            await _reply(send, *refusal)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _too_large(self, send: Send) -> None:
        await _reply(send, 413, f"request body is larger than {self.max_body} bytes "
                     "(TOCK_DASHBOARD_MAX_BODY_BYTES)", close=True)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The buffered body as one message, then the client's own messages (disconnect)."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _reply(send: Send, status: int, detail: str, *, bearer: bool = False,
                 close: bool = False) -> None:
    content = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(content)).encode())]
    if bearer:
        headers.append((b"www-authenticate", b"Bearer"))
    if close:  # the rest of an unread body is not worth reading
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
