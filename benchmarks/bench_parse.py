"""Parse + statistics time for a 1,000,000-row Azure-format CSV (median of 3 runs).

Usage: .venv/bin/python benchmarks/bench_parse.py [--rows N] [--repeats R]
The CSV is generated in a temporary directory (Poisson arrivals at 5 req/s,
7-digit fractional timestamps as in the Azure 2023 trace) and deleted afterwards.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from optimizer.traces import parse_trace


def write_azure_csv(path: Path, num_rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    start = np.datetime64("2023-11-16T18:00:00", "ns")
    offsets_ns = np.cumsum(rng.exponential(0.2e9, num_rows)).astype(np.int64)
    stamps = pl.Series(start + offsets_ns.astype("timedelta64[ns]"))
    pl.DataFrame(
        {
            # Azure writes 7 fractional digits: trim strftime's 9 to 7.
            "TIMESTAMP": stamps.dt.strftime("%Y-%m-%d %H:%M:%S%.9f").str.slice(0, 27),
            "ContextTokens": rng.lognormal(7.0, 1.0, num_rows).astype(np.int64) + 1,
            "GeneratedTokens": rng.lognormal(4.5, 1.0, num_rows).astype(np.int64) + 1,
        }
    ).write_csv(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "azure_1m.csv"
        write_azure_csv(path, args.rows)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            parsed = parse_trace(path)
            times.append(time.perf_counter() - start)
        size_mb = path.stat().st_size / 1e6
    s = parsed.stats
    print(f"rows={s.num_requests:,} file={size_mb:.1f} MB format={parsed.format.value}")
    print(f"span={s.duration_s:,.1f} s rate={s.mean_rate:.2f}/s cv={s.interarrival_cv:.2f}")
    print(f"parse+stats: median {statistics.median(times):.3f} s over {args.repeats} runs")
    print("runs: " + ", ".join(f"{t:.3f}" for t in times))


if __name__ == "__main__":
    main()
