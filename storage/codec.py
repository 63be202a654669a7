"""JSON documents of the core's dataclasses in the service's tables.

Each document is `optimizer.plain.to_plain(obj)` plus the `schema_version` of
its type (`SCHEMA_VERSIONS`); `from_json` is the strict inverse and refuses a
document of another version. Types with their own `to_dict` / `from_dict`
(TuneRequest, TuneOutcome) use those, which also read their older versions.
"""

from __future__ import annotations

from typing import Any, TypeVar

from optimizer.plain import PlainDataError, from_plain, to_plain

T = TypeVar("T")
DOCUMENT_VERSION = 3  # this build's layout of the service's documents (2: before 0140)


def to_json(obj: object) -> dict[str, Any]:
    to_dict = getattr(obj, "to_dict", None)
    if to_dict is not None:
        return to_dict()
    data = to_plain(obj)
    assert isinstance(data, dict)
    return {"schema_version": DOCUMENT_VERSION, **data}


def from_json(cls: type[T], data: dict[str, Any]) -> T:
    from_dict = getattr(cls, "from_dict", None)
    if from_dict is not None:
        return from_dict(data)
    data = dict(data)
    version = data.pop("schema_version", None)
    if version != DOCUMENT_VERSION:
        raise ValueError(
            f"{cls.__name__} document schema_version {version!r}, expected {DOCUMENT_VERSION}"
        )
    try:
        built = from_plain(cls, data, cls.__name__)
    except PlainDataError as exc:
        raise ValueError(str(exc)) from None
    return built  # type: ignore[return-value]
