"""Simulator accuracy against real execution: the reference engine replaying Azure traces.

Profiles the tiny shape on this CPU once (or loads `--samples`), fits the
latency model, then for each config x trace simulates and replays the same
workload in real time and reports the relative error of mean/p99 TTFT and
TPOT and goodput (targets: median absolute error <= 10% for means and
goodput, <= 20% for p99). It then fits a calibration on one half of the runs
and reports the error before and after on the other half.

    .venv/bin/python benchmarks/bench_validate.py [--requests 30] [--samples /tmp/s.pkl]
"""

from __future__ import annotations

import argparse
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from api.cli.validate import (
    EngineLatency,
    fit_engine_latency,
    prepare_workload,
    profile_samples,
    run_validation,
)
from optimizer.config import InstanceConfig, ServingConfig, SpecMethod, SpeculationConfig
from optimizer.sim import SLO
from optimizer.traces import parse_trace
from optimizer.validation import (
    CalibratedSource,
    CalibrationCase,
    Metric,
    RequestOutcomes,
    default_slo,
    evaluate,
    fit_calibration,
)
from optimizer.workload import Workload

TRACES = Path("/work/shared/data/traces/azure2023")
TARGETS = {
    Metric.MEAN_TTFT: 0.10,
    Metric.MEAN_TPOT: 0.10,
    Metric.GOODPUT: 0.10,
    Metric.P99_TTFT: 0.20,
    Metric.P99_TPOT: 0.20,
}
# Per trace: arrival time scale and token caps that keep a replay ~20-40 s on 2 cores.
TRACE_SETTINGS = {
    "code": {"time_scale": 2.0, "max_input_tokens": 1024, "max_output_tokens": 64},
    "conv": {"time_scale": 1.5, "max_input_tokens": 768, "max_output_tokens": 128},
}


def _instance(**kw: object) -> InstanceConfig:
    base = {
        "accelerator": "cpu",
        "max_num_batched_tokens": 256,
        "max_num_seqs": 16,
        "gpu_memory_utilization": 0.05,
    }
    return InstanceConfig(**{**base, **kw})  # type: ignore[arg-type]


def configs() -> dict[str, ServingConfig]:
    spec = SpeculationConfig(
        method=SpecMethod.DRAFT,
        num_speculative_tokens=3,
        acceptance_rate=0.7,
        draft_model="tiny-draft",
    )
    return {
        "chunked": ServingConfig.colocated("tiny", _instance()),
        "spec-k3": ServingConfig.colocated("tiny", _instance(), speculation=spec),
        "pd-1p1d": ServingConfig.disaggregated("tiny", _instance(), _instance()),
    }


@dataclass(frozen=True, slots=True)
class Run:
    config: str
    trace: str
    case: CalibrationCase
    errors: dict[Metric, float]
    predicted: dict[Metric, float]
    measured: dict[Metric, float]
    seconds: float
    notes: str


def _load_trace(kind: str, n: int) -> Workload:
    w = Workload.from_columns(
        parse_trace(TRACES / f"AzureLLMInferenceTrace_{kind}.csv").columns, name=f"azure-{kind}"
    )
    return prepare_workload(w, max_requests=n, **TRACE_SETTINGS[kind])


def _fmt(metric: Metric, v: float) -> str:
    return f"{v:.3f}/s" if metric is Metric.GOODPUT else f"{v * 1e3:.1f}ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--samples", type=Path, help="pickled KernelSamples (skip profiling)")
    parser.add_argument("--configs", default="chunked,spec-k3,pd-1p1d")
    parser.add_argument("--traces", default="code,conv")
    parser.add_argument("--clock", default="auto", choices=("auto", "wall", "cpu"))
    parser.add_argument(
        "--mixed-overhead", action="store_true",
        help="fit the per-step overhead on the profile's mixed iterations (default: 0.5 ms)",
    )  # fmt: skip
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    if args.samples and args.samples.exists():
        samples = pickle.loads(args.samples.read_bytes())
    else:
        t0 = time.perf_counter()
        samples = profile_samples("tiny")
        print(f"profiled tiny on CPU: {len(samples)} samples in {time.perf_counter() - t0:.0f} s")
        if args.samples:
            args.samples.write_bytes(pickle.dumps(samples))
    latency = fit_engine_latency(samples, "tiny", overhead_from_mixed=args.mixed_overhead)
    print(f"latency: {latency.label}")
    runs: list[Run] = []
    for tname in args.traces.split(","):
        workload = _load_trace(tname, args.requests)
        for cname in args.configs.split(","):
            cfg = configs()[cname]
            t0 = time.perf_counter()
            out = run_validation(workload, cfg, latency, clock=args.clock)
            took = time.perf_counter() - t0
            c = out.comparison
            real = out.replay
            notes = (
                f"preempt={int(real.num_preemptions.sum())} kv={real.num_kv_transfers} "
                f"({real.kv_transfer_s * 1e3:.0f}ms) load={os.getloadavg()[0]:.1f}"
            )
            measured = RequestOutcomes(
                real.arrival_s, real.input_tokens, real.output_tokens, real.ttft_s, real.e2e_s
            )
            runs.append(
                Run(
                    cname,
                    tname,
                    CalibrationCase(workload, cfg, measured, f"{cname}/{tname}"),
                    {m: c.error(m) for m in TARGETS},
                    {m: c.predicted.value(m) for m in TARGETS},
                    {m: c.measured.value(m) for m in TARGETS},
                    took,
                    notes,
                ),
            )
            cells = "  ".join(
                f"{m.value}={_fmt(m, runs[-1].predicted[m])}/{_fmt(m, runs[-1].measured[m])}"
                f"({runs[-1].errors[m] * 100:+.1f}%)"
                for m in TARGETS
            )
            print(f"{cname:8s} {tname:5s} {took:5.1f}s  {cells}  {notes}", flush=True)
    print("\nmedian |error| over runs (predicted vs measured):")
    for m, target in TARGETS.items():
        med = float(np.median([abs(r.errors[m]) for r in runs]))
        flag = "ok" if med <= target else "MISS"
        print(f"  {m.value:14s} {med * 100:6.1f}%  (target <= {target * 100:.0f}%: {flag})")
    _calibration_report(runs, latency)
    print(f"load average at end: {os.getloadavg()}")


def _calibration_report(runs: list[Run], latency: EngineLatency) -> None:
    """Fit on the code-trace runs, test on the conv-trace runs (held out)."""
    fit_on = [r.case for r in runs if r.trace == "code"]
    held = [r for r in runs if r.trace != "code"]
    if not fit_on or not held:
        return
    fit = fit_calibration(fit_on, latency.target, draft_latency=latency.draft)
    cal = fit.calibration
    print(
        f"\ncalibration on {len(fit_on)} code runs: overhead {cal.overhead_s * 1e3:.2f} ms, "
        f"prefill x{cal.prefill_scale:.3f}, decode x{cal.decode_scale:.3f} "
        f"(loss {fit.loss_before:.4f} -> {fit.loss_after:.4f})"
    )
    tuned = CalibratedSource(latency.target, default=cal)
    for m in TARGETS:
        before = [abs(r.errors[m]) for r in held]
        after = []
        for r in held:
            draft = latency.draft if r.case.config.speculation.draft_model else None
            (cmp_after,) = evaluate([r.case], tuned, _slo(r), draft_latency=draft)
            after.append(abs(cmp_after.error(m)))
        print(
            f"  held-out {m.value:14s} median |error| {np.median(before) * 100:6.1f}% -> "
            f"{np.median(after) * 100:6.1f}%"
        )


def _slo(run: Run) -> SLO:
    return default_slo(run.case.measured)


if __name__ == "__main__":
    main()
