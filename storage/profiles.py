"""Profile persistence: runs of kernel timings, written atomically, read back as records.

`create_profile_run` validates every sample before writing anything, then
inserts the run row and its samples in bulk inside the caller's transaction
(`session_scope`): SQLite through one `executemany` on the raw connection,
PostgreSQL through `COPY ... FROM STDIN`. A failure at any point rolls the
whole run back with the transaction.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from optimizer.records import DeviceInfo, KernelSample, OpKind, ProfileRunInfo
from storage.models.profiles import KernelSampleRow, ProfileRunRow

DEVICE_SCHEMA_VERSION = 1
OP_SUMMARY_SCHEMA_VERSION = 1

_FLOAT_FIELDS = ("median_ms", "p10_ms", "p90_ms")
_STR_FIELDS = {"model": 200, "dtype": 32}
_INT32_FIELDS = (
    "num_repeats",
    "tp",
    "batch_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "num_gpus",
)
_INT64_FIELDS = ("num_tokens", "n", "k", "q_len", "kv_len", "message_bytes")
# Column order of the bulk insert and of load_samples (after run_id, seq).
_SAMPLE_COLS = ("op", *_FLOAT_FIELDS, *_STR_FIELDS, *_INT32_FIELDS, *_INT64_FIELDS)
_KNOWN_OPS = frozenset(OpKind)


class ProfileRunNotFound(LookupError):
    def __init__(self, run_id: int) -> None:
        super().__init__(f"profile run {run_id} not found")
        self.run_id = run_id


def device_to_json(device: DeviceInfo) -> dict:
    data = dataclasses.asdict(device)
    data["schema_version"] = DEVICE_SCHEMA_VERSION
    return data


def device_from_json(data: dict) -> DeviceInfo:
    data = dict(data)
    version = data.pop("schema_version", None)
    if version != DEVICE_SCHEMA_VERSION:
        raise ValueError(f"device schema_version {version!r}, expected {DEVICE_SCHEMA_VERSION}")
    return DeviceInfo(**data)


def _info(row: ProfileRunRow | sa.Row) -> ProfileRunInfo:
    return ProfileRunInfo(
        id=row.id,
        name=row.name,
        source=row.source,
        accelerator=row.accelerator,
        device=device_from_json(row.device),
        created_at=row.created_at,
        num_samples=row.num_samples,
        engine=row.engine,
    )


def _check_text(what: str, value: object, max_len: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"profile run {what} must be a non-empty string, got {value!r}")
    if len(value) > max_len:
        raise ValueError(f"profile run {what} is {len(value)} characters; at most {max_len}")
    return value


def _columns(samples: Sequence[KernelSample]) -> dict[str, list]:
    """Validated columns of the samples; raises ValueError naming the first bad sample."""
    if not samples:
        raise ValueError("a profile run needs at least one kernel sample")
    for i, s in enumerate(samples):
        if not isinstance(s, KernelSample):
            raise ValueError(f"sample {i}: expected a KernelSample, got {type(s).__name__}")
        if s.op not in _KNOWN_OPS:
            raise ValueError(f"sample {i}: op {s.op!r} is not one of {sorted(_KNOWN_OPS)}")
    cols: dict[str, list] = {"op": [str(OpKind(s.op)) for s in samples]}
    for name in _FLOAT_FIELDS:
        values = [getattr(s, name) for s in samples]
        try:
            arr = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"samples: {name} must be numbers ({exc})") from exc
        bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"sample {i} ({cols['op'][i]}): {name} {values[i]!r} is not >= 0")
        cols[name] = arr.tolist()
    med, p10, p90 = (np.asarray(cols[n]) for n in _FLOAT_FIELDS)
    tol = 1e-9 * np.maximum(med, 1.0)
    bad = np.flatnonzero((p10 > med + tol) | (med > p90 + tol))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"sample {i} ({cols['op'][i]}): expected p10 <= median <= p90, got "
            f"{p10[i]} / {med[i]} / {p90[i]} ms"
        )
    for name, max_len in _STR_FIELDS.items():
        values = [getattr(s, name) for s in samples]
        for i, v in enumerate(values):
            if not isinstance(v, str) or len(v) > max_len:
                raise ValueError(
                    f"sample {i} ({cols['op'][i]}): {name} must be a string of at most "
                    f"{max_len} characters, got {v!r}"
                )
        cols[name] = values
    for fields, bits in ((_INT32_FIELDS, 31), (_INT64_FIELDS, 63)):
        for name in fields:
            values = [getattr(s, name) for s in samples]
            low = 1 if name in ("num_repeats", "tp") else 0
            for i, v in enumerate(values):
                if type(v) is not int and not isinstance(v, np.integer):
                    raise ValueError(f"sample {i} ({cols['op'][i]}): {name} {v!r} is not an int")
            arr = np.asarray(values, dtype=np.int64)
            bad = np.flatnonzero((arr < low) | (arr >= 2**bits))
            if bad.size:
                i = int(bad[0])
                raise ValueError(
                    f"sample {i} ({cols['op'][i]}): {name} {values[i]} is outside [{low}, 2^{bits})"
                )
            cols[name] = arr.tolist()
    return cols


def create_profile_run(
    session: Session,
    *,
    name: str,
    source: str,
    accelerator: str,
    device: DeviceInfo,
    samples: Sequence[KernelSample],
    engine: str = "",
) -> ProfileRunInfo:
    """Store a run and its samples (units: ms) atomically; return the stored run.
    `engine`: whose kernels the tables time ("" for no serving engine's).

    Raises ValueError naming the first bad field before anything is written.
    """
    _check_text("name", name, 200)
    _check_text("source", source, 32)
    _check_text("accelerator", accelerator, 64)
    if not isinstance(engine, str) or len(engine) > 16:
        raise ValueError(
            f"profile run engine must be a name of at most 16 characters, got {engine!r}"
        )
    if not isinstance(device, DeviceInfo):
        raise ValueError(f"device must be a DeviceInfo, got {type(device).__name__}")
    cols = _columns(samples)
    row = ProfileRunRow(
        name=name,
        source=source,
        accelerator=accelerator,
        created_at=datetime.now(UTC),
        num_samples=len(samples),
        device=device_to_json(device),
        op_summary=_summarise(cols["op"], cols["median_ms"]),
        engine=engine,
    )
    session.add(row)
    session.flush()
    _bulk_insert(session, row.id, cols)
    return _info(row)


def _summarise(ops: list[str], medians_ms: list[float]) -> dict:
    """The stored per-op summary: [op, num_samples, min and max median_ms], sorted by op."""
    rows: dict[str, list] = {}
    for op, median in zip(ops, medians_ms, strict=True):
        row = rows.get(op)
        if row is None:
            rows[op] = [op, 1, median, median]
        else:
            row[1] += 1
            row[2] = min(row[2], median)
            row[3] = max(row[3], median)
    return {"schema_version": OP_SUMMARY_SCHEMA_VERSION, "ops": [rows[op] for op in sorted(rows)]}


def _bulk_insert(session: Session, run_id: int, cols: dict[str, list]) -> None:
    conn = session.connection()
    raw = conn.connection.driver_connection
    n = len(cols["op"])
    names = ("run_id", "seq", *_SAMPLE_COLS)
    if conn.dialect.name == "postgresql":
        _copy_in(raw, run_id, cols, names)
        return
    cur = raw.cursor()
    try:
        cur.executemany(
            f"INSERT INTO kernel_samples ({', '.join(names)})"
            f" VALUES ({', '.join('?' * len(names))})",
            zip([run_id] * n, range(n), *(cols[c] for c in _SAMPLE_COLS), strict=True),
        )
    finally:
        cur.close()


def _copy_in(raw, run_id: int, cols: dict[str, list], names: tuple[str, ...]) -> None:
    import polars as pl

    n = len(cols["op"])
    frame = {"run_id": [run_id] * n, "seq": list(range(n))}
    frame.update({c: cols[c] for c in _SAMPLE_COLS})
    schema = {c: pl.Int64 for c in ("run_id", "seq", *_INT32_FIELDS, *_INT64_FIELDS)}
    schema.update({c: pl.Float64 for c in _FLOAT_FIELDS})
    schema.update({c: pl.String for c in ("op", *_STR_FIELDS)})
    df = pl.DataFrame(frame, schema=schema).select(names)
    buf = io.BytesIO()
    df.write_csv(buf, include_header=False, float_precision=None)
    sql = f"COPY kernel_samples ({', '.join(names)}) FROM STDIN (FORMAT csv)"
    with raw.cursor() as cur, cur.copy(sql) as cp:
        cp.write(buf.getvalue())


# Plain selects on the connection, built once: the read routes' statements.
_RUNS = ProfileRunRow.__table__
_ALL_RUNS = sa.select(_RUNS).order_by(_RUNS.c.id)
_RUN_BY_ID = sa.select(_RUNS).where(_RUNS.c.id == sa.bindparam("id"))


def list_profile_runs(session: Session) -> list[ProfileRunInfo]:
    return [_info(r) for r in session.connection().execute(_ALL_RUNS)]


def _run_row(session: Session, run_id: int) -> sa.Row:
    row = session.connection().execute(_RUN_BY_ID, {"id": run_id}).first()
    if row is None:
        raise ProfileRunNotFound(run_id)
    return row


def get_profile_run(session: Session, run_id: int) -> ProfileRunInfo:
    return _info(_run_row(session, run_id))


def load_samples(session: Session, run_id: int, op: OpKind | None = None) -> list[KernelSample]:
    """The run's samples in stored order, optionally only those of one op."""
    if session.get(ProfileRunRow, run_id) is None:
        raise ProfileRunNotFound(run_id)
    t = KernelSampleRow
    query = sa.select(*(getattr(t, c) for c in _SAMPLE_COLS)).where(t.run_id == run_id)
    if op is not None:
        query = query.where(t.op == str(OpKind(op)))
    rows = session.execute(query.order_by(t.seq)).all()
    ops = {str(k): k for k in OpKind}
    out = []
    for r in rows:
        values = dict(zip(_SAMPLE_COLS, r, strict=True))
        values["op"] = ops[values["op"]]
        out.append(KernelSample(**values))
    return out


def count_samples_by_op(session: Session, run_id: int) -> dict[OpKind, tuple[int, float, float]]:
    """Per op: (number of samples, smallest and largest median in ms), ordered by op name.
    Read from the summary stored at import; summarised from the samples for a run stored
    without one."""
    return _ops_of(session, _run_row(session, run_id))


def profile_run_detail(
    session: Session, run_id: int
) -> tuple[ProfileRunInfo, dict[OpKind, tuple[int, float, float]]]:
    """`get_profile_run` and `count_samples_by_op` from one read of the run's row."""
    row = _run_row(session, run_id)
    return _info(row), _ops_of(session, row)


def _ops_of(session: Session, row: sa.Row) -> dict[OpKind, tuple[int, float, float]]:
    run_id, summary = row.id, row.op_summary
    if summary is not None:
        if summary.get("schema_version") != OP_SUMMARY_SCHEMA_VERSION:
            raise ValueError(
                f"profile run {run_id}: op summary schema_version "
                f"{summary.get('schema_version')!r}, expected {OP_SUMMARY_SCHEMA_VERSION}"
            )
        return {OpKind(op): (int(n), float(lo), float(hi)) for op, n, lo, hi in summary["ops"]}
    t = KernelSampleRow
    rows = session.execute(
        sa.select(t.op, sa.func.count(), sa.func.min(t.median_ms), sa.func.max(t.median_ms))
        .where(t.run_id == run_id)
        .group_by(t.op)
        .order_by(t.op)
    ).all()
    return {OpKind(op): (int(c), float(lo), float(hi)) for op, c, lo, hi in rows}


def delete_profile_run(session: Session, run_id: int) -> None:
    row = session.get(ProfileRunRow, run_id)
    if row is None:
        raise ProfileRunNotFound(run_id)
    # Explicit child delete: fast on both back-ends and independent of FK pragmas.
    session.execute(sa.delete(KernelSampleRow).where(KernelSampleRow.run_id == run_id))
    session.delete(row)
    session.flush()
