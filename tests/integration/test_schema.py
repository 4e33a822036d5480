"""The Python definitions and the database agree: state enums, and the schema that the
migrations build from zero versus the one declared in shared/schema.py."""

from __future__ import annotations

import psycopg
import sqlalchemy as sa

from shared.core.states import AttemptOutcome, JobState
from shared.store.migrate import available, migrate
from shared.store.schema import metadata


def _labels(db, enum: str) -> list[str]:
    rows = db.execute(
        "SELECT e.enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid "
        "WHERE t.typname = %s ORDER BY e.enumsortorder", (enum,)).fetchall()
    return [r[0] for r in rows]


def test_job_state_enum_matches_postgres(db):
    assert _labels(db, "tock_job_state") == [s.value for s in JobState]


def test_attempt_outcome_enum_matches_postgres(db):
    assert _labels(db, "tock_attempt_outcome") == [o.value for o in AttemptOutcome]


def _sa_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def test_migrations_from_zero_build_the_declared_schema(pg_server):
    url = pg_server.create_database("schema_from_zero")
    assert migrate(url) == [name for name, _ in available()]
    assert migrate(url) == [], "a second run applies nothing"
    engine = sa.create_engine(_sa_url(url))
    try:
        inspector = sa.inspect(engine)
        assert sorted(inspector.get_table_names()) == sorted(metadata.tables)
        for name, table in metadata.tables.items():
            actual = {c["name"]: c for c in inspector.get_columns(name)}
            assert list(actual) == [c.name for c in table.columns], name
            for column in table.columns:
                found = actual[column.name]
                assert found["nullable"] == column.nullable, f"{name}.{column.name} nullable"
                assert type(found["type"]).__name__ == type(column.type).__name__ or (
                    found["type"].compile(dialect=engine.dialect)
                    == column.type.compile(dialect=engine.dialect)
                ), f"{name}.{column.name}: {found['type']!r} != {column.type!r}"
            declared = {i.name: i for i in table.indexes}
            indexes = {i["name"]: i for i in inspector.get_indexes(name)}
            assert sorted(indexes) == sorted(declared), f"indexes of {name}"
            for index_name, index in declared.items():
                # An expression (coalesce(tenant, '')) has no column name on either side.
                found_columns = [n for n in indexes[index_name]["column_names"] if n]
                assert found_columns == [c.name for c in index.columns], index_name
                assert bool(indexes[index_name]["unique"]) == bool(index.unique)
            pk = inspector.get_pk_constraint(name)["constrained_columns"]
            assert pk == [c.name for c in table.primary_key.columns], f"primary key of {name}"
    finally:
        engine.dispose()


def test_concurrent_migrate_runs_apply_each_migration_once(pg_server):
    from concurrent.futures import ThreadPoolExecutor

    url = pg_server.create_database("schema_concurrent")
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: migrate(url), range(3)))
    applied = [name for result in results for name in result]
    assert sorted(applied) == sorted(name for name, _ in available())
    with psycopg.connect(url) as conn:
        count = conn.execute("SELECT count(*) FROM tock_migrations").fetchone()
    assert count == (len(available()),)
