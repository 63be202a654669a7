"""How sensitive closed-loop TTFT is to what de-synchronises equal clients
(docs/closed-loop.md). Usage:

    .venv/bin/python benchmarks/bench_closed_loop.py [--database URL]

`vllm bench serve` workloads (random dataset, fixed lengths, request_rate inf,
max_concurrency N) on Qwen3-32B TP2 and Llama-3.1-8B TP1, H100, vLLM v1 defaults
(8,192 batched tokens, 1,024 sequences, chunked prefill), priced by the fitted
AIConfigurator H100 model. For each, mean/median TTFT and mean TPOT with the API
server's path (`FrontendDelay`) off (clients in lock-step), at its default, at half
and at twice the default, and with the jitter alone.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from bench_common import prepare_database

from optimizer.bench_serve import BenchServeSpec
from optimizer.config import InstanceConfig, ServingConfig
from optimizer.sim import simulate
from optimizer.workload import NO_FRONTEND, FrontendDelay

CASES = (
    ("Qwen/Qwen3-32B", 2, 8, 1024, 1024),
    ("Qwen/Qwen3-32B", 2, 64, 1024, 1024),
    ("meta-llama/Llama-3.1-8B-Instruct", 1, 8, 1024, 128),
    ("meta-llama/Llama-3.1-8B-Instruct", 1, 64, 4096, 512),
)


def _frontends() -> list[tuple[str, FrontendDelay]]:
    d = FrontendDelay()
    return [
        ("lock-step (none)", NO_FRONTEND),
        ("jitter only", replace(d, per_request_s=0.0, per_prompt_token_s=0.0)),
        (
            "default / 2",
            FrontendDelay(d.per_request_s / 2, d.per_prompt_token_s / 2, d.jitter_s / 2),
        ),
        ("default", d),
        (
            "default x 2",
            FrontendDelay(2 * d.per_request_s, 2 * d.per_prompt_token_s, 2 * d.jitter_s),
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", default=None, help="a database with a fitted H100 model")
    args = parser.parse_args()
    from api.services.tuning import stored_latency

    with tempfile.TemporaryDirectory() as tmp:
        url, _ = prepare_database(args.database, Path(tmp))
        for model, tp, conc, isl, osl in CASES:
            inst = InstanceConfig(tp=tp, max_num_batched_tokens=8192, max_num_seqs=1024)
            config = ServingConfig.colocated(model, inst)
            latency = stored_latency(url, model).source
            spec = BenchServeSpec(random_input_len=isl, random_output_len=osl,
                                  num_prompts=conc * 10, max_concurrency=conc)  # fmt: skip
            print(f"\n{model} TP{tp} on H100, {conc} clients, {isl}/{osl} tokens, "
                  f"{spec.num_prompts} prompts")  # fmt: skip
            print(f"  {'frontend':18s} {'TTFT mean':>10s} {'median':>8s} {'TPOT mean':>10s}")
            for label, frontend in _frontends():
                wl = replace(spec, frontend=frontend).build()
                res = simulate(wl, config, latency, seed=0)
                print(f"  {label:18s} {np.nanmean(res.ttft_s) * 1e3:8.0f} ms "
                      f"{np.nanmedian(res.ttft_s) * 1e3:6.0f} ms "
                      f"{np.nanmean(res.tpot_s) * 1e3:8.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
