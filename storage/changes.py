"""Per-table change counters: which tables a commit may have changed.

PostgreSQL: migration 0070 gives every table a sequence `servetune_changes_<table>`
and a statement-level trigger (`servetune_changes`, after INSERT, UPDATE, DELETE
and TRUNCATE) that advances it. A sequence is not transactional, so concurrent
writers never wait for each other on it, and its value moves when the statement
runs, before the commit (`api.reads.PgVersion` reads the counters on both sides of
a snapshot for that reason). Only the triggers may set these sequences: one moved
back by hand (`setval`, `ALTER SEQUENCE ... RESTART`) could make a changed table
look unchanged.

SQLite: migration 0090 gives every table a row of `servetune_changes` (name,
changes) and row-level triggers (`servetune_changes_<table>_<event>`, after
INSERT, UPDATE and DELETE; SQLite has no statement-level ones) that add one to it
per row written. The row is written in the writer's own transaction: it commits or
rolls back with the change it counts, and the database has one writer at a time,
so two reads of the counters see every commit in between (`api.reads.SqliteVersion`).
Two tables written in bulk have none there, `trace_requests` and `kernel_samples`:
a counter update per row made storing a 1M-row trace take twice as long. A read
naming one depends on every commit; the API's hot reads name neither (a trace's
stats and a profile's per-operator summary are stored on their parent rows).

Either way any writer moves them (the API, a worker, the CLI, a person at psql or
sqlite3): a trigger cannot be bypassed by going around the ORM.

One column is not counted: `jobs.lease_expires_at`, which a worker's heartbeat
updates every few seconds per running job and no answer of the API shows. On
`jobs`, an update moves the counter only when it changes some other column
(PostgreSQL: a row trigger compares the rows without it, migration 0080; SQLite:
the update trigger names every other column, 0090), so heartbeats leave the API's
kept job reads standing.

`tables_read(statements, counted)` names the tables some SQL statements read, by
their names as words of the SQL: an over-approximation (a column sharing a
table's name adds that table), never an under-approximation for the tables this
schema defines. A statement naming an uncounted column depends on every commit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache, lru_cache

from storage.models import Base

TRIGGER = "servetune_changes"
SEQUENCE_PREFIX = "servetune_changes_"
SQLITE_TABLE = "servetune_changes"  # SQLite: one row (name, changes) per counted table
# Columns whose changes no counter sees (see the module docstring): a read naming one is
# not kept across commits.
UNCOUNTED_COLUMNS = ("lease_expires_at",)


def sequence_name(table: str) -> str:
    return SEQUENCE_PREFIX + table


@cache
def _table_words() -> re.Pattern[str]:
    names = sorted(Base.metadata.tables, key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")


@cache
def _uncounted_words() -> re.Pattern[str]:
    return re.compile(r"\b(" + "|".join(map(re.escape, UNCOUNTED_COLUMNS)) + r")\b")


@lru_cache(maxsize=4096)
def _tables_in(statement: str) -> frozenset[str] | None:
    """The tables `statement` names; None when it names an uncounted column."""
    if _uncounted_words().search(statement):
        return None
    return frozenset(_table_words().findall(statement))


def tables_read(statements: Iterable[str], counted: frozenset[str]) -> frozenset[str] | None:
    """The tables `statements` name, or None when one of them has no change counter, or
    a statement names an uncounted column (its changes could not be seen: depend on every
    commit instead)."""
    tables: set[str] = set()
    for statement in statements:
        named = _tables_in(statement)
        if named is None:
            return None
        tables |= named
    return frozenset(tables) if tables <= counted else None


# The tables of this PostgreSQL database whose changes are counted (trigger and sequence
# present; none before migration 0070).
COUNTED_TABLES_SQL = (
    "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
    f"WHERE t.tgname = '{TRIGGER}' AND pg_table_is_visible(c.oid) "
    f"AND to_regclass('{SEQUENCE_PREFIX}' || c.relname) IS NOT NULL"
)


def counter_columns(tables: Iterable[str]) -> str:
    """SQL select-list items: each table's change counter, in the order given."""
    return ", ".join(f"(SELECT last_value FROM {sequence_name(t)})" for t in tables)


# SQLite: the tables whose changes are counted (a row in the counters table and its three
# triggers present; none before migration 0090, when the statement fails: no such table).
SQLITE_COUNTED_TABLES_SQL = (
    f"SELECT c.name FROM {SQLITE_TABLE} c WHERE (SELECT count(*) FROM sqlite_master m "
    f"WHERE m.type = 'trigger' AND m.tbl_name = c.name AND m.name IN ("
    f"'{SQLITE_TABLE}_' || c.name || '_insert', '{SQLITE_TABLE}_' || c.name || '_update', "
    f"'{SQLITE_TABLE}_' || c.name || '_delete')) = 3 ORDER BY c.name"
)


def sqlite_counters_sql(tables: Iterable[str]) -> str:
    """SQLite: the counters of `tables`, in the order given, as one row of values."""
    return "SELECT " + ", ".join(
        f"(SELECT changes FROM {SQLITE_TABLE} WHERE name = '{t}')" for t in tables
    )
