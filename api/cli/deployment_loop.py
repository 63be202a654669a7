"""`servetune deployments calibrate`: the deployment loop's commands (registered on
`servetune deployments`, see api/cli/deployments.py).

    servetune deployments calibrate ID [--fit OBS] [--check OBS] [--latency-model ID]
"""

from __future__ import annotations

import math
from typing import Annotated

import typer
from rich.table import Table

from api.cli.common import LatencyModelOption, console, fail, session
from api.cli.simulate import resolve_latency


def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value * 100:+.1f}%"


def calibrate(
    deployment_id: Annotated[int, typer.Argument(help="deployment id")],
    fit: Annotated[
        int | None,
        typer.Option(help="observation to fit on (default: the second newest)"),
    ] = None,
    check: Annotated[
        int | None,
        typer.Option(help="a later observation to check on (default: the newest)"),
    ] = None,
    latency_model: LatencyModelOption = None,
    seed: Annotated[int, typer.Option(help="seed of the rebuilt traffic")] = 0,
) -> None:
    """Fit the deployment's own correction (per-step overhead, step scale) on one observed
    window and check it on a later one; later observations and re-tunes use it."""
    from api.services.calibrate import CalibrateError, calibrate_deployment
    from optimizer.telemetry import TelemetryError
    from optimizer.telemetry.calibrate import FIGURES, relative_errors
    from storage.deployments import DeploymentNotFound, ObservationNotFound, get_deployment

    try:
        with session() as s:
            model = get_deployment(s, deployment_id).config.model
    except DeploymentNotFound as exc:
        fail(f"{exc} (see `servetune deployments list`)")
    latency, label = resolve_latency(model, latency_model)  # the base observe prices with
    try:
        cal = calibrate_deployment(session, deployment_id, latency, fit_on=fit, check_on=check,
                                   seed=seed)  # fmt: skip
    except (CalibrateError, ObservationNotFound, TelemetryError, ValueError) as exc:
        fail(str(exc))
    doc = cal.fit
    console.print(f"stored {cal.describe()}; latency: {label}")
    table = Table(title="predicted / observed - 1, without and with the calibration")
    table.add_column("figure")
    table.add_column(f"fitted on {cal.fitted_on}: before")
    table.add_column("after")
    if cal.checked_on is not None:
        table.add_column(f"held out {cal.checked_on}: before")
        table.add_column("after")
    fit_before = relative_errors(_floats(doc["before"]), _floats(doc["observed"]))
    fit_after = relative_errors(_floats(doc["after"]), _floats(doc["observed"]))
    held = doc.get("check")
    for k in FIGURES:
        row = [k.replace("_", " "), _pct(fit_before[k]), _pct(fit_after[k])]
        if held is not None:
            observed = _floats(held["observed"])
            row += [_pct(relative_errors(_floats(held["before"]), observed)[k]),
                    _pct(relative_errors(_floats(held["after"]), observed)[k])]  # fmt: skip
        table.add_row(*row)
    console.print(table)
    if cal.checked_on is None:
        console.print("[yellow]not checked: the deployment has one observation; observe a "
                      "later window and calibrate again to check it[/]")  # fmt: skip


def _floats(d: dict) -> dict[str, float]:
    return {k: (math.nan if v is None else float(v)) for k, v in d.items()}
