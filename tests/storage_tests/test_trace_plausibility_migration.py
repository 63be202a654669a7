"""Migration 0130: traces stored before it read back with no plausibility warnings, their
requests untouched; a trace stored after keeps its own; down to 0120 and up again works."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import sqlalchemy as sa
from alembic import command

from optimizer.records import TraceFormat, TraceWarning, TraceWarningCode
from storage.db import _alembic_config, make_engine, session_scope, upgrade_database
from storage.traces import get_trace, load_trace_columns, stats_to_json, store_trace
from tests.factories import make_columns, make_stats

BEFORE = "0120_deployment_loop"
WARNING = TraceWarning(TraceWarningCode.SPAN_ZERO, 30.0, 20.0, "all 30 requests ...")


def _seed_old_trace(url: str) -> int:
    """A trace and its requests as a database at 0120 holds them; its id."""
    upgrade_database(url, BEFORE)
    engine = make_engine(url)
    meta = sa.MetaData()
    meta.reflect(engine, only=["traces", "trace_requests"])
    assert "plausibility_warnings" not in meta.tables["traces"].c
    with engine.begin() as conn:
        trace_id = conn.execute(
            meta.tables["traces"].insert().returning(meta.tables["traces"].c.id),
            {
                "project": "default",
                "name": "old",
                "source_format": "azure",
                "content_hash": "old",
                "created_at": datetime.now(UTC),
                "num_requests": 3,
                "stats": stats_to_json(make_stats(3)),
            },
        ).scalar_one()
        conn.execute(
            meta.tables["trace_requests"].insert(),
            [
                {
                    "trace_id": trace_id,
                    "seq": i,
                    "arrival_s": float(i),
                    "input_tokens": 10 + i,
                    "output_tokens": 5,
                }
                for i in range(3)
            ],
        )
    engine.dispose()
    return trace_id


def _columns(engine: sa.Engine) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns("traces")}


def test_old_traces_get_no_warnings_and_keep_their_requests(db_url: str) -> None:
    old_id = _seed_old_trace(db_url)
    upgrade_database(db_url)
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            old = get_trace(s, old_id)
            cols = load_trace_columns(s, old_id)
            new, _ = store_trace(
                s,
                name="new",
                source_format=TraceFormat.GENERIC,
                content_hash="new",
                columns=make_columns(30),
                stats=make_stats(30),
                plausibility_warnings=(WARNING,),
            )
        assert old.name == "old" and old.plausibility_warnings == ()
        assert cols.input_tokens.tolist() == [10, 11, 12]
        with session_scope(engine) as s:
            assert get_trace(s, new.id).plausibility_warnings == (WARNING,)

        command.downgrade(_alembic_config(db_url), BEFORE)
        assert "plausibility_warnings" not in _columns(engine)
        with engine.connect() as conn:  # no table copy dropped the requests (ON DELETE CASCADE)
            counts = conn.execute(
                sa.text("SELECT trace_id, count(*) FROM trace_requests GROUP BY trace_id")
            ).all()
        assert sorted(counts) == [(old_id, 3), (new.id, 30)]

        upgrade_database(db_url)
        with session_scope(engine) as s:
            assert get_trace(s, new.id).plausibility_warnings == ()  # dropped on the way down
            np.testing.assert_array_equal(load_trace_columns(s, old_id).arrival_s, [0.0, 1.0, 2.0])
    finally:
        engine.dispose()
