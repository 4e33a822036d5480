"""The SQS message body: a pointer to a job row and the dispatch token it was sent with.

The payload stays in Postgres (the claim returns it), so messages are small and a message
alone can never run anything: it must match the job's current token.

The job's tenant and priority ride along (optional: older messages lack them) only to
order a consumer's prefetched messages (consumer/prefetch.py); the claim takes neither
from the message.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from uuid import UUID

from shared.core.errors import InvalidInput, InvalidMessage
from shared.core.validation import KIND, MAX_TENANT_LENGTH, optional_text

VERSION = 1
MAX_BODY_BYTES = 4096
MAX_JOB_ID = 2**63 - 1
"""Job ids are Postgres bigints."""
MAX_PRIORITY = 9


@dataclass(frozen=True)
class JobMessage:
    job_id: int
    token: UUID
    kind: str
    tenant: str | None = None
    """None: none given (no tenant, or a message from before tenants were sent)."""
    priority: int = 0

    def encode(self) -> str:
        body: dict[str, object] = {"v": VERSION, "job": self.job_id, "token": str(self.token),
                                   "kind": self.kind}
        if self.tenant:  # left out when empty, as `priority` at 0: the body stays small
            # Only an ordering hint: a tenant stored before today's length check is cut
            # (stably), so its message still decodes.
            body["tenant"] = self.tenant[:MAX_TENANT_LENGTH]
        if self.priority:
            body["pri"] = self.priority
        return json.dumps(body, separators=(",", ":"))


def decode(body: object) -> JobMessage:
    """Parse and check a message body; anything else (whatever its shape) raises
    `InvalidMessage`, never another error."""
    if not isinstance(body, str):
        raise InvalidMessage(f"message body is not text but {type(body).__name__}")
    if len(body) > MAX_BODY_BYTES:
        raise InvalidMessage(f"message body is {len(body)} characters; tock messages are "
                             f"at most {MAX_BODY_BYTES}")
    return _decode_text(body)


@functools.lru_cache(maxsize=4096)
def _decode_text(body: str) -> JobMessage:
    """`decode` of a body of the right type and size. Cached: a consumer reads each body
    twice (its prefetch buffer orders by the tenant and priority, the claim by the rest),
    and a JobMessage is immutable. A body that fails raises each time (nothing cached)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        raise InvalidMessage(f"message body is not JSON: {str(exc)[:200] or type(exc).__name__}"
                             ) from None
    if not isinstance(data, dict):
        raise InvalidMessage("message body is not a JSON object")
    if type(data.get("v")) is not int or data.get("v") != VERSION:  # True == 1 in Python
        raise InvalidMessage(f"unsupported message version {_got(data.get('v'), 40)}")
    job_id, token, kind = data.get("job"), data.get("token"), data.get("kind")
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id <= MAX_JOB_ID:
        raise InvalidMessage(f"message job id must be an integer from 1 to {MAX_JOB_ID}, "
                             f"got {_got(job_id, 40)}")
    if not isinstance(kind, str) or not KIND.fullmatch(kind):
        raise InvalidMessage(f"message kind is not a tock kind: {_got(kind, 80)}")
    if not isinstance(token, str):
        raise InvalidMessage(f"message token is not a UUID: {_got(token, 40)}")
    try:
        parsed = UUID(token)
    except ValueError:
        raise InvalidMessage(f"message token is not a UUID: {_got(token, 40)}") from None
    tenant, priority = data.get("tenant"), data.get("pri", 0)
    try:
        optional_text("tenant", tenant, MAX_TENANT_LENGTH)
    except InvalidInput as exc:
        raise InvalidMessage(f"message {str(exc)[:200]}") from None
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or not 0 <= priority <= MAX_PRIORITY:
        raise InvalidMessage(f"message priority must be an integer from 0 to {MAX_PRIORITY}, "
                             f"got {_got(priority, 40)}")
    return JobMessage(job_id, parsed, kind, tenant, priority)


def _got(value: object, limit: int) -> str:
    """A value from a message body as JSON wrote it (a number bare, a string quoted,
    missing as null), cut to `limit` characters and all ASCII, so a log line shows which
    it was and nothing in it can drive a terminal."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= limit else text[:limit] + "..."
