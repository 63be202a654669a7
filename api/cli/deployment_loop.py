"""`servetune deployments calibrate` and `schedule`: the deployment loop's commands
(registered on `servetune deployments`, see api/cli/deployments.py).

    servetune deployments calibrate ID [--fit OBS] [--check OBS] [--latency-model ID]
    servetune deployments schedule ID --every 10m --gpus 8 --slo-ttft-ms 500 --slo-tpot-ms 50
        [--window 10m] [--drift-threshold 0.3] [--error-threshold 0.5] [--trials 100]
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


def schedule(
    deployment_id: Annotated[int, typer.Argument(help="deployment id")],
    every: Annotated[str, typer.Option(help="how often to observe it: 30s, 10m, 1h, 1d")],
    gpus: Annotated[int, typer.Option(help="GPU budget of a re-tune")],
    slo_ttft_ms: Annotated[float, typer.Option(help="TTFT SLO of a re-tune (ms)")],
    slo_tpot_ms: Annotated[float, typer.Option(help="TPOT SLO of a re-tune (ms)")],
    window: Annotated[
        str | None, typer.Option(help="the window each due time observes (default: --every)")
    ] = None,
    drift_threshold: Annotated[
        float, typer.Option(help="relative change of rate or lengths that re-tunes")
    ] = 0.3,
    error_threshold: Annotated[
        float | None, typer.Option(help="also re-tune when the p90 prediction error passes it")
    ] = None,
    gpu: Annotated[
        list[str] | None, typer.Option(help="GPU types a re-tune may use (default: deployed)")
    ] = None,
    trials: Annotated[int, typer.Option(help="trials per re-tune")] = 100,
) -> None:
    """Observe the deployment's Prometheus window at every due time and re-tune once per
    drift (`servetune worker` runs the due times and the re-tunes)."""
    from api.services.prometheus import parse_window
    from optimizer.search import TuneRequest, TuneRequestError
    from storage.deployments import DeploymentNotFound, get_deployment
    from storage.schedules import TimingError, create_schedule
    from storage.service_records import ScheduleTrigger

    try:
        interval_s = parse_window(every)
        window_s = parse_window(window) if window is not None else interval_s
    except ValueError as exc:
        fail(str(exc).replace("--window", "--every" if window is None else "--window", 1))
    try:
        with session() as s:
            d = get_deployment(s, deployment_id)
            accelerators = sorted({p.instance.accelerator for p in d.config.roles()})
            params = TuneRequest(
                model=d.config.model, gpu_types=tuple(gpu or accelerators), gpu_budget=gpus,
                slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, deployment_id=d.id,
                window_s=window_s, num_trials=trials,
            )  # fmt: skip
            info = create_schedule(
                s, project=d.project, name=f"deployment {d.id} drift", params=params,
                interval_s=interval_s, trigger=ScheduleTrigger.DRIFT,
                drift_threshold=drift_threshold, error_threshold=error_threshold,
            )  # fmt: skip
    except DeploymentNotFound as exc:
        fail(f"{exc} (see `servetune deployments list`)")
    except TimingError as exc:
        fail(str(exc).replace("interval_s", "--every", 1))
    except (TuneRequestError, ValueError) as exc:
        fail(str(exc))
    console.print(
        f"stored schedule {info.id}: every {every}, windows of {window_s:g} s, re-tunes on "
        f"drift beyond {drift_threshold:.0%}"
        + (f" or p90 error beyond {error_threshold:.0%}" if error_threshold else "")
        + f"; first due {info.next_run_at:%Y-%m-%d %H:%M:%S} UTC; `servetune worker` runs it"
    )


def print_loop(deployment_id: int) -> None:
    """`deployments show`'s lines on the loop: the calibrations (the newest applies) and the
    schedules over the deployment, with their last decision."""
    from optimizer.telemetry.calibrate import relative_errors
    from storage.deployment_calibrations import list_calibrations
    from storage.schedules import deployment_schedules

    with session() as s:
        calibrations = list_calibrations(s, deployment_id, limit=5)
        schedules = deployment_schedules(s, deployment_id)
    for i, c in enumerate(calibrations):
        held = c.fit.get("check")
        checked = "unchecked"
        if held is not None:
            err = relative_errors(_floats(held["after"]), _floats(held["observed"]))
            checked = (f"held out on {c.checked_on}: p90 TTFT {_pct(err['ttft_p90'])}, "
                       f"ITL {_pct(err['itl_p90'])}")  # fmt: skip
        applies = " (applies now)" if i == 0 else ""
        console.print(f"{c.describe()}; {checked}{applies}")
    for sc in schedules:
        every = f"every {sc.interval_s:g} s" if sc.interval_s else f"cron {sc.cron}"
        last = f"{sc.last_decision}: {sc.last_reason}" if sc.last_decision else "not run yet"
        console.print(f"schedule {sc.id}: {every}, re-tunes on drift beyond "
                      f"{sc.drift_threshold:.0%}; fired {sc.num_fired}; last {last}")  # fmt: skip


def check_deployment_model(deployment_id: int, model: str) -> None:
    """`tune --deployment`: the deployment exists and serves the model being tuned."""
    from storage.deployments import DeploymentNotFound, get_deployment

    try:
        with session() as s:
            deployed = get_deployment(s, deployment_id)
    except DeploymentNotFound as exc:
        fail(f"--deployment: {exc} (see `servetune deployments list`)")
    if deployed.config.model != model:
        fail(f"--deployment {deployment_id} serves {deployed.config.model!r}, not --model "
             f"{model!r}: its calibration prices that model")  # fmt: skip
