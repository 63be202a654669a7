"""Simulator accuracy against real execution: the reference engine replaying Azure traces.

Profiles the tiny shape on this CPU once (or loads `--samples`), fits the
latency model, then per config measures the reference engine's own step cost
on synthetic batches (not the traces) and fits a correction to it (engine
self-calibration, `api.services.validation.calibrate_on_engine`). For each config x
trace it simulates with the self-calibrated model, replays the same workload
for real (every process on its own CPU-time clock) and reports the relative
error of mean/p99 TTFT and TPOT and goodput (targets: median absolute error
<= 10% for means and goodput, <= 20% for p99), with the uncalibrated profile
model's error alongside. Finally a trace calibration (for later searches) is
fitted on the one-process code-trace runs and tested on the held-out rest.

    .venv/bin/python benchmarks/bench_validate.py [--requests 60] [--samples /tmp/s.pkl]
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from api.services.validation import (
    EngineCalibration,
    EngineLatency,
    calibrate_on_engine,
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
# Per trace: arrival time scale and token caps (a replay on the CPU clock skips idle
# gaps, so 60 requests take ~10-20 s).
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
    raw_errors: dict[Metric, float]  # the profile model without self-calibration
    predicted: dict[Metric, float]
    measured: dict[Metric, float]
    seconds: float
    notes: str


def _load_trace(kind: str, n: int) -> Workload:
    w = Workload.from_columns(
        parse_trace(TRACES / f"AzureLLMInferenceTrace_{kind}.csv").columns, name=f"azure-{kind}"
    )
    return prepare_workload(w, max_requests=n, **TRACE_SETTINGS[kind])


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return f"load average {os.getloadavg()}"


def _fmt(metric: Metric, v: float) -> str:
    return f"{v:.3f}/s" if metric is Metric.GOODPUT else f"{v * 1e3:.1f}ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--samples", type=Path, help="pickled KernelSamples (skip profiling)")
    parser.add_argument("--configs", default="chunked,spec-k3,pd-1p1d")
    parser.add_argument("--traces", default="code,conv")
    parser.add_argument("--clock", default="auto", choices=("auto", "wall", "cpu"))
    parser.add_argument(
        "--mixed-overhead", action="store_true",
        help="fit the per-step overhead on the profile's mixed iterations (default: 0.5 ms)",
    )  # fmt: skip
    args = parser.parse_args()
    print(f"start: {_uptime()}")
    t_start = time.perf_counter()
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
    clock = "cpu" if args.clock == "auto" else args.clock
    runs: list[Run] = []
    for tname in args.traces.split(","):
        workload = _load_trace(tname, args.requests)
        for cname in args.configs.split(","):
            # Measured right before each replay, so both see the same machine state.
            selfcal = calibrate_on_engine(latency, configs()[cname], clock=clock)
            print(f"{cname} {tname}: {selfcal.describe()} [{selfcal.seconds:.1f} s]")
            runs.append(_one_run(workload, tname, cname, latency, selfcal, args.clock))
    print(f"\nmedian |error| over {len(runs)} runs (self-calibrated prediction vs measured):")
    for m, target in TARGETS.items():
        med = float(np.median([abs(r.errors[m]) for r in runs]))
        raw = float(np.median([abs(r.raw_errors[m]) for r in runs]))
        flag = "ok" if med <= target else "MISS"
        print(
            f"  {m.value:14s} {med * 100:6.1f}%  (target <= {target * 100:.0f}%: {flag:4s})"
            f"   uncalibrated profile model: {raw * 100:6.1f}%"
        )
    _calibration_report(runs, latency)
    print(f"end: {_uptime()}  (benchmark {time.perf_counter() - t_start:.0f} s)")


def _one_run(
    workload: Workload,
    tname: str,
    cname: str,
    latency: EngineLatency,
    selfcal: EngineCalibration,
    clock: str,
) -> Run:
    cfg = configs()[cname]
    t0 = time.perf_counter()
    out = run_validation(workload, cfg, selfcal.latency, clock=clock)
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
    case = CalibrationCase(workload, cfg, measured, f"{cname}/{tname}")
    draft = latency.draft if cfg.speculation.draft_model else None
    (raw,) = evaluate([case], latency.target, c.slo, draft_latency=draft)
    run = Run(
        cname, tname, case,
        {m: c.error(m) for m in TARGETS}, {m: raw.error(m) for m in TARGETS},
        {m: c.predicted.value(m) for m in TARGETS}, {m: c.measured.value(m) for m in TARGETS},
        took, notes,
    )  # fmt: skip
    cells = "  ".join(
        f"{m.value}={_fmt(m, run.predicted[m])}/{_fmt(m, run.measured[m])}"
        f"({run.errors[m] * 100:+.1f}% {'ok' if abs(run.errors[m]) <= t else 'MISS'}; "
        f"raw {run.raw_errors[m] * 100:+.1f}%)"
        for m, t in TARGETS.items()
    )
    print(f"{cname:8s} {tname:5s} {took:5.1f}s  {cells}  {notes}", flush=True)
    return run


def _calibration_report(runs: list[Run], latency: EngineLatency) -> None:
    """Trace calibration for later searches: fitted on the one-process code-trace runs
    (outliers flagged and left out), tested on every other run (held out)."""
    fit_on = [r.case for r in runs if r.trace == "code" and r.config != "pd-1p1d"]
    held = [r for r in runs if r.trace != "code" or r.config == "pd-1p1d"]
    if not fit_on or not held:
        return
    fit = fit_calibration(fit_on, latency.target, draft_latency=latency.draft)
    cal = fit.calibration
    flagged = f", outliers left out: {', '.join(fit.outliers)}" if fit.outliers else ""
    print(
        f"\ntrace calibration on {len(fit_on)} one-process code runs: "
        f"overhead {cal.overhead_s * 1e3:.2f} ms, prefill x{cal.prefill_scale:.3f}, "
        f"decode x{cal.decode_scale:.3f} (loss {fit.loss_before:.4f} -> {fit.loss_after:.4f}"
        f"{flagged}); held out: {', '.join(r.case.name for r in held)}"
    )
    tuned = CalibratedSource(latency.target, default=cal)
    for m in TARGETS:
        before = [abs(r.raw_errors[m]) for r in held]
        after = []
        for r in held:
            draft = latency.draft if r.case.config.speculation.draft_model else None
            (cmp_after,) = evaluate([r.case], tuned, _slo(r), draft_latency=draft)
            after.append(abs(cmp_after.error(m)))
        print(
            f"  held-out {m.value:14s} median |error| {np.median(before) * 100:6.1f}% -> "
            f"{np.median(after) * 100:6.1f}%  (self-calibrated: "
            f"{np.median([abs(r.errors[m]) for r in held]) * 100:.1f}%)"
        )


def _slo(run: Run) -> SLO:
    return default_slo(run.case.measured)


if __name__ == "__main__":
    main()
