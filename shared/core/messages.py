"""The SQS message body: a pointer to a job row and the dispatch token it was sent with.

The payload stays in Postgres (the claim returns it), so messages are small and a message
alone can never run anything: it must match the job's current token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from uuid import UUID

from shared.core.errors import InvalidMessage

VERSION = 1
MAX_BODY_BYTES = 4096


@dataclass(frozen=True)
class JobMessage:
    job_id: int
    token: UUID
    kind: str

    def encode(self) -> str:
        return json.dumps({"v": VERSION, "job": self.job_id, "token": str(self.token),
                           "kind": self.kind}, separators=(",", ":"))


def decode(body: str) -> JobMessage:
    """Parse and check a message body; anything else raises `InvalidMessage`."""
    if len(body) > MAX_BODY_BYTES:
        raise InvalidMessage(f"message body is {len(body)} bytes; tock messages are small")
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise InvalidMessage(f"message body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidMessage("message body is not a JSON object")
    if data.get("v") != VERSION:
        raise InvalidMessage(f"unsupported message version {data.get('v')!r}")
    job_id, token, kind = data.get("job"), data.get("token"), data.get("kind")
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
        raise InvalidMessage(f"message job id must be a positive integer, got {job_id!r}")
    if not isinstance(kind, str) or not kind:
        raise InvalidMessage("message has no kind")
    try:
        parsed = UUID(str(token))
    except ValueError:
        raise InvalidMessage(f"message token is not a UUID: {token!r}") from None
    return JobMessage(job_id, parsed, kind)
