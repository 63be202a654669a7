"""Helpers shared by CLI commands: the console, the database, error exits."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

# Output sent to a pipe or file keeps its table columns (rich would assume 80 and
# truncate the Pareto table's 12 columns to "goo…"); a terminal or COLUMNS decides.
PIPED_WIDTH = 160
_piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
console = Console(width=PIPED_WIDTH if _piped else None)
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def trace_source(trace: str) -> Path | int:
    """A `--trace` value: an existing trace file, else a stored trace id."""
    path = Path(trace)
    if path.exists():
        return path
    if not trace.isdigit():
        fail(f"--trace {trace!r}: expected a stored trace id or an existing trace file")
    return int(trace)


@lru_cache
def engine() -> Engine:
    """The configured database, migrated to the newest schema."""
    from api.settings import SettingsError, get_settings
    from storage.db import make_engine, upgrade_database

    try:
        settings = get_settings()
    except SettingsError as exc:
        fail(str(exc))
    upgrade_database(settings.database_url)
    return make_engine(settings.database_url)


@contextmanager
def session() -> Iterator[Session]:
    from storage.db import session_scope

    with session_scope(engine()) as s:
        yield s
