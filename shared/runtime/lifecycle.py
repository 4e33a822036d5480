"""Stopping long-running loops cleanly: SIGTERM and SIGINT set an event the loop watches."""

from __future__ import annotations

import signal
import threading
from types import FrameType


class StopFlag:
    """Set once a stop was asked for; `wait(t)` sleeps up to t seconds unless stopped."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(max(seconds, 0))

    def install_signal_handlers(self) -> None:
        """SIGTERM (container stop) and SIGINT (Ctrl-C) ask for a clean stop."""

        def handler(signum: int, frame: FrameType | None) -> None:
            self._event.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
