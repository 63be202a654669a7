"""What the read routes rely on, on both back-ends: read-only transactions that never queue
for SQLite's writer, profile summaries stored at import (and by migration 0050 for older
runs), job descriptions read without their result."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command
from sqlalchemy import event

from optimizer.records import OpKind
from optimizer.search import TuneRequest
from storage.db import _alembic_config, make_engine, read_scope, session_scope, upgrade_database
from storage.jobs import enqueue_job, get_job, list_jobs
from storage.keys import create_key
from storage.models import ProfileRunRow
from storage.profiles import count_samples_by_op, create_profile_run
from storage.traces import count_traces
from tests.storage_tests.test_profiles import CPU, make_sample, varied_samples

REQUEST = TuneRequest(
    model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=8, slo_ttft_ms=2000.0,
    slo_tpot_ms=50.0, stream="prod",
)  # fmt: skip


def _grouped(session, run_id: int) -> dict[OpKind, tuple[int, float, float]]:
    """The summary computed from the samples, as `count_samples_by_op` did on every read."""
    rows = session.execute(
        sa.text(
            "SELECT op, count(*), min(median_ms), max(median_ms) FROM kernel_samples"
            " WHERE run_id = :run GROUP BY op ORDER BY op"
        ),
        {"run": run_id},
    ).all()
    return {OpKind(op): (int(n), float(lo), float(hi)) for op, n, lo, hi in rows}


def test_reads_neither_wait_for_nor_block_the_writer(engine) -> None:
    writer = session_scope(engine)
    session = writer.__enter__()
    try:
        create_key(session, project="p")  # a write transaction holds SQLite's lock
        session.flush()
        with read_scope(engine) as reader:  # would wait out the busy timeout if it queued
            assert count_traces(reader) == 0
    finally:
        writer.__exit__(None, None, None)
    with read_scope(engine) as reader:
        assert reader.execute(sa.text("SELECT count(*) FROM api_keys")).scalar() == 1


def test_read_scope_on_a_kept_connection_sees_each_new_commit(engine) -> None:
    with engine.connect() as conn:
        for expected in (0, 1):
            with read_scope(conn) as reader:
                assert reader.execute(sa.text("SELECT count(*) FROM api_keys")).scalar() == expected
            with session_scope(engine) as s:
                create_key(s, project="p")


def test_profile_summary_is_stored_at_import_and_matches_the_samples(engine) -> None:
    samples = [*varied_samples(), make_sample(OpKind.MLP_UP, 0.75), make_sample(OpKind.NORM, 0.0)]
    with session_scope(engine) as s:
        info = create_profile_run(
            s, name="r", source="profiler", accelerator="cpu", device=CPU, samples=samples
        )
    with read_scope(engine) as s:
        stored = s.get(ProfileRunRow, info.id).op_summary
        expected = _grouped(s, info.id)
        assert stored is not None and stored["schema_version"] == 1
        assert count_samples_by_op(s, info.id) == expected
        assert list(count_samples_by_op(s, info.id)) == list(expected)  # ordered by op name


def test_a_run_without_a_stored_summary_is_summarised_from_its_samples(engine) -> None:
    with session_scope(engine) as s:
        info = create_profile_run(
            s, name="r", source="profiler", accelerator="cpu", device=CPU, samples=varied_samples()
        )
        s.get(ProfileRunRow, info.id).op_summary = None  # as an older build wrote it
    with read_scope(engine) as s:
        assert count_samples_by_op(s, info.id) == _grouped(s, info.id)


def test_migration_0050_summarises_existing_runs(db_url: str) -> None:
    upgrade_database(db_url, "0040_latency_tables")
    engine = make_engine(db_url)
    meta = sa.MetaData()
    meta.reflect(engine, only=["profile_runs", "kernel_samples"])
    runs, kernel = meta.tables["profile_runs"], meta.tables["kernel_samples"]
    base = {"p10_ms": 0.0, "p90_ms": 9.0, "num_repeats": 1, "model": "", "dtype": "float16"}
    ints = ("tp", "num_tokens", "n", "k", "batch_size", "q_len", "kv_len", "num_heads")
    ints += ("num_kv_heads", "head_dim", "num_gpus", "message_bytes")
    base.update(dict.fromkeys(ints, 1))
    with engine.begin() as conn:
        for run_id in (1, 2):
            conn.execute(
                runs.insert(),
                {"id": run_id, "name": "r", "source": "vidur", "accelerator": "h100",
                 "created_at": datetime.now(UTC), "num_samples": 3, "device": {}},
            )  # fmt: skip
        for seq, (op, median) in enumerate((("gemm", 2.0), ("gemm", 0.5), ("rope", 1.0))):
            conn.execute(
                kernel.insert(), {**base, "run_id": 1, "seq": seq, "op": op, "median_ms": median}
            )
    engine.dispose()
    upgrade_database(db_url)
    engine = make_engine(db_url)
    try:
        with read_scope(engine) as s:
            assert count_samples_by_op(s, 1) == {
                OpKind.GEMM: (2, 0.5, 2.0),
                OpKind.ROPE: (1, 1.0, 1.0),
            }
            assert count_samples_by_op(s, 2) == {}
            assert s.get(ProfileRunRow, 2).op_summary == {"schema_version": 1, "ops": []}
    finally:
        engine.dispose()
    command.downgrade(_alembic_config(db_url), "0040_latency_tables")
    engine = make_engine(db_url)
    try:
        assert "op_summary" not in {
            c["name"] for c in sa.inspect(engine).get_columns("profile_runs")
        }
    finally:
        engine.dispose()


def test_job_descriptions_leave_the_result_unread(engine) -> None:
    with session_scope(engine) as s:
        job = enqueue_job(s, project="p", params=REQUEST)
    statements: list[str] = []

    def record(conn, cursor, statement, *args) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        with read_scope(engine) as s:
            assert get_job(s, job.id, project="p") == job
            assert list_jobs(s, project="p") == [job]
    finally:
        event.remove(engine, "before_cursor_execute", record)
    selects = [text for text in statements if "FROM jobs" in text]
    assert len(selects) == 2 and not any("jobs.result" in text for text in selects)
