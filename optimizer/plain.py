"""Strict round trip between frozen dataclasses and plain JSON data.

`to_plain` turns a dataclass (nested dataclasses, StrEnums) into dicts and
values; `from_plain(cls, data, where)` is its strict inverse: unknown keys,
missing fields and wrong types raise `PlainDataError` naming the dotted path
of the offending field (`config.replica.tp: expected an int, got str '2'`).
Field types are read from the dataclass's annotations: bool, int, float, str,
StrEnums, nested dataclasses and `X | None`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from enum import StrEnum


class PlainDataError(ValueError):
    """Plain data that does not describe the dataclass it was read as."""


def to_plain(value: object) -> object:
    """A dataclass as dicts and plain values (enums as their string values)."""
    if isinstance(value, StrEnum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in fields(value)}
    return value


def from_plain(cls: type, data: object, where: str) -> object:
    """`cls` built from plain `data` read at `where` (the dotted path in errors)."""
    if not isinstance(data, Mapping):
        raise PlainDataError(f"{where}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise PlainDataError(f"{where}: unknown keys {unknown}; expected some of {names}")
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise PlainDataError(f"{where}: {exc}") from exc


def _coerce(tp: object, value: object, where: str) -> object:
    if isinstance(tp, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        (tp,) = args
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        try:
            return tp(value)
        except ValueError:
            raise PlainDataError(
                f"{where}: expected one of {[m.value for m in tp]}, got {value!r}"
            ) from None
    if isinstance(tp, type) and is_dataclass(tp):
        return from_plain(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise PlainDataError(f"{where}: expected a bool, got {type(value).__name__} {value!r}")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise PlainDataError(f"{where}: expected an int, got {type(value).__name__} {value!r}")
        return value
    if tp is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise PlainDataError(
                f"{where}: expected a number, got {type(value).__name__} {value!r}"
            )
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise PlainDataError(
                f"{where}: expected a string, got {type(value).__name__} {value!r}"
            )
        return value
    raise PlainDataError(f"{where}: unsupported field type {tp!r}")  # pragma: no cover
