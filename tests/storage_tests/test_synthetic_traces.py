"""Synthetic traces in storage, on both back-ends: the origin is stored with the trace and
read back by get and list (uploads have none); a synthesis stores its rows exactly and
once; bad requests store nothing; migration 0150 adds and drops the column."""

from __future__ import annotations

import re

import numpy as np
import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import Engine

from api.services.synthesize import synthesize_trace
from optimizer.records import RateCurve, RateCurveAxis, TraceFormat
from optimizer.traces.synthesize import DIURNAL, RateCurveError, SynthesisError, synthesize
from storage.db import _alembic_config, make_engine, session_scope, upgrade_database
from storage.traces import (
    TraceNotFound,
    count_traces,
    get_trace,
    list_traces,
    load_trace_columns,
    store_trace,
)
from tests.factories import make_columns, make_stats


def _sample(engine: Engine, n: int = 40) -> int:
    with session_scope(engine) as s:
        info, _ = store_trace(
            s,
            name="hour",
            source_format=TraceFormat.AZURE,
            content_hash=f"sample-{n}",
            columns=make_columns(n, seed=1),
            stats=make_stats(n),
        )
    return info.id


def test_a_synthesis_is_stored_labelled_exactly_and_once(engine: Engine) -> None:
    sample_id = _sample(engine)
    with session_scope(engine) as s:
        made = synthesize_trace(
            s, from_trace_id=sample_id, curve=DIURNAL, days=2.0, mean_rate=0.2, seed=4
        )
    assert made.created and made.trace.name == f"synthetic-2-days-from-{sample_id}"
    origin = made.trace.synthetic
    assert origin is not None
    assert (origin.from_trace_id, origin.from_trace_name) == (sample_id, "hour")
    assert origin.rate_curve == DIURNAL
    assert (origin.days, origin.mean_rate, origin.seed) == (2.0, 0.2, 4)
    with session_scope(engine) as s:
        sample = load_trace_columns(s, sample_id)
        stored = load_trace_columns(s, made.trace.id)
        again = synthesize_trace(
            s, from_trace_id=sample_id, curve=DIURNAL, days=2.0, mean_rate=0.2, seed=4
        )
        listed = {t.id: t for t in list_traces(s)}
        assert count_traces(s) == 2
    assert not again.created and again.trace.id == made.trace.id
    assert listed[made.trace.id].synthetic == origin and listed[sample_id].synthetic is None
    assert get_trace_synthetic(engine, sample_id) is None
    # The stored rows are the core's, bit for bit (floats included).
    want = synthesize(
        sample.input_tokens, sample.output_tokens, curve=DIURNAL, days=2, mean_rate=0.2, seed=4
    )
    for name in ("arrival_s", "input_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(stored, name), getattr(want, name))
    assert made.trace.stats.num_requests == len(want)


def get_trace_synthetic(engine: Engine, trace_id: int):
    with session_scope(engine) as s:
        return get_trace(s, trace_id).synthetic


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"from_trace_id": 999}, TraceNotFound, "trace 999 not found"),
        ({"days": 0.0}, SynthesisError, "--days 0.0"),
        ({"days": 45.0}, SynthesisError, "--days 45.0"),
        ({"mean_rate": 0.0}, SynthesisError, "--mean-rate 0.0"),
        ({"name": "  "}, SynthesisError, "--name '  '; expected 1 to 200 characters"),
        ({"max_requests": 10}, SynthesisError, "expected at most 10 (the trace row limit)"),
        (
            {"curve": RateCurve("flat", RateCurveAxis.HOUR_OF_DAY, (0.0,), (0.0,))},
            RateCurveError,
            "every relative rate is 0",
        ),
    ],
)
def test_bad_requests_store_nothing(
    engine: Engine, kwargs: dict, error: type, message: str
) -> None:
    sample_id = _sample(engine)
    request = {"from_trace_id": sample_id, "curve": DIURNAL, "days": 1.0, "mean_rate": 0.1}
    with pytest.raises(error, match=re.escape(message)), session_scope(engine) as s:
        synthesize_trace(s, **{**request, **kwargs})
    with session_scope(engine) as s:
        assert count_traces(s) == 1


def test_a_sample_of_nine_requests_stores_nothing(engine: Engine) -> None:
    sample_id = _sample(engine, 9)
    refused = pytest.raises(SynthesisError, match="the sample has 9 requests; expected at least")
    with refused, session_scope(engine) as s:
        synthesize_trace(s, from_trace_id=sample_id, curve=DIURNAL, days=1, mean_rate=1)
    with session_scope(engine) as s:
        assert count_traces(s) == 1


def test_another_projects_sample_is_not_found(engine: Engine) -> None:
    sample_id = _sample(engine)
    with pytest.raises(TraceNotFound), session_scope(engine) as s:
        synthesize_trace(
            s, from_trace_id=sample_id, curve=DIURNAL, days=1, mean_rate=1, project="other"
        )


def test_migration_0150_adds_and_drops_the_origin(db_url: str) -> None:
    upgrade_database(db_url)
    engine = make_engine(db_url)
    try:
        sample_id = _sample(engine)
        with session_scope(engine) as s:
            made = synthesize_trace(
                s, from_trace_id=sample_id, curve=DIURNAL, days=1, mean_rate=0.05
            )
        command.downgrade(_alembic_config(db_url), "0140_attainment_loads")
        names = {c["name"] for c in sa.inspect(engine).get_columns("traces")}
        assert "synthetic" not in names and "plausibility_warnings" in names
        with engine.connect() as conn:  # the rows stay (no table copy)
            rows = conn.execute(
                sa.text("SELECT count(*) FROM trace_requests WHERE trace_id = :t"),
                {"t": made.trace.id},
            ).scalar_one()
        assert rows == made.trace.stats.num_requests
        upgrade_database(db_url)
        with session_scope(engine) as s:
            assert get_trace(s, made.trace.id).synthetic is None  # dropped on the way down
            assert get_trace(s, sample_id).synthetic is None
    finally:
        engine.dispose()


@pytest.mark.parametrize("hashes", [False, True])
def test_rows_are_inserted_a_block_at_a_time_whole_and_in_order(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, hashes: bool
) -> None:
    """Blocks of 7 rows: 50 rows cross 7 block boundaries and end in a partial block."""
    import storage.traces

    monkeypatch.setattr(storage.traces, "_BULK_ROWS", 7)
    columns = make_columns(50, seed=3, hashes=hashes)
    with session_scope(engine) as s:
        info, _ = store_trace(
            s,
            name="blocks",
            source_format=TraceFormat.GENERIC,
            content_hash="blocks",
            columns=columns,
            stats=make_stats(50),
        )
    with session_scope(engine) as s:
        back = load_trace_columns(s, info.id)
    for name in ("arrival_s", "input_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(back, name), getattr(columns, name))
    if hashes:
        assert back.session_ids == columns.session_ids
        np.testing.assert_array_equal(back.acceptance_length, columns.acceptance_length)
        for got, want in zip(back.prefix_hashes, columns.prefix_hashes, strict=True):
            np.testing.assert_array_equal(got, want)
