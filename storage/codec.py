"""JSON round trip of the service's dataclasses, with a `schema_version` on each document."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any, TypeVar

from pydantic import TypeAdapter

from storage.tuning_records import TUNING_SCHEMA_VERSION

T = TypeVar("T")


@lru_cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def to_json(obj: object) -> dict[str, Any]:
    data = _adapter(type(obj)).dump_python(obj, mode="json")
    data["schema_version"] = TUNING_SCHEMA_VERSION
    return data


def from_json(cls: type[T], data: dict[str, Any]) -> T:
    data = dict(data)
    version = data.pop("schema_version", None)
    if version != TUNING_SCHEMA_VERSION:
        raise ValueError(f"{cls.__name__} schema_version {version!r}, expected 1")
    return _adapter(cls).validate_python(data)


def plain(obj: object) -> dict[str, Any]:
    """A dataclass as plain JSON-ready data (no schema_version)."""
    assert dataclasses.is_dataclass(obj)
    return _adapter(type(obj)).dump_python(obj, mode="json")
