"""Measured online vLLM runs against servetune: four `vllm bench serve` results of
vLLM 0.8.3 (V1 engine) serving Llama-3.3-70B-Instruct on 8 x A100 40 GB (TP8,
prefix caching on), ShareGPT at 1, 4, 16 and unlimited requests/s
(../shared/data/observations/vllm-bench; its README gives the protocol). Usage:

    .venv/bin/python benchmarks/bench_online.py [--database URL]

What is modelled, and why:
- Arrivals: the files have no start_times; the April-2025 client sent the first
  request at 0 and each next after a gamma gap from numpy seeded with 0, so the
  schedule is regenerated exactly (`optimizer.validation.observations`).
- The four runs used the same 200 prompts (seed 0) on one server, one after the
  other, with prefix caching on: each later run finds the earlier runs' prompts in
  the cache. They are replayed back to back on one engine, each prompt its own
  chain of block hashes, 60 s apart; a run priced with a cold cache would prefill
  42,659 tokens of a 70B model for the unlimited-rate run, about 6e15 FLOP, which
  8 A100s cannot do in the 0.45 s its slowest TTFT took.
- Engine: V1 defaults of 0.8.3 (8,192 batched tokens, 256 sequences, chunked
  prefill), bf16, gpu_memory_utilization 0.9, priced by the fitted AIConfigurator
  A100 model.

Prints mean TTFT and mean TPOT per run, measured and predicted, with no engine
overhead, with the former 0.5 ms constant, and with `DEFAULT_ENGINE_OVERHEAD`
(fitted on the V0-era development set, benchmarks/bench_devset.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from bench_common import SHARED, prepare_database

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.overhead import DEFAULT_ENGINE_OVERHEAD, NO_OVERHEAD, EngineOverhead
from optimizer.sim import simulate
from optimizer.validation.observations import Observation, load_vllm_result
from optimizer.workload import Workload

RUNS = SHARED / "observations" / "vllm-bench" / "surajssd-llm-k8s-a100"
MODEL = "meta-llama/Llama-3.3-70B-Instruct"
BLOCK = 16
GAP_S = 60.0  # between runs: each drains before the next starts


def back_to_back(runs: list[Observation]) -> tuple[Workload, np.ndarray]:
    """The runs as one workload on one engine (request i of every run is the same
    prompt: the same block-hash chain), and each request's run index."""
    arrival, inp, out, hashes, run_of = [], [], [], [], []
    start = 0.0
    for k, obs in enumerate(runs):
        w = obs.workload
        for i, n in enumerate(w.input_tokens.tolist()):
            hashes.append(np.arange(n // BLOCK, dtype=np.int64) + i * 1_000_000)
        arrival.append(w.arrival_s + start)
        inp.append(w.input_tokens)
        out.append(w.output_tokens)
        run_of.append(np.full(len(w.input_tokens), k))
        start += float(w.arrival_s.max()) + GAP_S
    workload = Workload(
        np.concatenate(arrival), np.concatenate(inp), np.concatenate(out),
        prefix_hashes=tuple(hashes), prefix_block_tokens=BLOCK, name="4 runs back to back",
    )  # fmt: skip
    return workload, np.concatenate(run_of)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", default=None, help="a database with a fitted A100")
    args = parser.parse_args()
    files = sorted(RUNS.glob("*_qps_*.json"))
    if len(files) != 4:
        print(f"expected 4 runs in {RUNS}, found {len(files)}", file=sys.stderr)
        return 1
    from api.services.tuning import stored_latency

    runs = [load_vllm_result(f) for f in files]
    names = [f.stem.rsplit("_", 1)[-1] for f in files]
    if any((r.workload.input_tokens != runs[0].workload.input_tokens).any() for r in runs):
        print("the runs do not share their prompts; the back-to-back replay does not apply")
        return 1
    workload, run_of = back_to_back(runs)
    inst = InstanceConfig(
        accelerator="a100-40gb", tp=8, max_num_batched_tokens=8192, max_num_seqs=256
    )
    config = ServingConfig.colocated(MODEL, inst, enable_prefix_caching=True)
    measured = [
        (float(np.mean(r.outcomes.ttft_s)), float(np.nanmean(r.outcomes.tpot_s))) for r in runs
    ]
    print(f"{MODEL} TP8 on 8 x A100 40 GB, vLLM 0.8.3 defaults, prefix caching on")
    print(f"{'':26s}" + "".join(f"{'qps ' + n:>18s}" for n in names) + "  median |error|")
    print(f"{'measured TTFT / TPOT ms':26s}"
          + "".join(f"{t * 1e3:10.0f} /{p * 1e3:5.1f}" for t, p in measured))  # fmt: skip
    variants: list[tuple[str, EngineOverhead]] = [
        ("no engine overhead", NO_OVERHEAD),
        ("0.5 ms per step", EngineOverhead.constant(5e-4)),
        ("DEFAULT_ENGINE_OVERHEAD", DEFAULT_ENGINE_OVERHEAD),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        url, _ = prepare_database(args.database, Path(tmp), gpus=("a100",))
        for label, overhead in variants:
            latency = stored_latency(url, MODEL, overhead=overhead).source
            res = simulate(workload, config, latency, seed=0)
            line, ttft_err, tpot_err = f"{label:26s}", [], []
            for k, (m_ttft, m_tpot) in enumerate(measured):
                mine = run_of == k
                ttft = float(np.nanmean(res.ttft_s[mine]))
                tpot = float(np.nanmean(res.tpot_s[mine]))
                ttft_err.append(ttft / m_ttft - 1.0)
                tpot_err.append(tpot / m_tpot - 1.0)
                line += f"{ttft * 1e3:10.0f} /{tpot * 1e3:5.1f}"
            print(line + f"  TTFT {statistics.median(map(abs, ttft_err)):.1%}, "
                  f"TPOT {statistics.median(map(abs, tpot_err)):.1%}")  # fmt: skip
            print(f"{'':26s}" + "".join(
                f"{a:+9.0%} /{b:+5.0%}" for a, b in zip(ttft_err, tpot_err, strict=True)
            ))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
