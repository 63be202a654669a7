"""`servetune observe` speed: a scrape pair holding 10,000 requests' histograms.

    .venv/bin/python benchmarks/bench_observe.py [--requests 10000] [--repeats 5]
        [--database URL]

The scrapes are rendered in vLLM's bucket boundaries from a simulated window
(`optimizer.telemetry.synthetic`): 10,000 requests at 15 req/s of Llama-3.1-8B on
one H100 (examples/colocated-h100.yaml), lognormal prompts (mean 800 tokens) and
outputs (mean 200), priced by the roofline. The whole command then runs as a
subprocess, as the console script runs it (`api.cli.main` in a fresh interpreter,
this checkout first on the path, bytecode caches on), against a temporary SQLite
database (no fitted model: the roofline estimate; `--database` names another).
Prints the median wall time of the repeats against the issue's 2 s target.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench_common import REPO, run

TARGET_S = 2.0
CONFIG = REPO / "examples" / "colocated-h100.yaml"


def write_scrapes(folder: Path, num_requests: int) -> tuple[Path, Path, float]:
    """BEFORE (500 earlier requests) and AFTER (those plus `num_requests` more) pages,
    and the window's length in seconds."""
    import yaml

    from optimizer.config import ServingConfig
    from optimizer.latency import build_catalog
    from optimizer.shapes import get_shape
    from optimizer.sim import simulate
    from optimizer.telemetry.synthetic import VllmTraffic, render_vllm_page
    from optimizer.workload import LognormalLength, synthetic_workload

    cfg = ServingConfig.from_dict(yaml.safe_load(CONFIG.read_text()))
    latency = build_catalog(get_shape(cfg.model), [])
    window = synthetic_workload(num_requests, 15.0, input_lengths=LognormalLength(800),
                                output_lengths=LognormalLength(200), seed=1)  # fmt: skip
    earlier = VllmTraffic.of(simulate(window.head(500), cfg, latency))
    served = VllmTraffic.of(simulate(window, cfg, latency))
    before, after = folder / "before.prom", folder / "after.prom"
    before.write_text(render_vllm_page(earlier))
    after.write_text(render_vllm_page(earlier.plus(served)))
    return before, after, window.duration_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--database", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        before, after, window_s = write_scrapes(folder, args.requests)
        url = args.database or f"sqlite:///{folder / 'bench.db'}"
        env = {**os.environ, "SERVETUNE_DATABASE_URL": url, "PYTHONPATH": str(REPO)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        cmd = [sys.executable, "-c", "from api.cli import main; main()", "observe",
               "--scrape", str(before), "--scrape", str(after), "--window-s", f"{window_s:.3f}",
               "--config", str(CONFIG), "--json"]  # fmt: skip
        run(cmd, env, cwd=REPO)  # warm-up: bytecode caches, the database file
        times = [run(cmd, env, cwd=REPO)[0] for _ in range(args.repeats)]
    median = statistics.median(times)
    verdict = "meets" if median <= TARGET_S else "MISSES"
    print(f"servetune observe, {args.requests:,} requests' histograms: median "
          f"{median:.2f} s of {args.repeats} runs (min {min(times):.2f}, max {max(times):.2f}); "
          f"{verdict} the {TARGET_S:g} s target")  # fmt: skip


if __name__ == "__main__":
    main()
