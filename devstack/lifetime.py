"""Child processes that do not outlive the process that started them, even one killed with
SIGKILL (which gets no chance to stop them): Linux's parent-death signal."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def dies_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `sig` when the thread that
    started it ends. None where there is no such thing (not Linux), so callers pass it
    through unchanged. Start such children from the main thread of a process that runs no
    other threads (a `preexec_fn` runs between fork and exec): the signal follows the
    starting thread, not the process."""
    if not sys.platform.startswith("linux"):
        return None
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    # Looked up here, in the parent: between fork and exec the child only makes the call.
    prctl = ctypes.CDLL(libc_name, use_errno=True).prctl

    def set_signal() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig))

    return set_signal


def end_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have this process sent `sig` when its parent ends (`make`, for `make run`: a
    `kill -9` of make would otherwise leave it and all it started running). If the parent
    is already gone, `sig` now. Nothing where there is no parent-death signal."""
    parent = os.getppid()
    set_signal = dies_with_parent(sig)
    if set_signal is None:
        return
    set_signal()
    if os.getppid() != parent:  # the parent died before the call: no signal will come
        os.kill(os.getpid(), sig)
