"""API keys: created once (the token is shown only then), stored as a sha256 hash.

A key is 32 random bytes (URL-safe base64) prefixed `st_`. Only its sha256 is
stored; lookups hash the presented key and compare with `hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from storage.listing import count_rows, page_rows
from storage.models import ApiKeyRow
from storage.service_records import ApiKeyInfo, Principal

KEY_PREFIX = "st_"


class KeyNotFound(LookupError):
    def __init__(self, key_id: int) -> None:
        super().__init__(f"API key {key_id} not found")
        self.key_id = key_id


def hash_key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _info(row: ApiKeyRow | sa.Row) -> ApiKeyInfo:
    return ApiKeyInfo(
        id=row.id,
        project=row.project,
        name=row.name,
        prefix=row.prefix,
        is_admin=row.is_admin,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )


def check_project_name(project: str) -> str:
    if not (1 <= len(project) <= 100) or not all(c.isalnum() or c in "-_." for c in project):
        raise ValueError(f"project {project!r}: expected 1 to 100 letters, digits, '-', '_' or '.'")
    return project


def create_key(
    session: Session, *, project: str, name: str = "", is_admin: bool = False
) -> tuple[ApiKeyInfo, str]:
    """Store a new key and return (info, token); the token is never stored."""
    check_project_name(project)
    token = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKeyRow(
        project=project,
        name=name[:200],
        key_hash=hash_key(token),
        prefix=token[:10],
        is_admin=is_admin,
        created_at=datetime.now(UTC),
    )
    session.add(row)
    session.flush()
    return _info(row), token


_BY_HASH = sa.select(
    ApiKeyRow.id, ApiKeyRow.project, ApiKeyRow.is_admin, ApiKeyRow.revoked_at, ApiKeyRow.key_hash
).where(ApiKeyRow.key_hash == sa.bindparam("digest"))


def authenticate(session: Session, token: str) -> Principal | None:
    """The principal a presented key stands for, or None (unknown or revoked). A plain
    select, prepared once: every API request runs it."""
    digest = hash_key(token)
    row = session.connection().execute(_BY_HASH, {"digest": digest}).first()
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(row.key_hash, digest):
        return None
    return Principal(key_id=row.id, project=row.project, is_admin=row.is_admin)


def list_keys(
    session: Session,
    *,
    project: str | None = None,
    limit: int = 100,
    offset: int = 0,
    after: int | None = None,
) -> list[ApiKeyInfo]:
    """Oldest first; `after`: only keys with a larger id (a keyset cursor)."""
    rows = page_rows(
        session, _KEYS, where={"project": project}, limit=limit, offset=offset, after=after
    )
    return [_info(r) for r in rows]


def count_keys(session: Session, *, project: str | None = None) -> int:
    return count_rows(session, _KEYS, where={"project": project})


_KEYS = ApiKeyRow.__table__


def revoke_key(session: Session, key_id: int, *, project: str | None = None) -> ApiKeyInfo:
    """Revoke a key (of `project` only, when given: another project's key is not found)."""
    row = session.get(ApiKeyRow, key_id)
    if row is None or (project is not None and row.project != project):
        raise KeyNotFound(key_id)
    if row.revoked_at is None:
        row.revoked_at = datetime.now(UTC)
        session.flush()
    return _info(row)
