"""`servetune plan`: size a fleet over time for a trace, window by window."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from api.cli.common import console, fail, output_dir, trace_source

if TYPE_CHECKING:
    from optimizer.plan import FleetPlan
    from optimizer.search.tables import TextTable

_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, option: str = "--window") -> float:
    """ "15m", "900s", "1h", "900" (seconds) as seconds; a clear error otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhd]?)\s*", text)
    value = float(m.group(1)) * _UNITS_S[m.group(2) or "s"] if m else math.nan
    if not (math.isfinite(value) and value > 0):
        fail(f"{option} {text!r}: expected a duration such as 15m, 900s, 1h or 900 (seconds)")
    return value


def _rich(table: TextTable) -> Table:
    out = Table(title=table.title, caption=table.note or None, caption_justify="left")
    for i, col in enumerate(table.head):
        out.add_column(col, justify="left" if i == 0 or col == "how" else "right", overflow="fold")
    for row in table.rows:
        out.add_row(*row)
    return out


def print_plan(plan: FleetPlan, plan_id: int) -> None:
    from optimizer.plan.tables import (
        capacity_table,
        fleets_table,
        headline,
        lower_bound_lines,
        policy_lines,
        windows_table,
    )

    for line in headline(plan):
        console.print(line, highlight=False)
    console.print(_rich(capacity_table(plan)))
    for line in lower_bound_lines(plan):
        console.print(line, highlight=False)
    per_window = windows_table(plan)
    if per_window is not None:
        console.print(_rich(per_window))
    else:
        console.print(
            f"({len(plan.windows)} windows: each one's figures are in plan.json and plan.html)"
        )
    console.print(_rich(fleets_table(plan)))
    for line in policy_lines(plan):
        console.print(line, highlight=False)
    console.print(f"plan {plan_id} stored", highlight=False)


def write_outputs(plan: FleetPlan, plan_id: int, out: Path) -> list[Path]:
    from optimizer.plan import keda_yaml
    from optimizer.plan.report import write_html, write_png

    paths = [out / "plan.json", out / "keda.yaml"]
    paths[0].write_text(json.dumps({"id": plan_id, **plan.to_dict()}, indent=2), encoding="utf-8")
    paths[1].write_text(keda_yaml(plan.policy, plan.unit.config), encoding="utf-8")
    paths.append(write_png(plan, out / "plan.png"))
    paths.append(write_html(plan, out / "plan.html"))
    return paths


def _unit(path: Path):
    from api.cli.simulate import load_config

    return load_config(path, option="--unit")


def plan(
    trace: Annotated[
        str, typer.Option(help="stored trace id, or a trace file (stored with the plan)")
    ],
    model: Annotated[str, typer.Option(help="model shape preset, e.g. llama-3.1-8b")],
    gpu: Annotated[str, typer.Option(help="GPU type, e.g. h100")],
    slo_ttft_ms: Annotated[float, typer.Option(help="TTFT SLO, ms")],
    slo_tpot_ms: Annotated[float, typer.Option(help="TPOT SLO, ms")],
    unit: Annotated[
        Path | None,
        typer.Option(
            help="the unit to size (a ServingConfig YAML: one replica or one P:D group); "
            "default: the newest stored recommendation for this trace, model, GPU and SLOs, "
            "else the best of a short screening of tune's default space"
        ),
    ] = None,
    window: Annotated[str, typer.Option(help="window length: 15m, 900s, 1h")] = "15m",
    attainment: Annotated[float, typer.Option(help="share of requests meeting both SLOs")] = 0.9,
    cold_start_s: Annotated[
        float | None,
        typer.Option(
            help="seconds from a unit's start until it serves (default: weights at 2 GB/s "
            "+ 60 s engine start-up)"
        ),
    ] = None,
    gpus: Annotated[int, typer.Option(help="GPUs any fleet may use")] = 64,
    price_per_gpu_hour: Annotated[
        float | None, typer.Option(help="USD per GPU-hour (adds $ to every figure)")
    ] = None,
    screen_trials: Annotated[
        int, typer.Option(help="seeded units screened besides vLLM's defaults (no --unit)")
    ] = 8,
    seed: Annotated[int, typer.Option()] = 0,
    jobs: Annotated[
        int,
        typer.Option(
            min=1,
            help="processes: the fleets' replays (and the capacity searches) run side by "
            "side, a lone static fleet's replicas split when its router allows (as "
            "simulate --jobs)",
        ),
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    out: Annotated[
        Path | None, typer.Option(help="folder for plan.json, plan.png, plan.html, keda.yaml")
    ] = None,
) -> None:
    """Plan a fleet over time: the unit's capacity, the lower bound per window, the
    static, scheduled and reactive fleets, and the autoscaler's KEDA ScaledObject."""
    from api.services.planning import load_plan_trace, run_plan
    from api.settings import get_settings
    from optimizer.plan import PlanError, PlanRequest
    from optimizer.traces import TraceFormatError
    from storage.traces import TraceNotFound

    window_s = parse_duration(window)
    config = _unit(unit) if unit is not None else None
    if out is not None:
        output_dir(out)  # before the plan runs, not after
    try:
        request = PlanRequest(
            model=model,
            gpu=gpu,
            slo_ttft_ms=slo_ttft_ms,
            slo_tpot_ms=slo_tpot_ms,
            gpu_budget=gpus,
            window_s=window_s,
            attainment=attainment,
            cold_start_s=cold_start_s,
            unit=config,
            price_per_gpu_hour=price_per_gpu_hour,
            seed=seed,
            screen_trials=screen_trials,
        )
    except PlanError as exc:
        fail(str(exc))
    settings = get_settings()
    try:
        source = load_plan_trace(settings.database_url, trace_source(trace))
    except (TraceNotFound, TraceFormatError) as exc:
        fail(f"--trace {trace}: {exc}")

    def step(message: str) -> None:
        if not as_json:
            console.print(f"[dim]{message}[/]", highlight=False)

    try:
        made, plan_id = run_plan(
            request,
            source,
            database_url=settings.database_url,
            num_threads=settings.native_threads,
            jobs=jobs,
            on_step=step,
        )
    except PlanError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps({"id": plan_id, **made.to_dict()}, indent=2))
    else:
        print_plan(made, plan_id)
    if out is not None:
        for p in write_outputs(made, plan_id, out):
            if not as_json:
                console.print(f"wrote {p}", highlight=False)
