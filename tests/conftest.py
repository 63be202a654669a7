"""Shared test fixtures: real-data location, database back-ends, slow-test gating.

- `shared_data` (fixture): the path of ../shared/data; tests using it skip with a
  visible reason when it is absent, and fail instead when
  SERVETUNE_REQUIRE_SHARED_DATA=1 (CI).
- `aic_package` (fixture): the installed aiconfigurator-core (the `aic` extra), located
  without importing it; tests using it skip with a visible reason when it is absent,
  and fail instead when SERVETUNE_REQUIRE_AIC=1.
- `cli_db`, `runner` (fixtures): the CLI on a fresh SQLite file, and typer's CliRunner
  (api_tests and the profiler's end-to-end observe test drive the CLI).
- `db_url` (fixture, parametrised over sqlite and postgresql): PostgreSQL tests
  skip with a visible reason when no server answers, and fail instead when
  SERVETUNE_REQUIRE_POSTGRES=1 (CI).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SERVETUNE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
POSTGRES_URL = os.environ.get(
    "SERVETUNE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _required(var: str) -> bool:
    return os.environ.get(var, "").lower() in ("1", "true", "yes")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow") or _required("SERVETUNE_RUN_SLOW"):
        return
    skip = pytest.mark.skip(reason="slow: pass --runslow or set SERVETUNE_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _unavailable(what: str, env_var: str) -> None:
    if _required(env_var):
        pytest.fail(f"{what} is required here ({env_var}=1) but is not available")
    pytest.skip(f"{what} not available (set {env_var}=1 to make this a failure)")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared real-data folder (traces and GPU kernel tables)."""
    if not (SHARED_DATA / "traces").is_dir():
        _unavailable(f"shared data folder {SHARED_DATA}", "SERVETUNE_REQUIRE_SHARED_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session")
def aic_package():
    """The installed aiconfigurator-core's systems folder and version (an AicPackage)."""
    from profiler.importers.aiconfigurator_package import PackageNotInstalled, locate_package

    try:
        return locate_package()
    except PackageNotInstalled:
        _unavailable("aiconfigurator-core (pip install 'servetune[aic]')", "SERVETUNE_REQUIRE_AIC")


_pg_checked: dict[str, str | None] = {}


def _postgres_error() -> str | None:
    """None when the PostgreSQL server answers, else why not (checked once)."""
    if "err" not in _pg_checked:
        try:
            import sqlalchemy as sa

            engine = sa.create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
            with engine.connect() as conn:
                conn.execute(sa.text("select 1"))
            engine.dispose()
            _pg_checked["err"] = None
        except Exception as exc:
            _pg_checked["err"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return _pg_checked["err"]


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database schema-isolated for one test."""
    err = _postgres_error()
    if err is not None:
        _unavailable(f"PostgreSQL at {POSTGRES_URL} ({err})", "SERVETUNE_REQUIRE_POSTGRES")
    import sqlalchemy as sa

    name = f"st_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Database URL for each back-end; storage suites run once per back-end."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'servetune.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def cli_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Point the CLI at a fresh SQLite file; clear the cached settings and engine."""
    from api.cli import common
    from api.settings import get_settings

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("SERVETUNE_DATABASE_URL", url)
    get_settings.cache_clear()
    common.engine.cache_clear()
    yield url
    common.engine.cache_clear()
    get_settings.cache_clear()


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()
