"""How sensitive closed-loop TTFT is to each modelled mechanism of the benchmark client,
the API server and the engine (docs/closed-loop.md). Usage:

    .venv/bin/python benchmarks/bench_closed_loop.py [--database URL]

Cases from the development set (aiperf closed loops of vLLM 0.12.0 serving Qwen3-32B on
H100, observations/aic-silicon-dev), each replayed as shipped (the protocol the runs
were made with, `optimizer.validation.devset`: 10C requests after 2C warm-ups and the
client's barrier, the generator's C + isl + 1,500-token budget and C sequences, Qwen3's 8
chat-template tokens, aiperf's turnaround, the API server's path, V1 synchronous
scheduling) and with one mechanism
changed at a time; mean and median TTFT, mean TPOT, against the measured means. Two
more rows start the measured clients spread over a quarter and a half of a request's
cycle instead of as the client's burst, and one starts them at independent uniform
phases of a cycle (`ClosedLoopWorkload.out_of_step`): how far the answer moves when the
clients are out of step. A last row gives
every step a random GPU time (its price times a lognormal factor, sigma 0.2): whether
run-to-run variance of the GPU's steps breaks the clients' groups.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from bench_common import SHARED, prepare_database

from optimizer.closed_loop_workload import NO_FRONTEND, FrontendDelay
from optimizer.latency.base import LatencySource, StepLatency, StepLoad, idle_step_time
from optimizer.sim import simulate
from optimizer.validation.devset import closed_loop_deployment, closed_loop_runs_of

CASES = (  # (tp, isl, osl, concurrency)
    (2, 1024, 128, 8), (8, 1024, 128, 8), (2, 1024, 1024, 32), (8, 1024, 1024, 64),
    (2, 4096, 1024, 8), (4, 4096, 512, 32),
)  # fmt: skip


STEP_SIGMA = 0.2  # lognormal spread of each step's GPU time around its price


@dataclass
class _NoisySteps:
    """A step model whose every step takes its price times a lognormal factor."""

    inner: StepLatency
    rng: random.Random = field(default_factory=lambda: random.Random(1))

    @property
    def is_estimate(self) -> bool:
        return self.inner.is_estimate

    def step_time_s(self, load: StepLoad) -> float:
        return self.inner.step_time_s(load) * self.rng.lognormvariate(0.0, STEP_SIGMA)

    def idle_step_time_s(self, load: StepLoad) -> float:
        return idle_step_time(self.inner)(load) * self.rng.lognormvariate(0.0, STEP_SIGMA)


@dataclass(frozen=True)
class _NoisySource:
    inner: LatencySource

    def for_instance(self, *args, **kwargs) -> StepLatency:
        return _NoisySteps(self.inner.for_instance(*args, **kwargs))


def _variants(spec, config):
    fe = spec.frontend
    yield "as shipped", spec, config
    yield "no API-server path", replace(spec, frontend=NO_FRONTEND), config
    yield "API server x 3", replace(spec, frontend=FrontendDelay(
        3 * fe.per_request_s, 3 * fe.per_prompt_token_s, 3 * fe.jitter_s)), config  # fmt: skip
    yield "no chat-template tokens", replace(spec, chat_template_tokens=0), config
    yield "no warm-ups (cold burst)", replace(spec, num_warmups=0), config
    yield "vllm bench serve client", replace(spec, client="vllm"), config
    yield "async scheduling (0.20)", spec, replace(config, engine_version="0.20.1")


def _row(label: str, res) -> str:
    ttft, tpot = res.ttft_s * 1e3, res.tpot_s * 1e3
    return (f"  {label:32s} {np.nanmean(ttft):8.0f} ms {np.nanmedian(ttft):5.0f} ms "
            f"{np.nanmean(tpot):8.1f} ms")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", default=None, help="a database with a fitted H100 model")
    args = parser.parse_args()
    from api.services.tuning import stored_latency

    path = SHARED / "observations" / "aic-silicon-dev" / "qwen3_32b_h100_vllm.csv"
    runs = {(r.tp, r.isl, r.osl, r.concurrency): r for r in closed_loop_runs_of(path)
            if not r.precision}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        url, _ = prepare_database(args.database, Path(tmp))
        latency = stored_latency(url, "Qwen/Qwen3-32B").source
        for case in CASES:
            run = runs[case]
            config, spec = closed_loop_deployment(run)
            print(f"\nQwen3-32B TP{run.tp} on H100, {run.concurrency} clients, "
                  f"{run.isl}/{run.osl}: measured mean TTFT {run.ttft_s * 1e3:.0f} ms, "
                  f"TPOT {run.tpot_s * 1e3:.1f} ms")  # fmt: skip
            print(f"  {'variant':32s} {'TTFT mean':>10s} {'p50':>7s} {'TPOT mean':>10s}")
            cycle = None
            for label, s, c in _variants(spec, config):
                res = simulate(s.workload(), c, latency, seed=0)
                if label == "as shipped":
                    cycle = float(np.nanmean(res.e2e_s))
                print(_row(label, res))
            assert cycle is not None
            wl = spec.workload()  # independent phases
            res = simulate(wl.out_of_step(cycle), config, latency, seed=0)
            print(_row("clients out of step", res))
            for share in (0.25, 0.5):  # the measured clients out of step from the start
                wl = replace(spec, num_warmups=0).workload()
                rel = np.zeros(len(wl))
                c = run.concurrency
                rel[:c] = np.linspace(0.0, share * cycle, c, endpoint=False)
                res = simulate(replace(wl, release_s=np.maximum.accumulate(rel)), config,
                               latency, seed=0)  # fmt: skip
                print(_row(f"clients spread over {share:g} cycle", res))
            res = simulate(spec.workload(), config, _NoisySource(latency), seed=0)
            print(_row(f"GPU steps +-{STEP_SIGMA:g} lognormal", res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
