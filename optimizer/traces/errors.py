"""The one exception bad trace input raises."""

from __future__ import annotations

from pathlib import Path


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
        self.path = str(path)
        self.row = row
        self.column = column
        self.message = message
        where = [self.path]
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column!r}")
        super().__init__(f"{', '.join(where)}: {message}")

    def __reduce__(self) -> tuple[object, ...]:  # picklable across process pools
        return (_rebuild, (self.path, self.message, self.row, self.column))


def _rebuild(path: str, message: str, row: int | None, column: str | None) -> TraceFormatError:
    return TraceFormatError(path, message, row=row, column=column)
