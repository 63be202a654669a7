"""`servetune validate`: the simulator's prediction against a real replay on this machine.

A thin command over `api.services.validation` (the pipeline, shared with
`benchmarks/bench_validate.py`): it prints predicted against measured
mean/p50/p90/p99 TTFT and TPOT and goodput with their errors, and stores the
comparison and the engine self-calibration unless `--no-store`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer
from rich.table import Table

from api.cli.common import console, fail, session

if TYPE_CHECKING:
    from optimizer.validation import Comparison


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
    from api.services.validation import (
        calibrate_on_engine,
        fit_engine_latency,
        prepare_workload,
        profile_or_load_samples,
        run_validation,
        store_validation,
    )
    from optimizer.sim import SLO
    from optimizer.workload import WorkloadError
    from profiler.reference_engine import EngineError
    from storage.profiles import ProfileRunNotFound

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
    if profile_run is None:
        console.print(f"profiling {cfg.model} on this CPU (tp=1)…")
    try:
        with session() as s:
            samples, run_id = profile_or_load_samples(
                s, cfg.model, profile_run=profile_run, quick=quick_profile
            )
    except (ProfileRunNotFound, ValueError) as exc:
        fail(f"--profile-run {profile_run}: {exc}")
    if profile_run is None:
        console.print(
            f"stored profile run {run_id} ({len(samples)} samples); reuse: --profile-run {run_id}"
        )
    latency = fit_engine_latency(samples, cfg.model)
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
        with session() as s:
            run_id, cal_ids = store_validation(
                s, outcome, cfg, latency, workload_name=workload.name or trace, clock=clock,
                load_average=load, selfcal=selfcal,
            )  # fmt: skip
        console.print(f"stored validation run {run_id}")
        if cal_ids:
            ids = ", ".join(str(i) for i in cal_ids)
            console.print(f"stored the engine self-calibration as calibration {ids}")
