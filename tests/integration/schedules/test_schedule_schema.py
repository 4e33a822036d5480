"""Migration 0002 builds what shared/schema.py declares for schedules, and the policy enums
in Python and Postgres agree."""

import sqlalchemy as sa

from shared.core.schedules import (
    DstFold,
    DstGap,
    Misfire,
    Overlap,
)
from shared.store.schema import metadata


def labels(db, enum):
    return [r[0] for r in db.execute(
        "SELECT e.enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid "
        "WHERE t.typname = %s ORDER BY e.enumsortorder", (enum,)).fetchall()]


def test_policy_enums_match_postgres(db):
    assert labels(db, "tock_schedule_misfire") == [m.value for m in Misfire]
    assert labels(db, "tock_schedule_overlap") == [o.value for o in Overlap]
    assert labels(db, "tock_schedule_dst_gap") == [g.value for g in DstGap]
    assert labels(db, "tock_schedule_dst_fold") == [f.value for f in DstFold]


def test_migrated_tables_match_the_declaration(database_url):
    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        inspector = sa.inspect(engine)
        for table in (metadata.tables[n] for n in ("tock_schedules", "tock_schedule_audit",
                                                "tock_jobs")):
            actual = {c["name"]: c for c in inspector.get_columns(table.name)}
            assert list(actual) == [c.name for c in table.columns], table.name
            for column in table.columns:
                assert actual[column.name]["nullable"] == column.nullable, column
            indexes = {i["name"]: i for i in inspector.get_indexes(table.name)}
            assert sorted(indexes) == sorted(i.name for i in table.indexes), table.name
    finally:
        engine.dispose()
