"""`servetune simulate`: replay a trace under one config and print what it would deliver."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from api.cli.common import (
    LatencyModelOption,
    console,
    err_console,
    fail,
    session,
    trace_source,
)

if TYPE_CHECKING:
    from optimizer.config import ServingConfig
    from optimizer.sim import Percentiles, SimulationResult
    from optimizer.workload import Workload


def load_config(path: Path, option: str = "--config") -> ServingConfig:
    """A ServingConfig from a YAML or JSON file (the `to_dict` layout); errors name
    `option`."""
    import yaml

    from optimizer.config import ConfigError, ServingConfig

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        fail(f"{option} {path}: cannot read YAML/JSON: {exc}")
    try:
        return ServingConfig.from_dict(data)
    except (ConfigError, ValueError, TypeError) as exc:
        fail(f"{option} {path}: {exc}")


def load_workload(trace: str) -> Workload:
    """A stored trace by id, or a trace file parsed (not stored)."""
    from optimizer.traces import TraceFormatError, parse_trace
    from optimizer.workload import Workload
    from storage.traces import TraceNotFound, load_trace_columns

    source = trace_source(trace)
    if isinstance(source, Path):
        try:
            return Workload.from_columns(parse_trace(source).columns, name=source.stem)
        except TraceFormatError as exc:
            fail(str(exc))
    try:
        with session() as s:
            return Workload.from_columns(load_trace_columns(s, source), name=f"trace-{source}")
    except TraceNotFound as exc:
        fail(str(exc))


def _with_gpu(config: ServingConfig, gpu: str) -> ServingConfig:
    from optimizer.config import ConfigError

    def swap(inst):
        return None if inst is None else dataclasses.replace(inst, accelerator=gpu)

    try:
        return dataclasses.replace(
            config,
            replica=swap(config.replica),
            prefill=swap(config.prefill),
            decode=swap(config.decode),
        )
    except ConfigError as exc:
        fail(f"--gpu {gpu}: {exc}")


def summary_rows(result: SimulationResult) -> list[tuple[str, str]]:
    def ms(v: float) -> str:
        return "-" if math.isnan(v) else f"{v * 1e3:,.1f}"

    rows = []
    for label, p in (
        ("TTFT ms", result.ttft),
        ("TPOT ms", result.tpot),
        ("ITL ms", result.itl),
        ("E2E ms", result.e2e),
        ("queueing ms", result.queueing),
    ):
        rows.append((f"{label} mean / p50 / p90 / p99", f"{ms(p.mean)} / {ms(p.p50)} / "
                     f"{ms(p.p90)} / {ms(p.p99)}"))  # fmt: skip
    rows += [
        ("requests completed / rejected", f"{result.num_completed:,} / {result.num_rejected:,}"),
        ("request throughput", f"{result.request_throughput:.3f} req/s"),
        (
            "output tokens/s (per GPU)",
            f"{result.output_token_throughput:,.0f} ({result.output_tokens_per_gpu_s:,.0f})",
        ),
        ("GPUs", str(result.num_gpus)),
        ("preemptions", f"{int(result.num_preemptions.sum()):,}"),
    ]
    if result.slo is not None:
        rows.append(("SLO attainment", f"{result.slo_attainment:.1%}"))
        rows.append(("request goodput", f"{result.goodput:.3f} req/s"))
    return rows


def _pct(p: Percentiles) -> dict:
    return {k: (None if math.isnan(v) else v) for k, v in dataclasses.asdict(p).items()}


def result_json(result: SimulationResult, config: ServingConfig) -> dict:
    return {
        "config": config.to_dict(),
        "num_requests": result.num_requests,
        "num_completed": result.num_completed,
        "num_rejected": result.num_rejected,
        "num_gpus": result.num_gpus,
        "ttft_s": _pct(result.ttft),
        "tpot_s": _pct(result.tpot),
        "itl_s": _pct(result.itl),
        "e2e_s": _pct(result.e2e),
        "queueing_s": _pct(result.queueing),
        "request_throughput": result.request_throughput,
        "output_token_throughput": result.output_token_throughput,
        "output_tokens_per_gpu_s": result.output_tokens_per_gpu_s,
        "slo": None if result.slo is None else dataclasses.asdict(result.slo),
        "slo_attainment": result.slo_attainment,
        "goodput": result.goodput,
        "phases": dataclasses.asdict(result.phases),
        "latency_is_estimate": result.latency_is_estimate,
    }


def load_bench_workload(path: Path):
    """A `vllm bench serve` workload file (`optimizer.bench_serve`) as the client runs it
    (as `tune --workload` stores it when it is an open loop)."""
    from optimizer.bench_serve import BenchServeError, BenchServeSpec

    try:
        return BenchServeSpec.load(path).workload()
    except BenchServeError as exc:
        fail(f"--workload {exc}")


def simulate(
    config: Annotated[Path, typer.Option(help="ServingConfig as YAML or JSON")],
    trace: Annotated[str | None, typer.Option(help="stored trace id, or a trace file")] = None,
    workload: Annotated[
        Path | None,
        typer.Option(help="a vllm bench serve workload file (random_input_len, ...)"),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="model shape preset (overrides the config's)")
    ] = None,
    gpu: Annotated[
        str | None, typer.Option(help="accelerator for every role (overrides the config's)")
    ] = None,
    latency_model: LatencyModelOption = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="TTFT SLO, ms")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="TPOT SLO, ms")] = None,
    slo_e2e_ms: Annotated[
        float | None, typer.Option(help="end-to-end latency SLO, ms (with the other two)")
    ] = None,
    time_scale: Annotated[
        float, typer.Option(help="multiply inter-arrival times (0.5 = twice the rate)")
    ] = 1.0,
    seed: Annotated[int, typer.Option()] = 0,
    jobs: Annotated[
        int,
        typer.Option(
            help="processes for the replicas of a round-robin colocated fleet (the same "
            "per-request results; other fleets run in one process, and say why)"
        ),
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    jump: Annotated[
        bool,
        typer.Option(help="advance decode stretches at once (--no-jump: one event per step)"),
    ] = True,
) -> None:
    """Replay a trace under one config and print TTFT, TPOT, ITL, goodput."""
    from optimizer.config import ConfigError
    from optimizer.sim import SLO, SimulationError, rejection_note
    from optimizer.sim import simulate as run_simulation
    from optimizer.sim.parallel import serial_reason, simulate_parallel

    cfg = load_config(config)
    if model is not None:
        try:
            cfg = dataclasses.replace(cfg, model=model)
        except ConfigError as exc:
            fail(f"--model {model}: {exc}")
    if gpu is not None:
        cfg = _with_gpu(cfg, gpu)
    if (slo_ttft_ms is None) != (slo_tpot_ms is None):
        fail("give both --slo-ttft-ms and --slo-tpot-ms, or neither")
    if slo_e2e_ms is not None and slo_ttft_ms is None:
        fail("--slo-e2e-ms needs --slo-ttft-ms and --slo-tpot-ms too")
    for flag, value in (("--slo-ttft-ms", slo_ttft_ms), ("--slo-tpot-ms", slo_tpot_ms),
                        ("--slo-e2e-ms", slo_e2e_ms)):  # fmt: skip
        if value is not None and not (math.isfinite(value) and value > 0):
            fail(f"{flag}: expected a positive number of milliseconds, got {value:g}")
    slo = None
    if slo_ttft_ms is not None and slo_tpot_ms is not None:
        try:
            e2e = slo_e2e_ms / 1e3 if slo_e2e_ms is not None else None
            slo = SLO(ttft_s=slo_ttft_ms / 1e3, tpot_s=slo_tpot_ms / 1e3, e2e_s=e2e)
        except ValueError as exc:
            fail(str(exc))
    if not (math.isfinite(time_scale) and time_scale > 0):
        fail(f"--time-scale must be a positive number, got {time_scale}")
    if (trace is None) == (workload is None):
        fail("give exactly one of --trace (a trace) or --workload (a vllm bench serve file)")
    if workload is not None:
        if time_scale != 1.0:
            fail("--time-scale applies to a trace; change request_rate in the workload file")
        replay = load_bench_workload(workload)
    else:
        replay = load_workload(trace)
        if time_scale != 1.0:
            replay = replay.time_scaled(time_scale)
    if jobs < 1:
        fail(f"--jobs: expected a whole number of processes >= 1, got {jobs}")
    serial = serial_reason(replay, cfg)
    if jobs > 1 and serial is not None:
        err_console.print(f"[yellow]--jobs {jobs}: this fleet runs in one process ({serial})[/]")
    latency, label = resolve_latency(cfg.model, latency_model, config=cfg)
    try:
        if jobs > 1 and serial is None:
            result = simulate_parallel(
                replay, cfg, latency, jobs=jobs, seed=seed, slo=slo, jump=jump
            )
        else:
            result = run_simulation(replay, cfg, latency, seed=seed, slo=slo, jump=jump)
    except (SimulationError, LookupError, ValueError) as exc:
        fail(str(exc))
    rejected = rejection_note(cfg, replay) if result.num_rejected else None
    if as_json:
        out = result_json(result, cfg)
        out["rejected_because"] = rejected
        out["latency"] = label
        out["processes"] = jobs if jobs > 1 and serial is None else 1
        out["one_process_because"] = serial if jobs > 1 else None
        out["priced_as"] = cfg.engine_release.label
        typer.echo(json.dumps(out, indent=2))
        return
    table = Table("figure", "value", title=f"{replay.name} on {cfg.mode.value} "
                  f"({result.num_gpus} GPUs), latency: {label}; priced as "
                  f"{cfg.engine_release.label}")  # fmt: skip
    for name, value in summary_rows(result):
        table.add_row(name, value)
    console.print(table)
    if rejected is not None:
        console.print(f"[yellow]{rejected}[/]")
    if result.latency_is_estimate:
        console.print("[yellow]figures priced by a roofline estimate, not measured kernels[/]")


def resolve_latency(
    model: str,
    latency_model_id: int | None,
    *,
    calibrated: bool = True,
    config: ServingConfig | None = None,
):
    """The latency source for `model`: stored fitted models, else the roofline estimate
    (with their stored calibrations when `calibrated`), and its label; with `config`, the
    label ends with whose kernel tables price that config's engine on each GPU."""
    from api.services.latency import resolve_latency as resolve
    from api.settings import get_settings
    from optimizer.shapes import ShapeError

    try:
        with session() as s:
            resolved = resolve(
                s,
                model,
                latency_model_ids=(latency_model_id,) if latency_model_id else (),
                calibrated=calibrated,
                num_threads=get_settings().native_threads,
            )
    except (LookupError, ShapeError) as exc:
        fail(str(exc))
    if config is None:
        return resolved.source, resolved.label
    parts = (config.replica, config.prefill, config.decode)
    gpus = [i.accelerator for i in parts if i is not None]
    tables = resolved.tables_for(gpus, config.engine_release)
    return resolved.source, f"{resolved.label}; this config: {tables}" if tables else resolved.label
