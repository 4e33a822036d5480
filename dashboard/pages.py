"""The browser side: the login form, the session, and the page itself (one HTML file whose
script talks to /api). Every asset is served from dashboard/static: no CDN."""

from __future__ import annotations

import html
import logging
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from dashboard.auth import (
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    Authenticator,
    authenticator,
    same_origin,
    same_secret,
)
from shared.runtime.logs import emit

log = logging.getLogger("tock.dashboard")
router = APIRouter(include_in_schema=False)

STATIC = resources.files("dashboard") / "static"


def _cookie_args(request: Request) -> dict[str, object]:
    secure: bool = request.app.state.settings.dashboard_secure_cookies
    return {"httponly": True, "samesite": "strict", "secure": secure, "path": "/"}


def _login_page(csrf: str, message: str = "", status: int = 200) -> HTMLResponse:
    template = (STATIC / "login.html").read_text(encoding="utf-8")
    note = f'<p class="error" role="alert">{html.escape(message)}</p>' if message else ""
    body = template.replace("{{csrf}}", html.escape(csrf)).replace("{{message}}", note)
    return HTMLResponse(body, status_code=status)


@router.get("/login")
def login_form(request: Request,
               auth: Annotated[Authenticator, Depends(authenticator)]) -> HTMLResponse:
    csrf = auth.login_csrf()
    response = _login_page(csrf)
    response.set_cookie(LOGIN_CSRF_COOKIE, csrf, max_age=3600, **_cookie_args(request))  # type: ignore[arg-type]
    return response


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


async def fields_once(request: Request) -> None:
    """Refuse a form that repeats a field: FastAPI would take the last one, and a login
    that succeeds on `token=wrong&token=right` says nothing useful about the first."""
    sent_as = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if sent_as not in FORM_TYPES:
        return  # the route says what it takes
    form = await request.form()  # the one FastAPI parsed for the Form() fields (cached)
    repeated = sorted({k for k in form if len(form.getlist(k)) > 1})
    if repeated:
        raise HTTPException(400, f"form field(s) {', '.join(repeated)} sent more than once: "
                                 "send each field once")


@router.post("/login", dependencies=[Depends(fields_once)])
def login(request: Request, auth: Annotated[Authenticator, Depends(authenticator)],
          token: Annotated[str, Form()] = "", csrf_token: Annotated[str, Form()] = ""
          ) -> Response:
    sent_as = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if sent_as not in FORM_TYPES:
        # Its fields would read as empty, and the refusal below would blame the CSRF field.
        raise HTTPException(415, f"the login form posts as {FORM_TYPES[0]} (token and "
                                 f"csrf_token fields), not {sent_as or 'without a type'}; "
                                 "for the API, send Authorization: Bearer <token> instead")
    # Login CSRF: the form's hidden field must match the cookie set with the form, and a
    # browser must say the post comes from this origin.
    expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if (not expected or not same_secret(csrf_token, expected)
            or not same_origin(request)):
        emit(log, "login_refused", logging.WARNING, reason="csrf")
        raise HTTPException(403, "login form expired or posted from another site: reload "
                            "/login and try again")
    role = auth.role_of(token.strip())  # pasted with its newline, as a Bearer header may be
    if role is None:
        emit(log, "login_failed", logging.WARNING)
        fresh = auth.login_csrf()
        said = "Wrong token." if token.strip() else "Enter a token."
        response: Response = _login_page(fresh, said, status=401)
        response.set_cookie(LOGIN_CSRF_COOKIE, fresh, max_age=3600, **_cookie_args(request))  # type: ignore[arg-type]
        return response
    cookie, _ = auth.make_session(role)
    response = RedirectResponse("/", status_code=303)
    max_age = int(request.app.state.settings.dashboard_session_hours * 3600)
    response.set_cookie(SESSION_COOKIE, cookie, max_age=max_age, **_cookie_args(request))  # type: ignore[arg-type]
    response.delete_cookie(LOGIN_CSRF_COOKIE, path="/")
    emit(log, "login", role=role)
    return response


@router.post("/logout", dependencies=[Depends(fields_once)])
def logout(request: Request, auth: Annotated[Authenticator, Depends(authenticator)],
           csrf_token: Annotated[str, Form()] = "") -> Response:
    cookie = request.cookies.get(SESSION_COOKIE)
    principal = auth.read_session(cookie) if cookie else None
    if principal is not None and not same_origin(request):
        raise HTTPException(403, "cross-site logout refused")
    if principal is not None and (not principal.csrf_token
                                  or not same_secret(csrf_token, principal.csrf_token)):
        raise HTTPException(403, "logout refused: the csrf_token form field is missing or "
                                 "wrong (the dashboard's Log out button sends it)")
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/")
def index(request: Request, auth: Annotated[Authenticator, Depends(authenticator)]
          ) -> Response:
    cookie = request.cookies.get(SESSION_COOKIE)
    if not cookie or auth.read_session(cookie) is None:
        return RedirectResponse("/login", status_code=303)
    return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"),
                        headers={"Cache-Control": "no-store"})


@router.get("/favicon.ico")
def favicon() -> Response:
    """The icon the pages link to (/static/favicon.svg), also where browsers and tools look
    for one unasked, so that request is not a 404. Public, like /login and /static."""
    return Response((STATIC / "favicon.svg").read_bytes(), media_type="image/svg+xml",
                    headers={"Cache-Control": "public, max-age=86400"})
