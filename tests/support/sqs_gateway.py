"""An HTTP gateway in front of the real SQS server that can be told to answer every call
with an empty 200, as LocalStack's own gateway does for a moment while it is killed or
started (boto3 turns such a reply into a reply with no fields, not an error), to answer
one operation with a body of its own (a reply of the wrong shape), or to hold one
operation's calls until released (an SQS that hangs).

    with SqsGateway(upstream=os.environ["AWS_ENDPOINT_URL_SQS"]) as gateway:
        transport = SqsTransport(prefix, client=gateway.client())
        gateway.empty = True    # every call now gets an empty 200 ...
        gateway.empty = False   # ... and is forwarded again
        gateway.replies["GetQueueAttributes"] = b'{"Attributes": "x"}'
        gateway.hang.add("GetQueueAttributes"); ...; gateway.release.set()
        gateway.fail["SendMessageBatch"] = 2   # its next two calls answer 500
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config


class SqsGateway:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.empty = False
        self.emptied = 0
        """Calls answered with an empty 200."""
        self.replies: dict[str, bytes] = {}
        """Operation (GetQueueAttributes, ...) -> the body of a 200 to answer it with."""
        self.fail: dict[str, int] = {}
        """Operation -> how many of its next calls get a 500 InternalError (which
        botocore retries) before calls are forwarded again."""
        self.hang: set[str] = set()
        """Operations whose calls are held until `release` is set (then forwarded)."""
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.held = 0
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                operation = self.headers.get("X-Amz-Target", "").rpartition(".")[2]
                with gateway._lock:
                    failing = gateway.fail.get(operation, 0) > 0
                    if failing:
                        gateway.fail[operation] -= 1
                if failing:
                    self._json(500, b'{"__type": "InternalError", '
                                    b'"message": "injected by the gateway"}')
                    return
                if operation in gateway.hang:
                    gateway.held += 1
                    gateway.release.wait(120)
                canned = b"" if gateway.empty else gateway.replies.get(operation)
                if canned is not None:
                    gateway.emptied += not canned
                    self._json(200, canned)
                    return
                conn = http.client.HTTPConnection(*gateway.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    conn.request("POST", self.path, body, headers)
                    reply = conn.getresponse()
                    data = reply.read()
                finally:
                    conn.close()
                self.send_response(reply.status)
                for name, value in reply.getheaders():
                    if name.lower() not in ("content-length", "transfer-encoding",
                                            "connection", "server", "date"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _json(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def client(self, read_timeout: float = 30, attempts: int = 1) -> Any:
        """A boto3 SQS client that goes through the gateway."""
        return boto3.client("sqs", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="test", aws_secret_access_key="test",
                            config=Config(connect_timeout=5, read_timeout=read_timeout,
                                          retries={"mode": "standard",
                                                   "total_max_attempts": attempts}))

    def __enter__(self) -> SqsGateway:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
