"""Helpers shared by CLI commands: the console, the database, error exits."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Annotated, NoReturn

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

# `--latency-model`, as `simulate` and `observe` take it (both price as `tune` does).
LatencyModelOption = Annotated[
    int | None,
    typer.Option(
        help="stored latency model id (default: as `tune` prices: the newest fitted model "
        "per accelerator, else the roofline estimate)"
    ),
]


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
    from sqlalchemy.exc import OperationalError

    from api.settings import SettingsError, get_settings
    from storage.db import make_engine, upgrade_database

    try:
        settings = get_settings()
    except SettingsError as exc:
        fail(str(exc))
    try:
        upgrade_database(settings.database_url)
        return make_engine(settings.database_url)
    except OperationalError as exc:
        fail(database_error(settings.database_url, exc))


def database_error(url: str, exc: BaseException) -> str:
    """One line for a database that cannot be opened (its password never shown)."""
    from sqlalchemy.engine import make_url

    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL: show none of it
        shown = "SERVETUNE_DATABASE_URL"
    first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    reason = first[0] if first else type(exc).__name__
    return f"cannot open the database {shown}: {reason}"


def output_dir(out: Path, option: str = "--out") -> Path:
    """A folder to write into, made now (before any long run), or a clear error."""
    if out.exists() and not out.is_dir():
        fail(f"{option} {out}: exists and is not a folder; expected a folder for the outputs")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"{option} {out}: cannot create the folder: {exc.strerror or exc}")
    return out


def output_file(path: Path, option: str = "--out") -> Path:
    """A file path whose folder exists and that is not a folder itself."""
    if path.is_dir():
        fail(f"{option} {path}: is a folder; expected a file name")
    if not path.parent.is_dir():
        fail(f"{option} {path}: the folder {path.parent} does not exist")
    return path


@contextmanager
def session() -> Iterator[Session]:
    from storage.db import session_scope

    with session_scope(engine()) as s:
        yield s
