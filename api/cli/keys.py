"""`servetune keys`: create, list and revoke API keys (local administration)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from api.cli.common import console, fail, session

app = typer.Typer(help="API keys for the REST service.", no_args_is_help=True)


@app.command("create")
def create(
    project: Annotated[str, typer.Option(help="the project the key may see")],
    name: Annotated[str, typer.Option(help="a label, e.g. who uses the key")] = "",
    admin: Annotated[bool, typer.Option("--admin", help="may manage keys over the API")] = False,
) -> None:
    """Create a key and print it once (only its hash is stored)."""
    from storage.keys import create_key

    try:
        with session() as s:
            info, token = create_key(s, project=project, name=name, is_admin=admin)
    except ValueError as exc:
        fail(str(exc))
    console.print(
        f"key {info.id} for project [bold]{info.project}[/]"
        f"{' (admin)' if info.is_admin else ''}; shown only now:",
        highlight=False,
    )
    print(token)


@app.command("list")
def list_(
    project: Annotated[str | None, typer.Option(help="only this project")] = None,
) -> None:
    """List keys (never the keys themselves: their id, prefix and scope)."""
    from storage.keys import list_keys

    with session() as s:
        keys = list_keys(s, project=project, limit=10_000)
    table = Table("id", "project", "name", "prefix", "admin", "created (UTC)", "revoked")
    for k in keys:
        table.add_row(
            str(k.id),
            k.project,
            k.name,
            k.prefix + "…",
            "yes" if k.is_admin else "",
            f"{k.created_at:%Y-%m-%d %H:%M}",
            f"{k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "",
        )
    console.print(table if keys else "no keys yet: `servetune keys create --project P`")


@app.command("revoke")
def revoke(key_id: Annotated[int, typer.Argument(help="key id (see `keys list`)")]) -> None:
    """Revoke a key; requests with it are refused from now on."""
    from storage.keys import KeyNotFound, revoke_key

    try:
        with session() as s:
            info = revoke_key(s, key_id)
    except KeyNotFound as exc:
        fail(str(exc))
    console.print(f"key {info.id} ({info.project}) revoked")
