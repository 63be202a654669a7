"""The storage suites' database: migrated to the newest revision, on every back-end of
`db_url` (SQLite and a fresh PostgreSQL database per test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine

from storage.db import make_engine, upgrade_database


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    upgrade_database(db_url)
    eng = make_engine(db_url)
    yield eng
    eng.dispose()
