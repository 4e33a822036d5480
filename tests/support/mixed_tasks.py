"""The e2e task module of a consumer that mixes isolations: every kind of `e2e_tasks` (in
threads, the consumer's default) plus one that always runs in a handler process. A module
of its own, so the other e2e consumers start no handler process."""

from __future__ import annotations

from consumer import task
from tests.support import e2e_tasks

# `hang_first` again (it records each run in e2e_runs), under a kind that asks for a
# process: only a kill ends its first run.
task("hang_first_isolated", isolation="process")(e2e_tasks.hang_first)
