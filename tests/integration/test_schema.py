"""The Python definitions and the database agree: state enums, and the schema that the
migrations build from zero versus the one declared in shared/store/schema.py: tables,
columns, indexes and primary keys; the history's partitions (a LIST partition per final
state, each split by day with a DEFAULT partition, every partition carrying its parent's
indexes); the views."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import sqlalchemy as sa

from shared.core.states import AttemptOutcome, JobState
from shared.store.migrate import available, migrate
from shared.store.schema import (
    HISTORY_STATES,
    PARTITIONED,
    PARTITIONS_AHEAD_DAYS,
    VIEWS,
    metadata,
)


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
        # Partitions are checked below, against PARTITIONED; the tables are the rest.
        with psycopg.connect(url) as conn:
            partitions = {r[0] for r in conn.execute(
                "SELECT relname FROM pg_class WHERE relispartition")}
        tables = set(inspector.get_table_names()) - partitions
        assert sorted(tables) == sorted(metadata.tables)
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
                using = indexes[index_name]["dialect_options"].get("postgresql_using")
                declared_using = index.dialect_options["postgresql"]["using"] or None
                assert using == declared_using, f"{index_name} uses {using or 'btree'}"
            pk = inspector.get_pk_constraint(name)["constrained_columns"]
            assert pk == [c.name for c in table.primary_key.columns], f"primary key of {name}"
        for view, columns in VIEWS.items():
            assert [c["name"] for c in inspector.get_columns(view)] == columns, view
        assert sorted(inspector.get_view_names()) == sorted(VIEWS)
    finally:
        engine.dispose()
    with psycopg.connect(url) as conn:
        _check_partitions(conn)


def _children(conn, parent: str) -> dict[str, tuple[str, str | None]]:
    """{partition: (its bound, its own partition key or None)} of `parent`."""
    rows = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), "
        "       CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END "
        "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass", (parent,)).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _index_count(conn, table: str) -> int:
    return conn.execute("SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass",
                        (table,)).fetchone()[0]


def _check_partitions(conn) -> None:
    today = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()[0]
    days = [today + timedelta(days=n) for n in range(PARTITIONS_AHEAD_DAYS + 1)]
    for table, (by_state, by_day) in PARTITIONED.items():
        assert conn.execute("SELECT pg_get_partkeydef(%s::regclass)",
                            (table,)).fetchone()[0] == by_state
        per_state = _children(conn, table)
        assert per_state == {f"{table}_{s}": (f"FOR VALUES IN ('{s}')", by_day)
                             for s in HISTORY_STATES}, f"the state partitions of {table}"
        indexes = _index_count(conn, table)
        for state in HISTORY_STATES:
            parent = f"{table}_{state}"
            found = _children(conn, parent)
            expected = {f"{parent}_default", *(f"{parent}_p{d:%Y%m%d}" for d in days)}
            assert set(found) == expected, f"the day partitions of {parent}"
            assert found[f"{parent}_default"] == ("DEFAULT", None)
            for d in days:
                lo, hi = (f"{x:%Y-%m-%d} 00:00:00+00" for x in (d, d + timedelta(days=1)))
                assert found[f"{parent}_p{d:%Y%m%d}"] == (
                    f"FOR VALUES FROM ('{lo}') TO ('{hi}')", None)
            for partition in (parent, *found):
                assert _index_count(conn, partition) == indexes, \
                    f"{partition} lacks some of {table}'s indexes"


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
