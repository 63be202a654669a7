"""`traces synthesize` speed and memory: a week made from the Azure conversation sample
under the diurnal curve, at 1 M and 10 M requests (1.65 and 16.5 req/s on average).

Each case runs in a process of its own, so its peak RSS is its own: `core` draws the
rows only (`optimizer.traces.synthesize.synthesize`); `sqlite` / `postgresql` run the
service the CLI runs (`api.services.synthesize.synthesize_trace`: draw, statistics,
store) on a database already holding the sample. Prints the median wall time of
`--repeats` runs and the largest peak RSS, with the RSS after imports (the floor).
Nothing is committed: the databases are temporary.

    python benchmarks/bench_synthesize.py [--sizes 1000000 10000000] [--repeats 1]
                                          [--postgres-sizes 1000000]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa
from bench_common import TRACES

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SAMPLE = TRACES / "AzureLLMInferenceTrace_conv.csv"
DAYS = 7.0
SEED = 0


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _child(mode: str, url: str, rate: float) -> dict:
    """One case in this process: wall seconds, requests, peak RSS (MB), RSS after imports."""
    import numpy as np  # noqa: F401

    from api.services.synthesize import synthesize_trace
    from optimizer.traces import parse_trace
    from optimizer.traces.synthesize import DIURNAL, synthesize
    from storage.db import make_engine, session_scope

    floor = _rss_mb()
    if mode == "core":
        sample = parse_trace(SAMPLE).columns
        floor = _rss_mb()
        start = time.perf_counter()
        cols = synthesize(
            sample.input_tokens,
            sample.output_tokens,
            curve=DIURNAL,
            days=DAYS,
            mean_rate=rate,
            seed=SEED,
        )
        wall = time.perf_counter() - start
        return {"wall_s": wall, "requests": len(cols), "rss_mb": _rss_mb(), "floor_mb": floor}
    engine = make_engine(url)
    try:
        start = time.perf_counter()
        with session_scope(engine) as s:
            made = synthesize_trace(
                s, from_trace_id=1, curve=DIURNAL, days=DAYS, mean_rate=rate, seed=SEED
            )
        wall = time.perf_counter() - start
    finally:
        engine.dispose()
    assert made.created
    return {
        "wall_s": wall,
        "requests": made.trace.stats.num_requests,
        "rss_mb": _rss_mb(),
        "floor_mb": floor,
    }


def _prepare(url: str) -> None:
    from api.services.ingest import ingest_trace
    from storage.db import make_engine, session_scope, upgrade_database

    upgrade_database(url)
    engine = make_engine(url)
    try:
        with session_scope(engine) as s:
            assert ingest_trace(s, SAMPLE).trace.id == 1
    finally:
        engine.dispose()


def _run_child(mode: str, url: str, rate: float) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--url", url, "--rate", str(rate)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} at {rate} req/s failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pg_database():
    name = f"bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN.rsplit("/", 1)[0] + "/" + name

    def drop() -> None:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


def _case(mode: str, size: int, repeats: int, tmp: Path) -> None:
    rate = size / (DAYS * 86400.0)
    runs = []
    for i in range(repeats):
        drop = None
        if mode == "sqlite":
            url = f"sqlite:///{tmp / f'synth-{size}-{i}.db'}"
        elif mode == "postgresql":
            url, drop = _pg_database()
        else:
            url = ""
        try:
            if mode != "core":
                _prepare(url)
            runs.append(_run_child(mode, url, rate))
        finally:
            if drop is not None:
                drop()
            if mode == "sqlite":
                (tmp / f"synth-{size}-{i}.db").unlink(missing_ok=True)
    wall = statistics.median(r["wall_s"] for r in runs)
    rss = max(r["rss_mb"] for r in runs)
    floor = max(r["floor_mb"] for r in runs)
    n = runs[0]["requests"]
    print(
        f"{mode:<11}{size:>12,}{n:>12,}{rate:>9.2f}{wall:>10.2f}{n / wall / 1e6:>9.2f}"
        f"{rss:>10.0f}{floor:>10.0f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--postgres-sizes", type=int, nargs="*", default=[1_000_000])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--child", choices=["core", "sqlite", "postgresql"])
    ap.add_argument("--url", default="")
    ap.add_argument("--rate", type=float, default=0.0)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.url, args.rate)))
        return
    if not SAMPLE.exists():
        raise SystemExit(f"{SAMPLE}: the Azure conversation sample is missing")
    print(f"a {DAYS:g}-day diurnal week from {SAMPLE.name}, median of {args.repeats}")
    print(
        f"{'case':<11}{'asked':>12}{'made':>12}{'req/s':>9}{'wall s':>10}{'M req/s':>9}"
        f"{'peak MB':>10}{'floor MB':>10}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            _case("core", size, args.repeats, Path(tmp))
            _case("sqlite", size, args.repeats, Path(tmp))
        for size in args.postgres_sizes:
            _case("postgresql", size, args.repeats, Path(tmp))


if __name__ == "__main__":
    main()
