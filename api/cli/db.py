"""`servetune db`: schema migrations."""

from __future__ import annotations

import typer

from api.cli.common import console

app = typer.Typer(help="Database schema.", no_args_is_help=True)


@app.command("upgrade")
def upgrade(revision: str = typer.Argument("head", help="target migration revision")) -> None:
    """Apply migrations to the configured database (SERVETUNE_DATABASE_URL)."""
    from api.settings import get_settings
    from storage.db import current_revision, upgrade_database

    url = get_settings().database_url
    upgrade_database(url, revision)
    console.print(f"database at revision [bold]{current_revision(url)}[/]")


@app.command("current")
def current() -> None:
    """Show the applied migration revision."""
    from api.settings import get_settings
    from storage.db import current_revision, head_revision

    rev = current_revision(get_settings().database_url)
    console.print(f"current: {rev or '(empty database)'}; newest: {head_revision()}")
