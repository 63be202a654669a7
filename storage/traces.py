"""Trace persistence: atomic, idempotent ingest and fast columnar load.

Bulk paths: SQLite uses `executemany` on the raw connection inside the
session's transaction, `_BULK_ROWS` rows at a time (the driver binds Python values,
so only one block of them exists at once); PostgreSQL uses `COPY ... FROM STDIN`
(CSV written by polars, a block at a time). Both stay inside the caller's
transaction, so a failure leaves nothing behind.

Loads read a trace in arrival (seq) order straight into numpy columns: on SQLite the
driver's rows are consumed by `np.fromiter` a block at a time into preallocated
arrays (no list of rows); on PostgreSQL the server packs each column into one bytea.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
from datetime import UTC, datetime

import numpy as np
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from optimizer.plain import PlainDataError, from_plain, to_plain
from optimizer.records import (
    PLAUSIBILITY_SCHEMA_VERSION,
    STATS_SCHEMA_VERSION,
    SYNTHETIC_SCHEMA_VERSION,
    SyntheticOrigin,
    TokenStats,
    TraceColumns,
    TraceFormat,
    TraceInfo,
    TraceStats,
    TraceWarning,
)
from storage.listing import count_rows, page_rows
from storage.models import TraceRequestRow, TraceRow

_COLS = (
    "trace_id",
    "seq",
    "arrival_s",
    "input_tokens",
    "output_tokens",
    "prefix_hashes",
    "session_id",
    "acceptance_length",
)

_BULK_ROWS = 200_000  # rows bound or written per block by the bulk insert

DEFAULT_PROJECT = "default"


class TraceNotFound(LookupError):
    def __init__(self, trace_id: int) -> None:
        super().__init__(f"trace {trace_id} not found")
        self.trace_id = trace_id


def stats_to_json(stats: TraceStats) -> dict:
    data = dataclasses.asdict(stats)
    data["warnings"] = list(stats.warnings)
    data["schema_version"] = STATS_SCHEMA_VERSION
    return data


def stats_from_json(data: dict) -> TraceStats:
    data = dict(data)
    version = data.pop("schema_version", None)
    if version != STATS_SCHEMA_VERSION:
        raise ValueError(f"trace stats schema_version {version!r}, expected {STATS_SCHEMA_VERSION}")
    data["input_tokens"] = TokenStats(**data["input_tokens"])
    data["output_tokens"] = TokenStats(**data["output_tokens"])
    data["warnings"] = tuple(data.get("warnings", ()))
    return TraceStats(**data)


def plausibility_to_json(warnings: tuple[TraceWarning, ...]) -> dict:
    return {
        "schema_version": PLAUSIBILITY_SCHEMA_VERSION,
        "warnings": [to_plain(w) for w in warnings],
    }


def plausibility_from_json(data: dict) -> tuple[TraceWarning, ...]:
    version = data.get("schema_version")
    if version != PLAUSIBILITY_SCHEMA_VERSION:
        raise ValueError(
            f"trace plausibility_warnings schema_version {version!r}, "
            f"expected {PLAUSIBILITY_SCHEMA_VERSION}"
        )
    try:
        return tuple(
            from_plain(TraceWarning, w, f"plausibility_warnings[{i}]")
            for i, w in enumerate(data["warnings"])
        )
    except PlainDataError as exc:
        raise ValueError(str(exc)) from None


def synthetic_to_json(origin: SyntheticOrigin) -> dict:
    return {"schema_version": SYNTHETIC_SCHEMA_VERSION, "origin": to_plain(origin)}


def synthetic_from_json(data: dict | None) -> SyntheticOrigin | None:
    if data is None:
        return None
    version = data.get("schema_version")
    if version != SYNTHETIC_SCHEMA_VERSION:
        raise ValueError(
            f"trace synthetic schema_version {version!r}, expected {SYNTHETIC_SCHEMA_VERSION}"
        )
    try:
        return from_plain(SyntheticOrigin, data["origin"], "synthetic.origin")
    except PlainDataError as exc:
        raise ValueError(str(exc)) from None


def _info(row: TraceRow | sa.Row) -> TraceInfo:
    return TraceInfo(
        id=row.id,
        name=row.name,
        source_format=TraceFormat(row.source_format),
        content_hash=row.content_hash,
        created_at=row.created_at,
        stats=stats_from_json(row.stats),
        project=row.project,
        stream=row.stream,
        plausibility_warnings=plausibility_from_json(row.plausibility_warnings),
        synthetic=synthetic_from_json(row.synthetic),
    )


def find_trace_by_hash(
    session: Session, content_hash: str, *, project: str = DEFAULT_PROJECT
) -> TraceInfo | None:
    row = session.scalar(
        sa.select(TraceRow).where(
            TraceRow.project == project, TraceRow.content_hash == content_hash
        )
    )
    return None if row is None else _info(row)


def _row(session: Session, trace_id: int, project: str | None) -> TraceRow:
    """The trace row; another project's trace is reported as missing, like a wrong id."""
    row = session.get(TraceRow, trace_id)
    if row is None or (project is not None and row.project != project):
        raise TraceNotFound(trace_id)
    return row


# The description by id as a plain select: `session.get`'s identity-map bookkeeping costs
# more than the query (~0.1 ms), and GET /v1/traces/{id} is among the busiest reads.
_TRACE_BY_ID = sa.select(TraceRow.__table__).where(TraceRow.__table__.c.id == sa.bindparam("id"))


def get_trace(session: Session, trace_id: int, *, project: str | None = None) -> TraceInfo:
    """A stored trace; `project=None` (the local CLI) sees every project; another project's
    trace is reported as missing, like a wrong id."""
    row = session.execute(_TRACE_BY_ID, {"id": trace_id}).first()
    if row is None or (project is not None and row.project != project):
        raise TraceNotFound(trace_id)
    return _info(row)


def list_traces(
    session: Session,
    *,
    limit: int = 100,
    offset: int = 0,
    project: str | None = None,
    stream: str | None = None,
    after: int | None = None,
) -> list[TraceInfo]:
    """Oldest first; `after`: only traces with a larger id (a keyset cursor)."""
    where = {"project": project, "stream": stream}
    rows = page_rows(session, _TRACES, where=where, limit=limit, offset=offset, after=after)
    return [_info(r) for r in rows]


def count_traces(session: Session, *, project: str | None = None, stream: str | None = None) -> int:
    return count_rows(session, _TRACES, where={"project": project, "stream": stream})


_TRACES = TraceRow.__table__


def traces_in_window(
    session: Session, *, project: str, stream: str, since: datetime
) -> list[TraceInfo]:
    """The stream's uploads created at or after `since`, oldest first (a rolling window)."""
    rows = session.scalars(
        sa.select(TraceRow)
        .where(TraceRow.project == project, TraceRow.stream == stream)
        .where(TraceRow.created_at >= since)
        .order_by(TraceRow.created_at, TraceRow.id)
    )
    return [_info(r) for r in rows]


def newest_upload(session: Session, *, project: str, stream: str) -> TraceInfo | None:
    """The stream's newest upload (None: it has none)."""
    row = session.scalars(
        sa.select(TraceRow)
        .where(TraceRow.project == project, TraceRow.stream == stream)
        .order_by(TraceRow.created_at.desc(), TraceRow.id.desc())
        .limit(1)
    ).first()
    return None if row is None else _info(row)


def delete_trace(session: Session, trace_id: int, *, project: str | None = None) -> None:
    row = _row(session, trace_id, project)
    # Explicit child delete: fast on both back-ends and independent of FK pragmas.
    session.execute(sa.delete(TraceRequestRow).where(TraceRequestRow.trace_id == trace_id))
    session.delete(row)
    session.flush()


def store_trace(
    session: Session,
    *,
    name: str,
    source_format: TraceFormat,
    content_hash: str,
    columns: TraceColumns,
    stats: TraceStats,
    project: str = DEFAULT_PROJECT,
    stream: str | None = None,
    plausibility_warnings: tuple[TraceWarning, ...] = (),
    synthetic: SyntheticOrigin | None = None,
) -> tuple[TraceInfo, bool]:
    """Store a trace and its requests, with what ingest's plausibility checks found (or,
    for a synthetic trace, how it was made); return (info, created).

    Idempotent by content hash within a project: when the same content is already stored, the
    existing trace is returned with created=False and nothing is written. The
    caller's transaction (see `session_scope`) makes the insert atomic.
    """
    existing = find_trace_by_hash(session, content_hash, project=project)
    if existing is not None:
        return existing, False
    row = TraceRow(
        project=project,
        stream=stream,
        name=name,
        source_format=str(source_format),
        content_hash=content_hash,
        created_at=datetime.now(UTC),
        num_requests=len(columns),
        stats=stats_to_json(stats),
        plausibility_warnings=plausibility_to_json(plausibility_warnings),
        synthetic=None if synthetic is None else synthetic_to_json(synthetic),
    )
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        # A concurrent ingest of the same file won the race.
        existing = find_trace_by_hash(session, content_hash, project=project)
        if existing is None:
            raise
        return existing, False
    _bulk_insert_requests(session, row.id, columns)
    return _info(row), True


def _hash_blobs(columns: TraceColumns) -> list[bytes | None]:
    if columns.prefix_hashes is None:
        return [None] * len(columns)
    return [np.asarray(h, dtype="<i8").tobytes() for h in columns.prefix_hashes]


def _optional(columns: TraceColumns) -> tuple[list, list, list]:
    n = len(columns)
    hashes = _hash_blobs(columns)
    sessions = list(columns.session_ids) if columns.session_ids is not None else [None] * n
    if columns.acceptance_length is None:
        accept: list = [None] * n
    else:
        accept = [None if np.isnan(v) else float(v) for v in columns.acceptance_length.tolist()]
    return hashes, sessions, accept


def _bulk_insert_requests(session: Session, trace_id: int, columns: TraceColumns) -> None:
    conn = session.connection()
    raw = conn.connection.driver_connection
    n = len(columns)
    plain = (
        columns.prefix_hashes is None
        and columns.session_ids is None
        and columns.acceptance_length is None
    )
    if conn.dialect.name == "postgresql":
        _copy_in(raw, trace_id, columns, plain)
        return
    cur = raw.cursor()
    try:
        if plain:
            # A block at a time: 10 M rows as Python values at once would take ~1.5 GB.
            for start in range(0, n, _BULK_ROWS):
                stop = min(n, start + _BULK_ROWS)
                cur.executemany(
                    "INSERT INTO trace_requests"
                    " (trace_id, seq, arrival_s, input_tokens, output_tokens)"
                    f" VALUES ({int(trace_id)}, ?, ?, ?, ?)",
                    zip(
                        range(start, stop),
                        columns.arrival_s[start:stop].tolist(),
                        columns.input_tokens[start:stop].tolist(),
                        columns.output_tokens[start:stop].tolist(),
                        strict=True,
                    ),
                )
        else:
            seqs = range(n)
            arrivals = columns.arrival_s.tolist()
            inputs = columns.input_tokens.tolist()
            outputs = columns.output_tokens.tolist()
            hashes, sessions, accept = _optional(columns)
            cur.executemany(
                f"INSERT INTO trace_requests ({', '.join(_COLS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                zip(
                    [trace_id] * n,
                    seqs,
                    arrivals,
                    inputs,
                    outputs,
                    hashes,
                    sessions,
                    accept,
                    strict=True,
                ),
            )
    finally:
        cur.close()


def _copy_in(raw, trace_id: int, columns: TraceColumns, plain: bool) -> None:
    import polars as pl

    n = len(columns)
    optional = None if plain else _optional(columns)
    names = ["trace_id", "seq", "arrival_s", "input_tokens", "output_tokens"]
    if not plain:
        names += ["prefix_hashes", "session_id", "acceptance_length"]
    sql = f"COPY trace_requests ({', '.join(names)}) FROM STDIN (FORMAT csv)"
    with raw.cursor() as cur, cur.copy(sql) as cp:
        # A block of CSV at a time: the whole text of 10 M rows would be ~300 MB twice.
        for start in range(0, n, _BULK_ROWS):
            stop = min(n, start + _BULK_ROWS)
            frame = {
                "trace_id": np.full(stop - start, trace_id, dtype=np.int64),
                "seq": np.arange(start, stop, dtype=np.int64),
                "arrival_s": columns.arrival_s[start:stop],
                "input_tokens": columns.input_tokens[start:stop],
                "output_tokens": columns.output_tokens[start:stop],
            }
            if optional is not None:
                hashes, sessions, accept = optional
                frame["prefix_hashes"] = [
                    None if b is None else "\\x" + b.hex() for b in hashes[start:stop]
                ]
                frame["session_id"] = sessions[start:stop]
                frame["acceptance_length"] = accept[start:stop]
            overrides = None if plain else {"session_id": pl.String}
            buf = io.BytesIO()
            pl.DataFrame(frame, schema_overrides=overrides).write_csv(
                buf, include_header=False, float_precision=None
            )
            cp.write(buf.getbuffer())


def load_trace_columns(
    session: Session, trace_id: int, *, project: str | None = None
) -> TraceColumns:
    """The stored requests as columnar arrays, in stored (arrival) order."""
    _row(session, trace_id, project)
    conn = session.connection()
    raw = conn.connection.driver_connection
    if conn.dialect.name == "postgresql":
        arrival, inp, out = _read_core_postgresql(raw, trace_id)
    else:
        arrival, inp, out = _read_core_sqlite(raw, trace_id)
    hashes, sessions, accept = _load_optional(session, trace_id, len(arrival))
    return TraceColumns(
        arrival_s=arrival,
        input_tokens=inp,
        output_tokens=out,
        prefix_hashes=hashes,
        session_ids=sessions,
        acceptance_length=accept,
    )


_CORE_DTYPE = np.dtype([("arrival_s", "<f8"), ("input_tokens", "<i8"), ("output_tokens", "<i8")])
_READ_BLOCK_ROWS = 65_536  # rows the SQLite driver hands over at once when loading a trace


def _read_core_sqlite(raw, trace_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The core columns of a stored trace on SQLite, in seq (arrival) order, written
    straight into three preallocated arrays a block of rows at a time.

    The sqlite3 driver yields one tuple per row; `np.fromiter` consumes them as they
    come, so no list of rows exists and memory is the columns plus one block."""
    cur = raw.cursor()
    try:
        cur.execute("SELECT count(*) FROM trace_requests WHERE trace_id = ?", (trace_id,))
        n = int(cur.fetchone()[0])
        arrival = np.empty(n, dtype=np.float64)
        inp = np.empty(n, dtype=np.int64)
        out = np.empty(n, dtype=np.int64)
        cur.execute(
            "SELECT arrival_s, input_tokens, output_tokens FROM trace_requests"
            " WHERE trace_id = ? ORDER BY seq",
            (trace_id,),
        )
        pos = 0
        while pos < n:
            size = min(_READ_BLOCK_ROWS, n - pos)
            block = np.fromiter(itertools.islice(cur, size), dtype=_CORE_DTYPE, count=size)
            arrival[pos : pos + size] = block["arrival_s"]
            inp[pos : pos + size] = block["input_tokens"]
            out[pos : pos + size] = block["output_tokens"]
            pos += size
    finally:
        cur.close()
    return arrival, inp, out


def _read_core_postgresql(raw, trace_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The core columns of a stored trace on PostgreSQL, in seq (arrival) order: the
    server packs each column into one bytea of its binary send form (`float8send`,
    `int4send`: big-endian, exact), read back with `np.frombuffer`. One row of three
    values crosses the wire, never one per request (a column of the 50 M-row limit is
    400 MB, under bytea's 1 GB)."""
    row = raw.execute(
        "SELECT string_agg(float8send(arrival_s), ''::bytea ORDER BY seq),"
        " string_agg(int4send(input_tokens), ''::bytea ORDER BY seq),"
        " string_agg(int4send(output_tokens), ''::bytea ORDER BY seq)"
        " FROM trace_requests WHERE trace_id = %s",
        (trace_id,),
        binary=True,
    ).fetchone()
    arrival, inp, out = (b"" if v is None else v for v in row)
    return (
        np.frombuffer(arrival, dtype=">f8").astype(np.float64),
        np.frombuffer(inp, dtype=">i4").astype(np.int64),
        np.frombuffer(out, dtype=">i4").astype(np.int64),
    )


def _load_optional(
    session: Session, trace_id: int, n: int
) -> tuple[list[np.ndarray] | None, list[str | None] | None, np.ndarray | None]:
    t = TraceRequestRow
    present = session.execute(
        sa.select(
            sa.func.count(t.prefix_hashes),
            sa.func.count(t.session_id),
            sa.func.count(t.acceptance_length),
        ).where(t.trace_id == trace_id)
    ).one()
    if not any(present):
        return None, None, None
    rows = session.execute(
        sa.select(t.prefix_hashes, t.session_id, t.acceptance_length)
        .where(t.trace_id == trace_id)
        .order_by(t.seq)
    ).all()
    hashes = (
        [np.frombuffer(r[0] or b"", dtype="<i8").astype(np.int64) for r in rows]
        if present[0]
        else None
    )
    sessions = [r[1] for r in rows] if present[1] else None
    accept = (
        np.array([np.nan if r[2] is None else r[2] for r in rows], dtype=np.float64)
        if present[2]
        else None
    )
    return hashes, sessions, accept


def load_token_counts(
    session: Session, trace_id: int, num_requests: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first `num_requests` stored requests' (input, output) tokens, in arrival order:
    what a request cut by `max_requests` runs on, without the rest of the trace."""
    t = TraceRequestRow
    rows = session.execute(
        sa.select(t.input_tokens, t.output_tokens)
        .where(t.trace_id == trace_id, t.seq < num_requests)
        .order_by(t.seq)
    ).all()
    counts = np.array(rows, dtype=np.int64).reshape(-1, 2)
    return counts[:, 0].copy(), counts[:, 1].copy()
