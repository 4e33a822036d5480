"""The per-job batch statements pass numbers, UUIDs, enum labels and booleans as array
literals built by `shared.store.arrays`: Postgres must read back exactly what was built."""

from __future__ import annotations

import math
import uuid

from shared.core.states import AttemptOutcome, JobState
from shared.store import arrays


def test_each_kind_of_array_reads_back_exactly(db):
    ints = [0, 1, -7, 2**62, 9_007_199_254_740_993]
    floats = [0.0, 0.1, 1e-05, 2.5, 1e300, 300.0, 7.0]
    tokens = [uuid.uuid4() for _ in range(3)]
    states = [s.value for s in JobState]
    outcomes = [o.value for o in AttemptOutcome]
    flags = [True, False, True]
    row = db.execute(
        "SELECT %s::bigint[], %s::float8[], %s::uuid[], %s::tock_job_state[]::text[], "
        "%s::tock_attempt_outcome[]::text[], %s::bool[], %s::int[]",
        [arrays.numbers(ints), arrays.numbers(floats), arrays.uuids(tokens),
         arrays.labels(states), arrays.labels(outcomes), arrays.booleans(flags),
         arrays.numbers([])]).fetchone()
    assert row[0] == ints
    assert row[1] == floats and all(math.isfinite(f) for f in row[1])
    assert row[2] == tokens
    assert row[3] == states
    assert row[4] == outcomes
    assert row[5] == flags
    assert row[6] == []


def test_a_null_array_beside_others_in_unnest_pads_with_nulls(db):
    # FINISH_ATTEMPTS passes errors and tracebacks as NULL when every attempt succeeded.
    rows = db.execute("SELECT * FROM unnest(%s::bigint[], %s::text[]) AS t(id, error)",
                      [arrays.numbers([1, 2, 3]), None]).fetchall()
    assert rows == [(1, None), (2, None), (3, None)]
