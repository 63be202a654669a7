"""Validated settings from SERVETUNE_* environment variables, built on first use.

A frozen dataclass read by `Settings.from_env` (each field from SERVETUNE_<NAME>)
and checked on construction; a bad value raises `SettingsError` naming the
variable, what was found and what was expected. Plain Python on purpose: every
CLI command reads the settings, and pydantic-settings cost ~0.15 s of each start.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

PREFIX = "SERVETUNE_"
# Variables servetune no longer reads, and why: a warning names them when set.
RETIRED = {
    "RESPONSE_CACHE_S": "every answer is read from the database",
}
log = logging.getLogger(__name__)


class SettingsError(ValueError):
    """A SERVETUNE_* variable holds a value servetune cannot use."""


def default_database_url() -> str:
    from platformdirs import user_data_dir

    return f"sqlite:///{Path(user_data_dir('servetune', appauthor=False)) / 'servetune.db'}"


# field -> (lowest, highest, inclusive low) for the numeric settings
_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "max_upload_bytes": (0, math.inf, False),
    "max_profile_bytes": (0, math.inf, False),
    "max_profile_unpacked_bytes": (0, math.inf, False),
    "max_trace_rows": (0, math.inf, False),
    "lease_s": (2, math.inf, True),
    "worker_poll_s": (0, 60, False),
    "key_cache_s": (0, 10, True),
    "native_threads": (1, 256, True),
}


@dataclass(frozen=True, slots=True)
class Settings:
    """All knobs of the CLI and service (see the README's configuration table)."""

    # SQLAlchemy URL; default: a SQLite file in the user's data directory
    database_url: str = field(default_factory=default_database_url)
    max_upload_bytes: int = 2 * 1024**3  # largest trace file accepted
    max_profile_bytes: int = 512 * 1024**2  # largest uploaded profile archive or CSV
    max_profile_unpacked_bytes: int = 4 * 1024**3  # most bytes an archive may unpack to
    max_trace_rows: int = 50_000_000  # most requests in one trace
    upload_dir: str | None = None  # temp folder for uploads (default: the system's)
    lease_s: float = 30.0  # job lease; a silent worker's job is taken over
    worker_poll_s: float = 1.0  # heartbeat and queue polling period
    # API-key lookups are kept this long; a key revoked elsewhere works at most this long
    key_cache_s: float = 2.0
    # native (OpenMP/BLAS) threads for fitting latency models and compiling their tables;
    # results are identical for any value, and more than 1 oversubscribes a small machine
    native_threads: int = 1
    embedded_worker: bool | None = None  # a worker thread inside `serve` (default: SQLite only)

    def __post_init__(self) -> None:
        for name, (low, high, inclusive) in _BOUNDS.items():
            value = getattr(self, name)
            ok = (low <= value if inclusive else low < value) and value <= high
            if isinstance(value, bool) or not ok:
                bound = f"{'>=' if inclusive else '>'} {low:g}" + (
                    f" and <= {high:g}" if math.isfinite(high) else ""
                )
                raise SettingsError(f"{PREFIX}{name.upper()}: expected a value {bound}, "
                                    f"got {value!r}")  # fmt: skip
        object.__setattr__(self, "database_url", _check_url(self.database_url))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from SERVETUNE_* variables of `environ` (default: the process's)."""
        environ = os.environ if environ is None else environ
        for name, why in RETIRED.items():
            if PREFIX + name in environ:
                log.warning("%s%s is no longer used: %s", PREFIX, name, why)
        values: dict[str, object] = {}
        for f in fields(cls):
            text = environ.get(PREFIX + f.name.upper())
            if text is not None:
                values[f.name] = _parse(f.name, str(f.type), text)
        return cls(**values)


def _parse(name: str, kind: str, text: str) -> object:
    where = f"{PREFIX}{name.upper()}"
    text = text.strip()
    try:
        if kind == "int":
            return int(text.replace("_", ""))
        if kind == "float":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
    except ValueError:
        raise SettingsError(f"{where}: expected a number, got {text!r}") from None
    if kind.startswith("bool"):
        if text == "" and "None" in kind:
            return None
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{where}: expected true or false, got {text!r}")
    if "None" in kind and text == "":
        return None
    return text


def _check_url(value: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(value)
    except ArgumentError as exc:
        raise SettingsError(f"SERVETUNE_DATABASE_URL is not a database URL: {value!r}") from exc
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise SettingsError(
            f"SERVETUNE_DATABASE_URL back-end {url.get_backend_name()!r} is not supported; "
            "use sqlite:///path or postgresql+psycopg://user@host/db"
        )
    if url.get_backend_name() == "postgresql" and url.drivername == "postgresql":
        value = value.replace("postgresql://", "postgresql+psycopg://", 1)
    return value


@lru_cache
def get_settings() -> Settings:
    return Settings.from_env()
