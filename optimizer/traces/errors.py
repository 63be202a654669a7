"""The one exception bad trace input raises."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

MAX_ECHO_CHARS = 200  # of one value quoted back from the input
MAX_ECHO_ITEMS = 20  # of a list (columns, keys) quoted back
MAX_MESSAGE_CHARS = 2000  # of a whole message


def clip(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """`repr`-free text of an input value, cut to `limit` characters (saying how much
    more there was): errors quote input, and input can be a 250 MB line."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def clip_list(items: Sequence[object], limit: int = MAX_ECHO_ITEMS) -> str:
    """The first `limit` items, each clipped, as a list literal (saying how many more)."""
    shown = ", ".join(repr(clip(i)) for i in items[:limit])
    more = f", ... ({len(items) - limit:,} more)" if len(items) > limit else ""
    return f"[{shown}{more}]"


class TraceFormatError(ValueError):
    """A trace file that cannot be ingested: what was found, where, what was expected.

    `row` is the 1-based data row (the CSV header is not counted; JSONL counts
    records), or None when the problem is not tied to one row. `column` is the
    column or key, or None.
    """

    def __init__(
        self,
        path: str | Path,
        message: str,
        *,
        row: int | None = None,
        column: str | None = None,
    ) -> None:
        self.path = clip(str(path))
        self.row = row
        self.column = None if column is None else clip(column)
        self.message = clip(message, MAX_MESSAGE_CHARS)
        where = [self.path]
        if row is not None:
            where.append(f"row {row}")
        if self.column is not None:
            where.append(f"column {self.column!r}")
        super().__init__(f"{', '.join(where)}: {self.message}")

    def __reduce__(self) -> tuple[object, ...]:  # picklable across process pools
        return (_rebuild, (self.path, self.message, self.row, self.column))


def _rebuild(path: str, message: str, row: int | None, column: str | None) -> TraceFormatError:
    return TraceFormatError(path, message, row=row, column=column)
