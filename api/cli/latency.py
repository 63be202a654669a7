"""`servetune latency`: fit latency models on stored profile runs, list and inspect them.

servetune latency fit --profile RUN_ID [--name NAME] [--model SHAPE]
servetune latency list
servetune latency show ID
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from api.cli.common import console, fail, session

if TYPE_CHECKING:
    from storage.latency_models import LatencyModelInfo

app = typer.Typer(help="Latency models: fit on a profile run, list, show.", no_args_is_help=True)


def metrics_table(info: LatencyModelInfo) -> Table:
    """Hold-out errors per operator: random and extrapolation splits side by side."""
    from optimizer.records import HoldoutSplit

    by_op: dict[str, dict[HoldoutSplit, object]] = {}
    for m in info.metrics:
        by_op.setdefault(m.op, {})[HoldoutSplit(m.split)] = m
    table = Table(
        title=f"latency model {info.id}: hold-out APE, random 20% | largest 10% of tokens"
    )
    table.add_column("op", no_wrap=True)
    for header in ("rand n", "median", "p90", "extrap n", "median", "p90"):
        table.add_column(header, justify="right", no_wrap=True)
    for op in sorted(by_op):
        cells = [op]
        for split in (HoldoutSplit.RANDOM, HoldoutSplit.EXTRAPOLATION):
            m = by_op[op].get(split)
            if m is None:
                cells += ["-", "-", "-"]
            else:
                cells += [str(m.num_rows), f"{m.median_ape:.2f}%", f"{m.p90_ape:.2f}%"]
        table.add_row(*cells)
    return table


@app.command("fit")
def fit(
    profile: Annotated[int, typer.Option(help="stored profile run id to fit on")],
    name: Annotated[
        str | None, typer.Option(help="model name (default: the run's; refits add versions)")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="shape of the run's mixed iterations (default: the preset they name)"),
    ] = None,
    max_iter: Annotated[
        int | None,
        typer.Option(min=1, help="boosting iterations per operator (default 400; fewer: faster)"),
    ] = None,
) -> None:
    """Fit per-operator models and the per-iteration overhead, evaluate, store."""
    fit_profile_run(profile, name=name, model=model, max_iter=max_iter)


def fit_profile_run(
    profile: int, *, name: str | None = None, model: str | None = None, max_iter: int | None = None
) -> LatencyModelInfo:
    """`latency fit`'s work (also run by `profile import --aiconfigurator`): fit, store,
    print the stored model and its hold-out errors; exits through `fail` on an error."""
    from api.cli.common import engine
    from api.services.latency import fit_and_store
    from api.settings import get_settings
    from optimizer.latency.model import FitOptions, LatencyModelError
    from optimizer.shapes import ShapeError
    from storage.profiles import ProfileRunNotFound

    threads = get_settings().native_threads
    options = FitOptions(num_threads=threads)
    if max_iter is not None:
        options = FitOptions(max_iter=max_iter, num_threads=threads)
    try:
        with console.status(f"fitting profile run {profile}") as status:
            info = fit_and_store(
                engine(),
                profile,
                name=name,
                shape=model,
                options=options,
                progress=lambda stage: status.update(f"profile run {profile}: {stage}"),
            )
    except (ProfileRunNotFound, ShapeError, LatencyModelError, ValueError) as exc:
        fail(f"nothing stored: {exc}")
    console.print(
        f"stored latency model [bold]{info.id}[/] ({info.name} v{info.version}, "
        f"{info.accelerator}, {len(info.features)} operators)"
    )
    console.print(metrics_table(info))
    return info


@app.command("list")
def list_() -> None:
    """List stored latency models."""
    from storage.latency_models import list_latency_models

    with session() as s:
        infos = list_latency_models(s)
    if not infos:
        console.print("no latency models stored yet: `servetune latency fit --profile RUN_ID`")
        return
    table = Table("id", "name", "version", "accelerator", "shape", "profile run", "tp", "created")
    for i in infos:
        table.add_row(
            str(i.id),
            i.name,
            str(i.version),
            i.accelerator,
            i.shape_name or "-",
            "-" if i.profile_run_id is None else str(i.profile_run_id),
            ",".join(str(t) for t in i.tp_degrees),
            f"{i.created_at:%Y-%m-%d %H:%M}",
        )
    console.print(table)


@app.command("show")
def show(model_id: Annotated[int, typer.Argument(help="latency model id")]) -> None:
    """Show a stored model's provenance, overhead and hold-out metrics."""
    from optimizer.engines import DEFAULT_RELEASE
    from optimizer.latency.catalog import step_pricing
    from optimizer.latency.persist import PayloadError, load_model
    from storage.latency_models import (
        LatencyModelNotFound,
        get_latency_model,
        load_latency_payload,
    )

    try:
        with session() as s:
            info = get_latency_model(s, model_id)
            payload, version = load_latency_payload(s, model_id)
    except LatencyModelNotFound as exc:
        fail(str(exc))
    try:
        fitted = load_model(payload, version)
    except PayloadError as exc:
        fail(f"latency model {model_id}: {exc}")
    current = DEFAULT_RELEASE.generation
    how = step_pricing(fitted, DEFAULT_RELEASE, accelerator=_accelerator(fitted.accelerator))
    overhead = (
        "not fitted (no whole-step measurements): the deployed engine's, e.g. "
        f"{DEFAULT_RELEASE.label}: kernels x {how.kernel_scale:g}, "
        f"{how.overhead.describe()} + CPU {current.cpu.describe()}"
        + (" (overlapped by async scheduling)" if current.async_scheduling else "")
        + f"; calibrated on {current.calibrated_on}"
        if fitted.overhead_s is None
        else f"{fitted.overhead_s * 1e3:.3f} ms (fitted on {fitted.num_mixed} mixed iterations)"
    )
    about = Table(title=f"latency model {info.id}: {info.name} v{info.version}", show_header=False)
    about.add_column("figure")
    about.add_column("value")
    for label, value in (
        ("accelerator", info.accelerator),
        ("source", fitted.source or "-"),
        ("shape", info.shape_name or "-"),
        ("profile run", "-" if info.profile_run_id is None else str(info.profile_run_id)),
        ("tp degrees", ",".join(str(t) for t in info.tp_degrees)),
        ("operators", ", ".join(fitted.op_names())),  # FP8 and 4-bit variants too
        ("per-iteration overhead", overhead),
        (
            "operators in a forward",
            f"x{fitted.op_scale:.3f} their time alone"
            if fitted.num_mixed
            else "as measured alone (not fitted: no mixed iterations)",
        ),
        ("payload", f"{info.payload_bytes:,} bytes, schema_version {info.schema_version}"),
        ("created (UTC)", f"{info.created_at:%Y-%m-%d %H:%M}"),
    ):
        about.add_row(label, value)
    console.print(about)
    console.print(metrics_table(info))


def _accelerator(name: str):
    """A model's accelerator preset (None where servetune has no spec of it: its kernels
    are then priced unscaled)."""
    from optimizer.hardware import HardwareError, get_accelerator

    try:
        return get_accelerator(name)
    except HardwareError:
        return None
