"""Trace storage on every back-end (SQLite and PostgreSQL via the `db_url` fixture)."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa

from optimizer.records import TraceFormat, TraceWarning, TraceWarningCode
from storage.db import (
    current_revision,
    head_revision,
    newest_migration,
    session_scope,
    upgrade_database,
)
from storage.traces import (
    TraceNotFound,
    count_traces,
    delete_trace,
    find_trace_by_hash,
    get_trace,
    list_traces,
    load_trace_columns,
    store_trace,
)
from tests.factories import make_columns, make_stats


def _store(engine, columns, content_hash="h1", name="t"):
    with session_scope(engine) as s:
        return store_trace(
            s,
            name=name,
            source_format=TraceFormat.AZURE,
            content_hash=content_hash,
            columns=columns,
            stats=make_stats(len(columns)),
        )


def test_migrations_reach_head_and_are_idempotent(db_url: str) -> None:
    upgrade_database(db_url)
    upgrade_database(db_url)  # at head: recognised without Alembic
    assert current_revision(db_url) == head_revision() == newest_migration()


def test_round_trip_plain_columns(engine) -> None:
    cols = make_columns(50, seed=1)
    info, created = _store(engine, cols)
    assert created
    with session_scope(engine) as s:
        back = load_trace_columns(s, info.id)
        stored = get_trace(s, info.id)
    np.testing.assert_array_equal(back.arrival_s, cols.arrival_s)
    np.testing.assert_array_equal(back.input_tokens, cols.input_tokens)
    np.testing.assert_array_equal(back.output_tokens, cols.output_tokens)
    assert back.prefix_hashes is None and back.session_ids is None
    assert back.acceptance_length is None
    assert stored.stats == make_stats(50)
    assert stored.source_format is TraceFormat.AZURE
    assert stored.created_at.tzinfo is not None


def test_load_reads_columns_block_by_block_in_arrival_order(engine, monkeypatch) -> None:
    # Blocks of 7 rows over 50: the last block is short, and a second trace stored
    # before this one must not leak into it.
    import storage.traces as traces
    from optimizer.workload import Workload

    monkeypatch.setattr(traces, "_READ_BLOCK_ROWS", 7)
    _store(engine, make_columns(9, seed=3), content_hash="other")
    cols = make_columns(50, seed=4)
    info, _ = _store(engine, cols)
    with session_scope(engine) as s:
        back = load_trace_columns(s, info.id)
    assert back.arrival_s.dtype == np.float64 and back.input_tokens.dtype == np.int64
    assert back.output_tokens.dtype == np.int64 and len(back.arrival_s) == 50
    np.testing.assert_array_equal(back.arrival_s, cols.arrival_s)
    np.testing.assert_array_equal(back.input_tokens, cols.input_tokens)
    np.testing.assert_array_equal(back.output_tokens, cols.output_tokens)
    workload = Workload.from_columns(back, name="blocks")  # refuses unsorted arrivals
    assert workload.total_output_tokens == int(cols.output_tokens.sum())


def test_round_trip_optional_columns(engine) -> None:
    cols = make_columns(7, seed=2, hashes=True)
    info, _ = _store(engine, cols)
    with session_scope(engine) as s:
        back = load_trace_columns(s, info.id)
    assert back.prefix_hashes is not None and cols.prefix_hashes is not None
    for got, want in zip(back.prefix_hashes, cols.prefix_hashes, strict=True):
        np.testing.assert_array_equal(got, want)
    assert back.session_ids == cols.session_ids
    np.testing.assert_allclose(back.acceptance_length, cols.acceptance_length)


def test_same_content_is_stored_once(engine) -> None:
    first, created1 = _store(engine, make_columns(5), content_hash="same")
    second, created2 = _store(engine, make_columns(5), content_hash="same", name="other")
    assert created1 and not created2
    assert second.id == first.id and second.name == "t"
    with session_scope(engine) as s:
        assert count_traces(s) == 1


def test_failed_transaction_leaves_nothing(engine) -> None:
    with pytest.raises(RuntimeError, match="boom"), session_scope(engine) as s:
        _info, _ = store_trace(
            s,
            name="t",
            source_format=TraceFormat.AZURE,
            content_hash="x",
            columns=make_columns(100),
            stats=make_stats(100),
        )
        raise RuntimeError("boom")
    with engine.connect() as conn:
        assert conn.execute(sa.text("select count(*) from traces")).scalar() == 0
        assert conn.execute(sa.text("select count(*) from trace_requests")).scalar() == 0


def test_list_and_delete(engine) -> None:
    a, _ = _store(engine, make_columns(3), content_hash="a", name="a")
    b, _ = _store(engine, make_columns(4), content_hash="b", name="b")
    with session_scope(engine) as s:
        assert [t.name for t in list_traces(s)] == ["a", "b"]
        assert [t.name for t in list_traces(s, limit=1, offset=1)] == ["b"]
        delete_trace(s, a.id)
    with session_scope(engine) as s:
        assert [t.id for t in list_traces(s)] == [b.id]
        with pytest.raises(TraceNotFound):
            load_trace_columns(s, a.id)
        with pytest.raises(TraceNotFound, match=f"trace {a.id} not found"):
            delete_trace(s, a.id)
    with engine.connect() as conn:
        left = conn.execute(sa.text("select count(*) from trace_requests")).scalar()
    assert left == 4


WARNINGS = (
    TraceWarning(TraceWarningCode.RATE_HIGH, 3578.6, 1000.0, "500 requests in 0.14 s ..."),
    TraceWarning(TraceWarningCode.LENGTH_OVER_CONTEXT, 10485761.0, 10485760.0, "row 4 ..."),
)


def test_plausibility_warnings_round_trip(engine) -> None:
    """Stored with the trace, read back by id, in lists and by hash; none when not given."""
    cols = make_columns(20, seed=4)
    with session_scope(engine) as s:
        info, _ = store_trace(
            s,
            name="w",
            source_format=TraceFormat.GENERIC,
            content_hash="hw",
            columns=cols,
            stats=make_stats(20),
            plausibility_warnings=WARNINGS,
        )
    plain, _ = _store(engine, cols, content_hash="hp")
    assert info.plausibility_warnings == WARNINGS and plain.plausibility_warnings == ()
    with session_scope(engine) as s:
        assert get_trace(s, info.id).plausibility_warnings == WARNINGS
        assert [t.plausibility_warnings for t in list_traces(s)] == [WARNINGS, ()]
        assert find_trace_by_hash(s, "hw").plausibility_warnings == WARNINGS
        assert get_trace(s, plain.id).plausibility_warnings == ()
