"""Ingest and load speed (issue 2): a generated 1M-row Azure-format CSV.

Prints the median of repeated runs for: parse + store into SQLite, parse +
store into PostgreSQL (when a server answers), and loading the stored trace
back into arrays. Targets: SQLite <= 10 s, PostgreSQL <= 20 s, load <= 2 s.

    python benchmarks/bench_ingest.py [--rows 1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import polars as pl
import sqlalchemy as sa

from api.services.ingest import ingest_trace
from storage.db import make_engine, session_scope, upgrade_database
from storage.traces import load_trace_columns

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def write_azure_csv(path: Path, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    start = np.datetime64("2024-05-10T00:00:00", "ns")
    gaps = rng.exponential(1 / 300.0, rows)  # ~300 req/s, ~1 hour
    ts = start + (np.cumsum(gaps) * 1e9).astype("timedelta64[ns]")
    frame = pl.DataFrame(
        {
            "TIMESTAMP": pl.Series(ts).dt.strftime("%Y-%m-%d %H:%M:%S%.f"),
            "ContextTokens": rng.lognormal(7.0, 1.0, rows).astype(np.int64) + 1,
            "GeneratedTokens": rng.lognormal(4.5, 1.0, rows).astype(np.int64) + 1,
        }
    )
    frame.write_csv(path)


def _time_ingest(url: str, csv: Path) -> tuple[float, float]:
    upgrade_database(url)
    engine = make_engine(url)
    try:
        t0 = time.perf_counter()
        with session_scope(engine) as s:
            result = ingest_trace(s, csv, name="bench")
        ingest_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with session_scope(engine) as s:
            cols = load_trace_columns(s, result.trace.id)
        load_s = time.perf_counter() - t0
        assert len(cols) == result.trace.stats.num_requests
        return ingest_s, load_s
    finally:
        engine.dispose()


def _pg_available() -> bool:
    try:
        eng = sa.create_engine(PG_ADMIN, connect_args={"connect_timeout": 3})
        with eng.connect():
            pass
        eng.dispose()
        return True
    except Exception:
        return False


def _with_pg_db(fn):
    name = f"bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        return fn(PG_ADMIN.rsplit("/", 1)[0] + "/" + name)
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "azure_1m.csv"
        write_azure_csv(csv, args.rows, seed=0)
        print(f"generated {args.rows:,} rows, {csv.stat().st_size / 1e6:.1f} MB")
        results: dict[str, list[tuple[float, float]]] = {"sqlite": [], "postgresql": []}
        for i in range(args.repeats):
            db = Path(tmp) / f"bench{i}.db"
            results["sqlite"].append(_time_ingest(f"sqlite:///{db}", csv))
            db.unlink()
            if _pg_available():
                results["postgresql"].append(_with_pg_db(lambda url: _time_ingest(url, csv)))
    targets = {"sqlite": 10.0, "postgresql": 20.0}
    print(f"{'back-end':<12}{'ingest median s':>17}{'target':>8}{'load median s':>15}{'target':>8}")
    for name, runs in results.items():
        if not runs:
            print(f"{name:<12}{'(no server)':>17}")
            continue
        ingest = statistics.median(r[0] for r in runs)
        load = statistics.median(r[1] for r in runs)
        ok = "ok" if ingest <= targets[name] and load <= 2.0 else "MISS"
        print(f"{name:<12}{ingest:>17.2f}{targets[name]:>8.0f}{load:>15.2f}{2.0:>8.0f}  {ok}")


if __name__ == "__main__":
    main()
