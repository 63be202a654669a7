"""The validation pipeline: the simulator's prediction against a real replay on this machine.

Profile the config's model shape here (or reuse a stored profile run), fit the
per-operator latency model, measure the reference engine's own step cost on
synthetic batches (not the trace) and fit a correction to it (per-step
overhead, prefill/decode scales, per-KV-token gathering cost; the engine does
work the per-op profile does not see: paged-KV gathering, batch building,
Python scheduling), simulate the workload with it, replay the same workload on
the reference engine (`profiler.reference_engine`; by default each engine
process on its own CPU-time clock, so other processes' load does not count),
and compare predicted with measured TTFT, TPOT and goodput. The trace itself is
never fitted to, so the comparison stays a held-out test.

`servetune validate` (api/cli/validate.py) and `benchmarks/bench_validate.py`
both call these functions; `store_validation` keeps a run and its
self-calibration in the database.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from optimizer.config import ServingConfig
    from optimizer.latency.base import LatencySource
    from optimizer.records import KernelSample
    from optimizer.sim import SLO
    from optimizer.validation import Comparison, StepFit
    from optimizer.workload import Workload
    from profiler.reference_engine import ReplayResult

DRAFT_SHAPE = "tiny-draft"
# The reference CPU engine's per-step overhead before `calibrate_on_engine` fits it on
# the steps it really runs (its own engine, not vLLM: optimizer.engines prices vLLM's).
REFERENCE_ENGINE_OVERHEAD_S = 0.0005
# The vLLM release whose scheduling the reference engine's matches (synchronous V1).
REFERENCE_SCHEDULING = "0.13"


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
    disturbed by other load), or by default `REFERENCE_ENGINE_OVERHEAD_S` and
    scale 1: the engine's own step calibration (`calibrate_on_engine`) then
    fits both on steps the engine really runs, not on the profiler's forwards."""
    from optimizer.latency import build_catalog, fit_latency_model
    from optimizer.latency.mixed_fit import fit_composition, mixed_load, mixed_pricing
    from optimizer.records import OpKind
    from optimizer.shapes import get_shape

    shape = get_shape(shape_name)
    model = fit_latency_model(samples, accelerator=accelerator, source="profiler")
    mixed = [s for s in samples if s.op is OpKind.MIXED_ITERATION and s.model == shape.name]
    overhead, scale = REFERENCE_ENGINE_OVERHEAD_S, 1.0
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
    from profiler.reference_engine import ReplayOptions
    from profiler.reference_engine.realtime import instance_spec
    from profiler.reference_engine.selfcal import (
        SyntheticPlan,
        measure_engine_steps,
        step_observations,
    )
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
    from profiler.reference_engine import Clock, ReplayOptions, ReplayRequests, replay

    if clock == "auto":
        clock = Clock.CPU

    draft = latency.draft if config.speculation.draft_model else None
    # The reference engine schedules synchronously (a request is admitted at the next step
    # boundary), as vLLM V1 did before async scheduling: simulate it so.
    sim_config = replace(config, engine_version=REFERENCE_SCHEDULING)
    sim = simulate(workload, sim_config, latency.target, seed=seed, draft_latency=draft)
    requests = ReplayRequests(workload.arrival_s, workload.input_tokens, workload.output_tokens)
    real = replay(requests, config, ReplayOptions(seed=seed, clock=Clock(clock)))
    measured = RequestOutcomes(
        real.arrival_s, real.input_tokens, real.output_tokens, real.ttft_s, real.e2e_s
    )
    slo = slo or default_slo(measured)
    comparison = compare(RequestOutcomes.of_simulation(sim), measured, slo)
    return ValidationOutcome(comparison, real, workload)


def profile_or_load_samples(
    session: Session, shape_name: str, *, profile_run: int | None, quick: bool
) -> tuple[list[KernelSample], int]:
    """The samples of stored profile run `profile_run`, or a fresh CPU profile of
    `shape_name` stored as a new run; returns (samples, run id). Raises
    ProfileRunNotFound, or ValueError when the run holds no sample of the shape."""
    from storage.profiles import create_profile_run, load_samples

    if profile_run is not None:
        samples = load_samples(session, profile_run)
        if not any(x.model == shape_name for x in samples):
            raise ValueError(f"profile run {profile_run} holds no samples of {shape_name!r}")
        return samples, profile_run
    from profiler.device import describe_device, parse_device

    samples = profile_samples(shape_name, quick=quick)
    info = create_profile_run(
        session, name=f"validate-{shape_name}", source="profiler", accelerator="cpu",
        device=describe_device(parse_device("cpu"), 1), samples=samples,
    )  # fmt: skip
    return samples, info.id


def store_validation(
    session: Session,
    outcome: ValidationOutcome,
    config: ServingConfig,
    latency: EngineLatency,
    *,
    workload_name: str,
    clock: str,
    load_average: float,
    selfcal: EngineCalibration | None,
) -> tuple[int, tuple[int, ...]]:
    """Store the comparison (and the engine self-calibration, one per model the engine
    ran); returns (validation run id, calibration ids)."""
    from storage.validation import save_calibration, save_validation_run

    real = outcome.replay
    run = save_validation_run(
        session, kind="replay", workload=workload_name, config=config.to_dict(),
        latency=latency.label, comparison=outcome.comparison.to_dict(),
        details={"load_average": load_average, "clock": clock,
                 "self_calibration": selfcal.describe() if selfcal else None,
                 "num_kv_transfers": real.num_kv_transfers,
                 "kv_transfer_bytes": real.kv_transfer_bytes,
                 "num_preemptions": int(real.num_preemptions.sum())},
    )  # fmt: skip
    if selfcal is None:
        return run.id, ()
    inst = config.roles()[0].instance
    fits = [(config.model, selfcal.target)]
    if selfcal.draft is not None and config.speculation.draft_model:
        fits.append((config.speculation.draft_model, selfcal.draft))
    ids = []
    for shape, fit in fits:
        c = fit.calibration
        rec = save_calibration(
            session, shape_name=shape, accelerator=inst.accelerator, tp=inst.tp,
            overhead_s=c.overhead_s, prefill_scale=c.prefill_scale,
            decode_scale=c.decode_scale, loss_before=fit.median_error_before,
            loss_after=fit.median_error_after,
            details={"source": "engine-steps", "kv_token_s": c.kv_token_s, "seq_s": c.seq_s,
                     "num_steps": fit.num_steps, "num_outliers": fit.num_outliers,
                     "loss": "median relative step error"},
        )  # fmt: skip
        ids.append(rec.id)
    return run.id, tuple(ids)
