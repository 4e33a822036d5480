"""A real timer process that dies mid-dispatch: `python -m tests.support.fault_timer before|after`.

It runs the production Timer with the production SQS transport, wrapped so that the send
either never happens (`before`: hang before sending) or happens and then the process hangs
before the claiming transaction commits (`after`). The test kill -9s it while it hangs.
A file named by TOCK_FAULT_SIGNAL is created when the process reaches the hang.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shared.runtime.settings import TimerSettings
from shared.transport.base import EntryFailure, Outgoing
from shared.transport.sqs import SqsTransport
from timer_service.service import Timer


class _Hang:
    def __init__(self, inner: SqsTransport, send_first: bool) -> None:
        self.inner, self.send_first = inner, send_first

    def send_batch(self, queue: str, entries: Sequence[Outgoing]) -> list[EntryFailure]:
        if self.send_first:
            self.inner.send_batch(queue, entries)
        Path(os.environ["TOCK_FAULT_SIGNAL"]).write_text(",".join(e[0] for e in entries))
        threading.Event().wait()  # until kill -9
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def main() -> int:
    settings = TimerSettings.load()
    transport = SqsTransport(settings.queue_prefix)
    timer = Timer(settings, _Hang(transport, send_first=sys.argv[1] == "after"))  # type: ignore[arg-type]
    timer.run_once()
    return 0


if __name__ == "__main__":
    sys.exit(main())
