"""A task module that imports in the consumer but not in a handler process (as one that
needs something only the parent's environment has would): `--isolation process` must
refuse to start with it."""

from __future__ import annotations

import multiprocessing
from typing import Any

from consumer import task

if multiprocessing.parent_process() is not None:
    raise ImportError("this module refuses to load in a child process")


@task("parent-only")
def handler(payload: Any, ctx: Any) -> None:
    return None
