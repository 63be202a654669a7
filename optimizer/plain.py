"""Strict round trip between frozen dataclasses and plain JSON data.

`to_plain` turns a dataclass (nested dataclasses, StrEnums, tuples, mappings)
into dicts, lists and values; `from_plain(cls, data, where)` is its strict
inverse: unknown keys, missing fields and wrong types raise `PlainDataError`
naming the dotted path of the offending field (`config.replica.tp: expected an
int, got str '2'`). Field types are read from the dataclass's annotations:
bool, int, float, str, StrEnums, nested dataclasses, `tuple[X, ...]`,
`Mapping[str, Any]` / `dict[str, Any]` (kept as plain JSON), `Any` and `X | None`.

JSON has no NaN: a float NaN is written as null, and null read into a field
typed plain `float` is NaN again (a percentile of no requests, say).
Fields declared with `init=False` are derived: written, ignored when read.
"""

from __future__ import annotations

import collections.abc
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from enum import StrEnum


class PlainDataError(ValueError):
    """Plain data that does not describe the dataclass it was read as."""


def to_plain(value: object) -> object:
    """A dataclass as dicts, lists and plain values (enums as their string values)."""
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (tuple, list)):
        return [to_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


def from_plain(cls: type, data: object, where: str) -> object:
    """`cls` built from plain `data` read at `where` (the dotted path in errors)."""
    return _reader(cls)(data, where)


@functools.cache
def _layout(cls: type) -> tuple[dict[str, object], list[str], frozenset[str]]:
    """A dataclass's resolved field types, settable field names and derived field names
    (resolving the annotations costs ~0.1 ms a class, more than reading a document)."""
    hints = typing.get_type_hints(cls)
    settable = [f.name for f in fields(cls) if f.init]
    return hints, settable, frozenset(f.name for f in fields(cls) if not f.init)


def _type_name(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


Reader = Callable[[object, str], object]


@functools.cache
def _reader(tp: object) -> Reader:
    """How to read plain values as type `tp`, worked out once per type: a function of
    (value, where) that returns the value read or raises `PlainDataError` naming
    `where`. (Working out a type's kind on every value took most of a document's
    reading time.)"""
    origin = typing.get_origin(tp)
    if isinstance(tp, types.UnionType) or origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _optional(args[0]) if len(args) == 1 else _unsupported(tp)
    if tp is typing.Any:
        return _as_is
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return _tuple_of(args[0])
        return _fixed_tuple(args)
    if origin in (dict, collections.abc.Mapping):
        return _mapping
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        return _enum(tp)
    if isinstance(tp, type) and is_dataclass(tp):
        return _dataclass(tp)
    return _SCALARS.get(tp) or _unsupported(tp)


def _optional(tp: object) -> Reader:
    def read(value: object, where: str) -> object:
        return None if value is None else inner(value, where)

    inner = _reader(tp)
    return read


def _as_is(value: object, where: str) -> object:
    return value


def _tuple_of(tp: object) -> Reader:
    item = _reader(tp)

    def read(value: object, where: str) -> object:
        if not isinstance(value, (list, tuple)):
            raise PlainDataError(f"{where}: expected a list, got {_type_name(value)}")
        return tuple([item(v, f"{where}[{i}]") for i, v in enumerate(value)])

    return read


def _fixed_tuple(args: tuple[object, ...]) -> Reader:
    items = [_reader(a) for a in args]

    def read(value: object, where: str) -> object:
        if not isinstance(value, (list, tuple)):
            raise PlainDataError(f"{where}: expected a list, got {_type_name(value)}")
        if len(items) != len(value):
            raise PlainDataError(f"{where}: expected {len(items)} values, got {len(value)}")
        pairs = enumerate(zip(items, value, strict=True))
        return tuple([item(v, f"{where}[{i}]") for i, (item, v) in pairs])

    return read


def _mapping(value: object, where: str) -> object:
    if not isinstance(value, Mapping):
        raise PlainDataError(f"{where}: expected a mapping, got {_type_name(value)}")
    return dict(value)


def _enum(tp: type[StrEnum]) -> Reader:
    def read(value: object, where: str) -> object:
        try:
            return tp(value)
        except ValueError:
            raise PlainDataError(
                f"{where}: expected one of {[m.value for m in tp]}, got {value!r}"
            ) from None

    return read


def _dataclass(cls: type) -> Reader:
    hints, settable, derived = _layout(cls)
    known = frozenset(settable) | derived
    fields_read: dict[str, Reader] = {}  # on first use: a class may hold its own type

    def read(data: object, where: str) -> object:
        if not isinstance(data, Mapping):
            raise PlainDataError(f"{where}: expected a mapping, got {type(data).__name__} {data!r}")
        if not known.issuperset(data):
            unknown = sorted(set(data) - known)
            raise PlainDataError(f"{where}: unknown keys {unknown}; expected some of {settable}")
        if not fields_read:
            fields_read.update((k, _reader(hints[k])) for k in settable)
        kwargs = {k: fields_read[k](v, f"{where}.{k}") for k, v in data.items() if k not in derived}
        try:
            return cls(**kwargs)
        except TypeError as exc:  # a required field is missing
            raise PlainDataError(f"{where}: {exc}") from exc

    return read


def _bool(value: object, where: str) -> object:
    if not isinstance(value, bool):
        raise PlainDataError(f"{where}: expected a bool, got {_type_name(value)}")
    return value


def _int(value: object, where: str) -> object:
    if not isinstance(value, int) or isinstance(value, bool):
        raise PlainDataError(f"{where}: expected an int, got {_type_name(value)}")
    return value


def _float(value: object, where: str) -> object:
    if value is None:
        return math.nan
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise PlainDataError(f"{where}: expected a number, got {_type_name(value)}")
    return float(value)


def _str(value: object, where: str) -> object:
    if not isinstance(value, str):
        raise PlainDataError(f"{where}: expected a string, got {_type_name(value)}")
    return value


_SCALARS: dict[object, Reader] = {bool: _bool, int: _int, float: _float, str: _str}


def _unsupported(tp: object) -> Reader:
    def read(value: object, where: str) -> object:  # pragma: no cover
        raise PlainDataError(f"{where}: unsupported field type {tp!r}")

    return read
