"""`servetune validate`: the simulator's prediction against a real replay on this machine.

Pipeline: profile the config's model shape here (or reuse a stored profile
run), fit the per-operator latency model, measure the reference engine's own
step cost on synthetic batches (not the trace) and fit a correction to it
(per-step overhead, prefill/decode scales, per-KV-token gathering cost; the
engine does work the per-op profile does not see: paged-KV gathering, batch
building, Python scheduling), simulate the workload with it, replay the same
workload on the reference engine (`profiler.engine`; by default each engine
process on its own CPU-time clock, so other processes' load does not count),
and print predicted against measured mean/p50/p90/p99 TTFT and TPOT and
goodput with their errors. The comparison and the self-calibration are
stored unless `--no-store`. The trace itself is never fitted to, so the
comparison stays a held-out test.

The helpers (`fit_engine_latency`, `prepare_workload`, `run_validation`) are
shared with `benchmarks/bench_validate.py`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer
from rich.table import Table

from api.cli.common import console, fail, session

if TYPE_CHECKING:
    from optimizer.config import ServingConfig
    from optimizer.latency.base import LatencySource
    from optimizer.records import KernelSample
    from optimizer.sim import SLO
    from optimizer.validation import Comparison, StepFit
    from optimizer.workload import Workload
    from profiler.engine import ReplayResult

DRAFT_SHAPE = "tiny-draft"


@dataclass(frozen=True, slots=True)
class EngineLatency:
    """Latency sources fitted from a profile of this machine."""

    target: LatencySource
    draft: LatencySource | None
    overhead_s: float
    label: str


@dataclass(frozen=True, slots=True)
class EngineCalibration:
    """A correction fitted on the engine's own steps (synthetic batches, not the trace)."""

    latency: EngineLatency  # calibrated sources
    target: StepFit
    draft: StepFit | None
    seconds: float  # measuring and fitting

    def describe(self) -> str:
        def one(name: str, f: StepFit) -> str:
            c = f.calibration
            return (
                f"{name}: overhead {c.overhead_s * 1e3:.2f} ms, prefill x{c.prefill_scale:.2f}, "
                f"decode x{c.decode_scale:.2f}, {c.kv_token_s * 1e9:.0f} ns/KV token, "
                f"{c.seq_s * 1e6:.0f} us/sequence "
                f"on {f.num_steps} steps ({f.num_outliers} outliers; "
                f"median step error {f.median_error_before * 100:.0f}% -> "
                f"{f.median_error_after * 100:.0f}%)"
            )

        parts = [one("target", self.target)]
        if self.draft is not None:
            parts.append(one("draft", self.draft))
        return "engine self-calibration (synthetic batches, not the trace): " + "; ".join(parts)


@dataclass(frozen=True, slots=True)
class ValidationOutcome:
    comparison: Comparison
    replay: ReplayResult
    workload: Workload


def profile_samples(shape_name: str, *, quick: bool = False) -> list[KernelSample]:
    """Profile `shape_name` on this CPU at tp=1 (the default CPU grid, or a smoke grid)."""
    from optimizer.shapes import get_shape
    from profiler.sweep import default_cpu_grid, quick_grid, run_sweep

    grid = quick_grid() if quick else default_cpu_grid()
    return run_sweep(get_shape(shape_name), replace(grid, tp_degrees=(1,)), "cpu")


def fit_engine_latency(
    samples: list[KernelSample],
    shape_name: str,
    accelerator: str = "cpu",
    *,
    overhead_from_mixed: bool = False,
) -> EngineLatency:
    """Fit per-op models and compile tables; the per-step overhead and operator
    scale are fitted on the profile's whole mixed iterations (p10 timings, least
    disturbed by other load), or by default the latency model's default overhead
    and scale 1: the engine's own step calibration (`calibrate_on_engine`) then
    fits both on steps the engine really runs, not on the profiler's forwards."""
    from optimizer.latency import build_catalog, fit_latency_model
    from optimizer.latency.compose import (
        DEFAULT_OVERHEAD_S,
        fit_composition,
        mixed_load,
        mixed_pricing,
    )
    from optimizer.records import OpKind
    from optimizer.shapes import get_shape

    shape = get_shape(shape_name)
    model = fit_latency_model(samples, accelerator=accelerator, source="profiler")
    mixed = [s for s in samples if s.op is OpKind.MIXED_ITERATION and s.model == shape.name]
    overhead, scale = DEFAULT_OVERHEAD_S, 1.0
    if mixed and overhead_from_mixed:
        fit = fit_composition(
            mixed_pricing(model, shape),
            [mixed_load(s) for s in mixed],
            [s.p10_ms / 1e3 for s in mixed],
        )
        overhead, scale = fit.overhead_s, fit.scale
    model = replace(model, overhead_s=overhead, op_scale=scale)
    target = build_catalog(shape, [model], (1,), allow_roofline=False)
    draft = build_catalog(get_shape(DRAFT_SHAPE), [model], (1,), allow_roofline=False)
    label = (
        f"learned from a {len(samples)}-sample {accelerator} profile, "
        f"overhead {overhead * 1e3:.2f} ms, operators x{scale:.2f}"
    )
    return EngineLatency(target, draft, overhead, label)


def calibrate_on_engine(
    latency: EngineLatency, config: ServingConfig, *, clock: str = "cpu", passes: int = 3
) -> EngineCalibration:
    """Measure the reference engine's own steps on synthetic batches (same shape,
    threads, clock and limits as the replay of `config`) and fit the correction
    `optimizer.validation.fit_step_calibration` to them."""
    import time

    from optimizer.config import Role
    from optimizer.validation import CalibratedSource, fit_step_calibration
    from profiler.engine import ReplayOptions
    from profiler.engine.realtime import instance_spec
    from profiler.engine.selfcal import SyntheticPlan, measure_engine_steps, step_observations
    from profiler.timing import fixed_threads

    t0 = time.perf_counter()
    options = ReplayOptions()
    plans = list(config.roles())
    role = next((p.role for p in plans if p.role is not Role.PREFILL), plans[0].role)
    spec = instance_spec(config, role, options)
    with fixed_threads(options.num_threads):
        records = measure_engine_steps(
            spec, SyntheticPlan(passes=passes), cpu_clock=clock != "wall"
        )
    inst = plans[0].instance
    base = latency.target.for_instance(inst.accelerator, inst.tp)
    target = fit_step_calibration(base, step_observations(records))
    draft_fit = None
    draft_source = latency.draft
    draft_obs = step_observations(records, draft=True)
    if latency.draft is not None and len(draft_obs) >= 3:
        draft_fit = fit_step_calibration(
            latency.draft.for_instance(inst.accelerator, inst.tp), draft_obs
        )
        draft_source = CalibratedSource(latency.draft, default=draft_fit.calibration)
    tuned = EngineLatency(
        CalibratedSource(latency.target, default=target.calibration),
        draft_source,
        target.calibration.overhead_s,
        latency.label + " + engine self-calibration",
    )
    return EngineCalibration(tuned, target, draft_fit, time.perf_counter() - t0)


def prepare_workload(
    workload: Workload,
    *,
    time_scale: float,
    max_requests: int,
    max_input_tokens: int | None,
    max_output_tokens: int | None,
) -> Workload:
    """The first `max_requests`, arrivals x `time_scale`, token counts clipped to the caps."""
    from optimizer.workload import Workload as W

    w = workload.head(max_requests).time_scaled(time_scale)
    inp, out = w.input_tokens, w.output_tokens
    if max_input_tokens is not None:
        inp = np.minimum(inp, max_input_tokens)
    if max_output_tokens is not None:
        out = np.minimum(out, max_output_tokens)
    return W(w.arrival_s - w.arrival_s[0], inp, out, name=w.name)


def run_validation(
    workload: Workload,
    config: ServingConfig,
    latency: EngineLatency,
    *,
    slo: SLO | None = None,
    seed: int = 0,
    clock: str = "auto",
) -> ValidationOutcome:
    """Simulate, replay for real, compare. `clock` "auto" measures every replay on
    its engine threads' CPU time (immune to other processes' load; a disaggregated
    replay keeps its two processes' clocks in step), "wall" on the wall clock."""
    from optimizer.sim import simulate
    from optimizer.validation import RequestOutcomes, compare, default_slo
    from profiler.engine import Clock, ReplayOptions, ReplayRequests, replay

    if clock == "auto":
        clock = Clock.CPU

    draft = latency.draft if config.speculation.draft_model else None
    sim = simulate(workload, config, latency.target, seed=seed, draft_latency=draft)
    requests = ReplayRequests(workload.arrival_s, workload.input_tokens, workload.output_tokens)
    real = replay(requests, config, ReplayOptions(seed=seed, clock=Clock(clock)))
    measured = RequestOutcomes(
        real.arrival_s, real.input_tokens, real.output_tokens, real.ttft_s, real.e2e_s
    )
    slo = slo or default_slo(measured)
    comparison = compare(RequestOutcomes.of_simulation(sim), measured, slo)
    return ValidationOutcome(comparison, real, workload)


def comparison_table(comparison: Comparison, title: str) -> Table:
    from optimizer.validation import Metric

    table = Table(title=title)
    for col in ("metric", "predicted", "measured", "error"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for e in comparison.errors:
        scale, unit = (1.0, "req/s") if e.metric is Metric.GOODPUT else (1e3, "ms")
        if e.metric is Metric.ATTAINMENT:
            scale, unit = 100.0, "%"
        err = e.relative_error
        table.add_row(
            e.metric.value,
            f"{e.predicted * scale:.2f} {unit}",
            f"{e.measured * scale:.2f} {unit}",
            "n/a" if not np.isfinite(err) else f"{err * 100:+.1f}%",
        )
    slo = comparison.slo
    table.caption = f"SLO: TTFT <= {slo.ttft_s * 1e3:.0f} ms, TPOT <= {slo.tpot_s * 1e3:.1f} ms"
    return table


def _load_samples(profile_run: int | None, shape_name: str, quick: bool) -> list[KernelSample]:
    from storage.profiles import ProfileRunNotFound, load_samples

    if profile_run is not None:
        try:
            with session() as s:
                samples = load_samples(s, profile_run)
        except ProfileRunNotFound as exc:
            fail(str(exc))
        if not any(x.model == shape_name for x in samples):
            fail(f"--profile-run {profile_run} holds no samples of {shape_name!r}")
        return samples
    console.print(f"profiling {shape_name} on this CPU (tp=1)…")
    samples = profile_samples(shape_name, quick=quick)
    from profiler.device import describe_device
    from storage.profiles import create_profile_run

    with session() as s:
        info = create_profile_run(
            s, name=f"validate-{shape_name}", source="profiler", accelerator="cpu",
            device=describe_device(__import__("torch").device("cpu"), 1), samples=samples,
        )  # fmt: skip
    console.print(
        f"stored profile run {info.id} ({len(samples)} samples); reuse: --profile-run {info.id}"
    )
    return samples


def validate(
    trace: Annotated[str, typer.Option(help="trace file or stored trace id")],
    config: Annotated[Path, typer.Option(help="serving config (YAML/JSON, ServingConfig layout)")],
    time_scale: Annotated[float, typer.Option(help="multiply arrival times by this")] = 1.0,
    max_requests: Annotated[int, typer.Option(help="replay the first N requests")] = 30,
    max_input_tokens: Annotated[int | None, typer.Option(help="clip prompts to this")] = 1024,
    max_output_tokens: Annotated[int | None, typer.Option(help="clip outputs to this")] = 128,
    profile_run: Annotated[int | None, typer.Option(help="reuse a stored CPU profile run")] = None,
    quick_profile: Annotated[bool, typer.Option(help="smoke-test profile grid")] = False,
    slo_ttft_ms: Annotated[
        float | None, typer.Option(help="SLO (default 2x measured median)")
    ] = None,
    slo_tpot_ms: Annotated[
        float | None, typer.Option(help="SLO (default 2x measured median)")
    ] = None,
    seed: Annotated[int, typer.Option()] = 0,
    clock: Annotated[
        str, typer.Option(help="auto (= cpu: each engine process's CPU time), wall, or cpu")
    ] = "auto",
    self_calibrate: Annotated[
        bool,
        typer.Option(
            help="first measure the engine's own steps on synthetic batches (not the trace) "
            "and fit a correction to them, stored as a calibration"
        ),
    ] = True,
    store: Annotated[bool, typer.Option(help="store the comparison")] = True,
) -> None:
    """Predict with the simulator, replay for real on the reference engine, compare."""
    from api.cli.simulate import load_config, load_workload
    from optimizer.sim import SLO
    from optimizer.workload import WorkloadError
    from profiler.engine import EngineError

    cfg = load_config(config)
    if clock not in ("auto", "wall", "cpu"):
        fail(f"--clock: expected auto, wall or cpu, got {clock!r}")
    if max_requests <= 0 or not time_scale > 0:
        fail("--max-requests and --time-scale must be positive")
    if (slo_ttft_ms is None) != (slo_tpot_ms is None):
        fail("give both --slo-ttft-ms and --slo-tpot-ms, or neither")
    slo = SLO(slo_ttft_ms / 1e3, slo_tpot_ms / 1e3) if slo_ttft_ms and slo_tpot_ms else None
    try:
        workload = prepare_workload(
            load_workload(trace), time_scale=time_scale, max_requests=max_requests,
            max_input_tokens=max_input_tokens, max_output_tokens=max_output_tokens,
        )  # fmt: skip
    except WorkloadError as exc:
        fail(str(exc))
    latency = fit_engine_latency(_load_samples(profile_run, cfg.model, quick_profile), cfg.model)
    console.print(f"latency model: {latency.label}")
    selfcal = None
    if self_calibrate:
        selfcal = calibrate_on_engine(latency, cfg, clock="wall" if clock == "wall" else "cpu")
        console.print(selfcal.describe())
        latency = selfcal.latency
    try:
        outcome = run_validation(workload, cfg, latency, slo=slo, seed=seed, clock=clock)
    except EngineError as exc:
        fail(f"reference engine: {exc}")
    real = outcome.replay
    console.print(comparison_table(outcome.comparison, f"{workload.name}: predicted vs measured"))
    load = os.getloadavg()[0]
    console.print(
        f"{len(workload)} requests, {real.num_preemptions.sum()} preemptions, "
        f"{real.num_kv_transfers} KV transfers ({real.kv_transfer_bytes / 1e6:.1f} MB, "
        f"{real.kv_transfer_s * 1e3:.1f} ms total); machine load average {load:.2f}"
    )
    if store:
        from storage.validation import save_validation_run

        with session() as s:
            run = save_validation_run(
                s, kind="replay", workload=workload.name or trace, config=cfg.to_dict(),
                latency=latency.label, comparison=outcome.comparison.to_dict(),
                details={"load_average": load, "clock": clock,
                         "self_calibration": selfcal.describe() if selfcal else None,
                         "num_kv_transfers": real.num_kv_transfers,
                         "kv_transfer_bytes": real.kv_transfer_bytes,
                         "num_preemptions": int(real.num_preemptions.sum())},
            )  # fmt: skip
        console.print(f"stored validation run {run.id}")
        if selfcal is not None:
            ids = _store_self_calibration(selfcal, cfg)
            console.print(f"stored the engine self-calibration as calibration {ids}")


def _store_self_calibration(selfcal: EngineCalibration, config: ServingConfig) -> str:
    """One calibration per model the engine ran (target, draft), marked as engine-measured."""
    from storage.validation import save_calibration

    inst = config.roles()[0].instance
    fits = [(config.model, selfcal.target)]
    if selfcal.draft is not None and config.speculation.draft_model:
        fits.append((config.speculation.draft_model, selfcal.draft))
    ids = []
    with session() as s:
        for shape, fit in fits:
            c = fit.calibration
            rec = save_calibration(
                s, shape_name=shape, accelerator=inst.accelerator, tp=inst.tp,
                overhead_s=c.overhead_s, prefill_scale=c.prefill_scale,
                decode_scale=c.decode_scale, loss_before=fit.median_error_before,
                loss_after=fit.median_error_after,
                details={"source": "engine-steps", "kv_token_s": c.kv_token_s, "seq_s": c.seq_s,
                         "num_steps": fit.num_steps, "num_outliers": fit.num_outliers,
                         "loss": "median relative step error"},
            )  # fmt: skip
            ids.append(str(rec.id))
    return ", ".join(ids)
