from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner


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
