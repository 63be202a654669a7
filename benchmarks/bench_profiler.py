"""Time the default CPU profile grid on the tiny shape, then store and reload it.

    .venv/bin/python benchmarks/bench_profiler.py [--repeats N] [--grid quick|default]

Prints the sweep's wall time (median over repeats), the sample count, where the
time went per op, and the SQLite store/load time of the samples.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--grid", choices=("quick", "default"), default="default")
    args = parser.parse_args()

    from optimizer.shapes import get_shape
    from profiler.device import describe_device, parse_device
    from profiler.sweep import default_cpu_grid, quick_grid, run_sweep

    shape = get_shape("tiny")
    grid = default_cpu_grid() if args.grid == "default" else quick_grid()
    walls: list[float] = []
    per_op: dict[str, float] = defaultdict(float)
    samples = []
    for _ in range(args.repeats):
        last = [time.perf_counter()]

        def progress(_done: int, _total: int, label: str, last: list[float] = last) -> None:
            now = time.perf_counter()
            per_op[label.split()[0]] += now - last[0]
            last[0] = now

        start = time.perf_counter()
        samples = run_sweep(shape, grid, "cpu", progress=progress)
        walls.append(time.perf_counter() - start)
    print(f"grid {args.grid}, shape tiny, {grid.num_threads} thread(s), {args.repeats} repeat(s)")
    print(
        f"sweep wall time: median {statistics.median(walls):.1f} s  (all: "
        f"{', '.join(f'{w:.1f}' for w in walls)})"
    )
    print(f"samples: {len(samples)}")
    print("time per op (summed over repeats):")
    for op, seconds in sorted(per_op.items(), key=lambda kv: -kv[1]):
        print(f"  {op:<16} {seconds:7.2f} s")
    _bench_storage(samples, describe_device(parse_device("cpu"), grid.num_threads))


def _bench_storage(samples: list, device) -> None:
    from storage.db import make_engine, session_scope, upgrade_database
    from storage.profiles import create_profile_run, load_samples

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade_database(url, "0002_profiles")
        engine = make_engine(url)
        many = samples * max(1, 50_000 // len(samples))
        start = time.perf_counter()
        with session_scope(engine) as s:
            run = create_profile_run(
                s, name="bench", source="profiler", accelerator="cpu", device=device, samples=many
            )
        stored = time.perf_counter()
        with session_scope(engine) as s:
            loaded = load_samples(s, run.id)
        done = time.perf_counter()
        engine.dispose()
    assert loaded == many
    print(f"SQLite: store {len(many):,} samples {stored - start:.2f} s, load {done - stored:.2f} s")


if __name__ == "__main__":
    main()
