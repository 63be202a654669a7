"""api.services.latency: what prices a run — stored fitted models, roofline, calibrations."""

from __future__ import annotations

import pytest

from api.services.latency import ROOFLINE_ONLY, resolve_latency
from optimizer.latency.base import StepLoad
from storage.db import make_engine, session_scope, upgrade_database
from storage.validation import save_calibration

DECODE = StepLoad(num_tokens=8, num_logits=8, num_decode_seqs=8, decode_kv_tokens=8 * 1000)


@pytest.fixture
def engine(tmp_path):
    url = f"sqlite:///{tmp_path / 'cat.db'}"
    upgrade_database(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def test_empty_database_gives_the_labelled_roofline(engine) -> None:
    with session_scope(engine) as s:
        r = resolve_latency(s, "llama-3.1-8b")
    assert r.is_estimate and r.label == ROOFLINE_ONLY and r.model_ids == ()
    assert r.source.for_instance("h100", 1).step_time_s(DECODE) > 0


def test_stored_calibration_is_applied_to_later_runs(engine) -> None:
    with session_scope(engine) as s:
        plain = resolve_latency(s, "llama-3.1-8b").source
    base_s = plain.for_instance("h100", 1).step_time_s(DECODE)  # compiled after the session
    with session_scope(engine) as s:
        # A roofline calibration (no latency model id) for h100 at TP 1 only.
        save_calibration(
            s, shape_name="llama-3.1-8b", accelerator="h100", tp=1, overhead_s=0.002,
            prefill_scale=1.0, decode_scale=1.5, loss_before=0.3, loss_after=0.05,
        )  # fmt: skip
    with session_scope(engine) as s:
        r = resolve_latency(s, "llama-3.1-8b")
    assert "calibrated" in r.label and "h100 tp1" in r.label
    # A pure-decode step: overhead + decode_scale x the uncalibrated price.
    assert r.source.for_instance("h100", 1).step_time_s(DECODE) == pytest.approx(
        0.002 + 1.5 * base_s, rel=1e-6
    )
    # Other TP degrees and accelerators are untouched.
    with session_scope(engine) as s:
        other = resolve_latency(s, "llama-3.1-8b", use_stored=False)
    h100_tp2 = other.source.for_instance("h100", 2).step_time_s(DECODE)
    assert r.source.for_instance("h100", 2).step_time_s(DECODE) == pytest.approx(h100_tp2)
    # Calibrations belong to a model shape.
    with session_scope(engine) as s:
        assert "calibrated" not in resolve_latency(s, "llama-2-7b").label


def test_unknown_latency_model_id_is_a_lookup_error(engine) -> None:
    with session_scope(engine) as s, pytest.raises(LookupError, match="latency model id 99"):
        resolve_latency(s, "llama-3.1-8b", latency_model_ids=(99,))


def test_tables_compile_outside_the_callers_transaction_and_are_kept(engine, monkeypatch) -> None:
    """Resolving reads only which models exist; the first run compiles a table (no session
    held), the next process reads it back from the database instead of compiling."""
    from api.services.latency import DatabaseTableStore
    from optimizer.latency import TableReach
    from storage.latency_tables import count_tables

    reach = TableReach(2048, 64, 2048, 8192)
    with session_scope(engine) as s:
        first = resolve_latency(s, "llama-3.1-8b").source
    assert count_tables(engine) == (0, 0)
    a = first.for_instance("h100", 1, reach)
    n, size = count_tables(engine)
    assert n == 1 and size > 10_000
    with session_scope(engine) as s:
        second = resolve_latency(s, "llama-3.1-8b").source

    # The second catalog finds the stored table: the same prices, nothing compiled.
    from optimizer.latency import catalog

    def refuse(*_a, **_k):
        raise AssertionError("compiled again")

    monkeypatch.setattr(catalog, "compile_roofline", refuse)
    b = second.for_instance("h100", 1, reach)
    assert b == a and count_tables(engine)[0] == 1
    assert isinstance(second.store, DatabaseTableStore)
