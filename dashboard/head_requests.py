"""`HeadAsGet`: HEAD answered as GET without the body (RFC 9110 9.3.2), as the timer's and
consumer's probe servers answer it. FastAPI routes a GET route for GET alone, so a load
balancer or uptime check that sends HEAD would read 405 as "down"."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    """Outermost middleware: a HEAD request goes through everything (guards, auth, the
    route) as the GET it stands for; only the body is left out of the answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)
