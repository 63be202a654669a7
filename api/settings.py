"""Validated settings from SERVETUNE_* environment variables, built on first use."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from platformdirs import user_data_dir
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_database_url() -> str:
    return f"sqlite:///{Path(user_data_dir('servetune', appauthor=False)) / 'servetune.db'}"


class Settings(BaseSettings):
    """All knobs of the CLI and service. Each field reads SERVETUNE_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="SERVETUNE_", extra="ignore")

    database_url: str = Field(
        default_factory=default_database_url,
        description="SQLAlchemy URL; default: a SQLite file in the user's data directory",
    )
    max_upload_bytes: int = Field(2 * 1024**3, gt=0, description="largest trace file accepted")
    max_profile_bytes: int = Field(
        512 * 1024**2, gt=0, description="largest uploaded profile archive or CSV accepted"
    )
    max_profile_unpacked_bytes: int = Field(
        4 * 1024**3, gt=0, description="most bytes an uploaded profile archive may unpack to"
    )
    max_trace_rows: int = Field(50_000_000, gt=0, description="most requests in one trace")
    upload_dir: str | None = Field(None, description="temp folder for uploads (default: system)")
    lease_s: float = Field(30.0, ge=2, description="job lease; a silent worker's job is taken over")
    worker_poll_s: float = Field(1.0, gt=0, le=60, description="heartbeat and queue polling period")
    key_cache_s: float = Field(
        2.0,
        ge=0,
        le=10,
        description="API-key lookups are cached this long; a key revoked outside this process "
        "keeps working at most this long (0: look up every request)",
    )
    response_cache_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="the latest-recommendation answer is cached this long per project and "
        "filter; a new recommendation is served within this delay (0: no cache)",
    )
    embedded_worker: bool | None = Field(
        None, description="run a worker thread inside `serve` (default: only with SQLite)"
    )

    @field_validator("database_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            url = make_url(value)
        except ArgumentError as exc:
            raise ValueError(f"SERVETUNE_DATABASE_URL is not a database URL: {value!r}") from exc
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(
                f"SERVETUNE_DATABASE_URL back-end {url.get_backend_name()!r} is not supported; "
                "use sqlite:///path or postgresql+psycopg://user@host/db"
            )
        if url.get_backend_name() == "postgresql" and url.drivername == "postgresql":
            value = value.replace("postgresql://", "postgresql+psycopg://", 1)
        return value


@lru_cache
def get_settings() -> Settings:
    return Settings()
