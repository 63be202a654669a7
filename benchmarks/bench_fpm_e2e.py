"""Whole requests of vLLM 0.20.1 on B300, simulated: the "real" segment of each
observations/aic-fpm-b300 run, 128 requests of OpenAssistant-shaped lengths (100-16,384
tokens in, 100-4,096 out, ignore_eos, non-streaming) sent by a closed loop of 32 clients
through NVIDIA Dynamo's frontend, each request's end-to-end seconds in `collect.log`.
Usage:

    .venv/bin/python benchmarks/bench_fpm_e2e.py

Each run is replayed by `optimizer.sim.simulate` (the function `servetune simulate`
calls) as a `ClosedLoopWorkload` of the run's own lengths in its own order, on the
run's layout (TP, EP, DP attention) with vLLM 0.20.1's defaults (8,192 batched tokens,
prefix caching on: the Qwen3.6 hybrid's prompt chunks end on its block boundaries),
priced by the AIConfigurator B300 tables imported and fitted in-process. Printed per
run: the mean end-to-end latency measured and simulated, the median |error| per request
and the makespan. Left out: Dynamo's frontend is modelled as vLLM's API server
(`FrontendDelay` defaults), and the segments before this one (their requests had all
finished: the loop starts on an idle engine).

Runs: Qwen3-32B (dense) at TP 1/2/4/8; Qwen3.6-35B-A3B (MoE, Gated DeltaNet) at TP 1-8
with and without EP, and with DP attention + EP.

Second, lone prefills: each run's "context" segment, 18 prompts of 128, 1,024 and 4,096
tokens with one output token, sent one at a time, so each is one step on an idle engine
(priced as the simulator prices an idle start: the engine's CPU work in line). Printed
per run and prompt length: the median measured and simulated end-to-end time. Left out:
the prompts are random token ids, and a repeated length may hit the prefix cache (the
Qwen3.6 steps show 4,096-token prompts computing 400 tokens); the simulation computes
every prompt whole.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
from step_fit import DENSE, RELEASE, fit_b300, moe_folders

from optimizer.closed_loop_workload import ClosedLoopWorkload
from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency import build_catalog
from optimizer.latency.model import LatencyModel
from optimizer.parallel import ExpertLayout
from optimizer.sim import simulate
from optimizer.validation.compare import ValidationError
from optimizer.validation.fpm_requests import segment_requests

CLIENTS = 32


def replay(model: LatencyModel, shape_name: str, folder: Path, tp: int, layout: ExpertLayout):
    """(mean measured e2e, mean simulated, median |error| per request) of one run's real
    segment, or the reason it cannot be replayed."""
    try:
        requests = segment_requests(folder)
    except ValidationError as exc:
        return str(exc)
    config = _config(shape_name, tp, layout)
    workload = ClosedLoopWorkload(
        num_clients=CLIENTS,
        input_tokens=np.array([r.prompt_tokens for r in requests]),
        output_tokens=np.array([r.output_tokens for r in requests]),
        name=folder.name,
    )
    got = np.asarray(simulate(workload, config, build_catalog(config.shape, [model])).e2e_s)
    want = np.array([r.e2e_s for r in requests])
    return float(want.mean()), float(got.mean()), float(np.median(np.abs(got / want - 1.0)))


def lone_prefills(model: LatencyModel, shape_name: str, folder: Path, tp: int,
                  layout: ExpertLayout) -> dict[int, tuple[float, float]] | str:  # fmt: skip
    """Prompt length -> (median measured e2e, median simulated) of the run's context
    segment, replayed one request at a time; or the reason it cannot be."""
    try:
        requests = segment_requests(folder, "context")
    except ValidationError as exc:
        return str(exc)
    workload = ClosedLoopWorkload(
        num_clients=1,
        input_tokens=np.array([r.prompt_tokens for r in requests]),
        output_tokens=np.array([r.output_tokens for r in requests]),
        name=f"{folder.name} context",
    )
    config = _config(shape_name, tp, layout)
    got = simulate(workload, config, build_catalog(config.shape, [model])).e2e_s
    out: dict[int, tuple[float, float]] = {}
    for n in sorted({r.prompt_tokens for r in requests}):
        pick = [i for i, r in enumerate(requests) if r.prompt_tokens == n]
        out[n] = (statistics.median(requests[i].e2e_s for i in pick),
                  statistics.median(float(got[i]) for i in pick))  # fmt: skip
    return out


def _config(shape_name: str, tp: int, layout: ExpertLayout) -> ServingConfig:
    inst = InstanceConfig(accelerator="b300", tp=tp, dp=layout.dp,
                          expert_parallel=layout.expert_parallel,
                          max_num_batched_tokens=8192, max_num_seqs=1024)  # fmt: skip
    return ServingConfig.colocated(shape_name, inst, engine_version=RELEASE.version,
                                   enable_prefix_caching=True)  # as the runs had it  # fmt: skip


def _replayed(fn, model: LatencyModel, runs):
    """(folder, layout, shape, what `fn` gives) of each run it can replay; the reason
    printed for each it cannot."""
    for folder, tp, layout, shape in runs:
        got = fn(model, shape, folder, tp, layout)
        if isinstance(got, str):
            print(f" {shape} {folder.name}: {got}")
            continue
        yield folder, tp, layout, shape, got


def main() -> None:
    model = fit_b300()
    runs = [(DENSE / f"tp{tp}_ep1_past4096", tp, ExpertLayout(1, False), "qwen3-32b")
            for tp in (1, 2, 4, 8)]  # fmt: skip
    runs += [(f, tp, layout, "qwen3.6-35b-a3b") for f, tp, layout in moe_folders()]
    print(f"== whole requests, {RELEASE.label}, B300: closed loop of {CLIENTS}, 128 requests ==")
    errs: dict[str, list[float]] = {}
    for folder, tp, layout, shape, (want, sim, med) in _replayed(replay, model, runs):
        errs.setdefault(shape, []).append(sim / want - 1.0)
        print(f" {shape:16s} {folder.name:18s} tp {tp} {layout.key or 'no EP':7s}: mean e2e "
              f"measured {want:6.2f} s, simulated {sim:6.2f} s ({sim / want - 1:+6.1%}); "
              f"median |error| per request {med:5.1%}")  # fmt: skip
    for shape, e in errs.items():
        print(f"  {shape}: median |error| of the mean over {len(e)} runs "
              f"{statistics.median(abs(x) for x in e):.1%}")  # fmt: skip
    print("\n== lone prefills: the context segment, one request at a time on an idle engine ==")
    lone: dict[str, list[float]] = {}
    for folder, _, _, shape, got in _replayed(lone_prefills, model, runs):
        cells = []
        for n, (want, sim) in got.items():
            lone.setdefault(shape, []).append(sim / want - 1.0)
            cells.append(
                f"{n:5d} tok {want * 1e3:6.1f} / {sim * 1e3:6.1f} ms ({sim / want - 1:+6.1%})"
            )
        print(f" {shape:16s} {folder.name:18s}: " + "; ".join(cells))
    for shape, e in lone.items():
        print(f"  {shape}: median |error| over {len(e)} (run, length) cells "
              f"{statistics.median(abs(x) for x in e):.1%} (signed "
              f"{statistics.median(e):+.1%})")  # fmt: skip


if __name__ == "__main__":
    main()
