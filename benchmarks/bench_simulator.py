"""Simulator speed on the Azure conv trace (19,366 requests, ~4.1M output tokens).

Scenarios (issue 4 targets on the 2-core dev machine): one colocated replica
with chunked prefill (<= 5 s), the same with EAGLE-style speculation (<= 10 s),
and disaggregated 2 prefill + 2 decode (<= 10 s). The latency model is a
`LinearLatency` calibrated to look like Llama-3.1-8B on H100 (7 ms per step,
27 us per token, 39 ns per decode KV token, attention q x kv term).

    .venv/bin/python benchmarks/bench_simulator.py [--repeats 3] [--profile SCENARIO]

Prints the median wall time of the repeats, simulated requests/s and steps/s.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

from optimizer.config import InstanceConfig, ServingConfig, SpecMethod, SpeculationConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.sim import SLO, simulate
from optimizer.workload import Workload

SHARED = Path(
    os.environ.get("SERVETUNE_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)
TRACE = SHARED / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
LATENCY = SingleLatencySource(
    LinearLatency(base_s=7e-3, per_token_s=27e-6, per_kv_token_s=39e-9, per_prefill_attn_s=1e-9)
)
SLO_8B = SLO(ttft_s=2.0, tpot_s=0.1)


def load_trace(path: Path) -> Workload:
    df = pl.read_csv(path, schema_overrides={"TIMESTAMP": pl.Utf8})
    ts = df["TIMESTAMP"].str.to_datetime("%Y-%m-%d %H:%M:%S%.f").dt.epoch("us").to_numpy()
    order = np.argsort(ts, kind="stable")
    arrival = (ts[order] - ts[order][0]) / 1e6
    return Workload(
        arrival_s=arrival,
        input_tokens=df["ContextTokens"].to_numpy()[order],
        output_tokens=df["GeneratedTokens"].to_numpy()[order],
        name="azure-conv",
    )


def scenarios() -> dict[str, ServingConfig]:
    model = "llama-3.1-8b"
    inst = InstanceConfig(accelerator="h100", max_num_batched_tokens=2048, max_num_seqs=256)
    eagle = SpeculationConfig(
        method=SpecMethod.EAGLE, num_speculative_tokens=3, acceptance_rate=0.7
    )
    return {
        "colocated": ServingConfig.colocated(model, inst),
        "colocated-8192": ServingConfig.colocated(
            model, InstanceConfig(accelerator="h100", max_num_batched_tokens=8192)
        ),
        "speculative": ServingConfig.colocated(model, inst, speculation=eagle),
        "disagg-2p2d": ServingConfig.disaggregated(model, inst, inst, num_prefill=2, num_decode=2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--profile", default=None, help="cProfile one scenario and print the top")
    args = parser.parse_args()
    if not TRACE.exists():
        print(f"trace not found: {TRACE}", file=sys.stderr)
        return 1
    workload = load_trace(TRACE)
    print(f"trace: {len(workload)} requests, {workload.total_output_tokens:,} output tokens")
    configs = scenarios()
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        simulate(workload, configs[args.profile], LATENCY, seed=0, slo=SLO_8B)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return 0
    print(f"{'scenario':16} {'wall s':>8} {'req/s':>10} {'steps/s':>10} {'steps':>9} "
          f"{'p99 TTFT s':>10} {'p50 TPOT ms':>11} {'attain':>7}")  # fmt: skip
    for name, cfg in configs.items():
        if args.only and name not in args.only:
            continue
        walls = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = simulate(workload, cfg, LATENCY, seed=0, slo=SLO_8B)
            walls.append(time.perf_counter() - t0)
        wall = statistics.median(walls)
        steps = res.phases.num_steps
        print(
            f"{name:16} {wall:8.2f} {len(workload) / wall:10,.0f} {steps / wall:10,.0f} "
            f"{steps:9,} {res.ttft.p99:10.3f} {res.tpot.p50 * 1e3:11.2f} "
            f"{res.slo_attainment:7.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
