"""`servetune observe`: two scrapes of a vLLM server's /metrics, the window's traffic
rebuilt and simulated under the deployed config, observed against predicted; with
`--deployment ID` the stored deployment's config, and the observation is stored with it.
`--deployment ID --window 1h [--at TIME]` reads the window from the deployment's
Prometheus server instead of two saved pages."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from api.cli.common import LatencyModelOption, console, fail, session
from api.cli.simulate import load_config, resolve_latency

if TYPE_CHECKING:
    from api.services.observe import Scrape
    from optimizer.telemetry import ObservationReport
    from storage.service_records import Deployment


def _read_scrape(path: Path, which: str, model_name: str | None) -> Scrape:
    from api.services.observe import read_scrape
    from optimizer.telemetry import TelemetryError

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"--scrape {path} ({which}): cannot read it: {exc}")
    try:
        return read_scrape(text, which, path.name, model_name=model_name)
    except TelemetryError as exc:
        fail(str(exc))


def _deployment(deployment_id: int) -> Deployment:
    from storage.deployments import DeploymentNotFound, get_deployment

    try:
        with session() as s:
            return get_deployment(s, deployment_id)
    except DeploymentNotFound as exc:
        fail(f"--deployment: {exc} (see `servetune deployments list`)")


def _from_prometheus(
    deployed: Deployment, window: str, at: str | None, model_name: str | None
) -> tuple[Scrape, Scrape, float]:
    from api.services.observe import read_prometheus
    from api.services.prometheus import PrometheusError, parse_time, parse_window
    from optimizer.telemetry import TelemetryError

    if deployed.prometheus_url is None or deployed.label_selector is None:
        fail(
            f"deployment {deployed.id} has no stored Prometheus URL and label selector (create "
            "it with --prometheus-url and --selector), so --window cannot read it; give two "
            "--scrape files and --window-s instead"
        )
    try:
        window_s, end = parse_window(window), parse_time(at)
    except ValueError as exc:
        fail(str(exc))
    try:
        before, after = read_prometheus(deployed.prometheus_url, deployed.label_selector,
                                        window_s, end, model_name=model_name)  # fmt: skip
    except (PrometheusError, TelemetryError) as exc:
        fail(str(exc))
    return before, after, window_s


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1e3:,.1f}"


def _num(value: float | None, fmt: str = ",.1f") -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt)


def report_rows(report: ObservationReport) -> list[tuple[str, str, str]]:
    """(figure, observed, predicted) rows of the table."""
    rows = []
    for label, c in (("TTFT", report.ttft), ("ITL", report.itl), ("E2E", report.e2e)):
        o, p = c.observed, c.predicted
        rows.append((f"{label} ms p50 / p90 / p99", f"{_ms(o.p50)} / {_ms(o.p90)} / {_ms(o.p99)}",
                     f"{_ms(p.p50)} / {_ms(p.p90)} / {_ms(p.p99)}"))  # fmt: skip
        rows.append((f"{label} ms mean", _ms(c.observed_mean_s), _ms(c.predicted_mean_s)))
    kv, queue = report.kv_cache_usage, report.queue_mean_s
    rows += [
        ("queue time ms mean", _ms(queue.observed), _ms(queue.predicted)),
        ("KV-cache usage (AFTER gauge / simulated mean)", _num(kv.observed, ".1%"),
         _num(kv.predicted, ".1%")),
        ("preemptions in the window", _num(report.num_preemptions.observed, ",.0f"),
         _num(report.num_preemptions.predicted, ",.0f")),
        ("prompt tokens mean (exact / rebuilt)", _num(report.mean_prompt_tokens.observed),
         _num(report.mean_prompt_tokens.predicted)),
        ("output tokens mean (exact / rebuilt)", _num(report.mean_output_tokens.observed),
         _num(report.mean_output_tokens.predicted)),
        ("requests the config cannot hold", "-", f"{report.num_rejected:,}"),
    ]  # fmt: skip
    return rows


def observe(
    scrape: Annotated[
        list[Path] | None,
        typer.Option(help="a vLLM /metrics page saved as text; give two: BEFORE, then AFTER"),
    ] = None,
    window_s: Annotated[float | None, typer.Option(help="seconds between the two scrapes")] = None,
    window: Annotated[
        str | None,
        typer.Option(
            help="with --deployment and no --scrape: read the window (30s, 10m, 1h, 1d) from "
            "the deployment's Prometheus server"
        ),
    ] = None,
    at: Annotated[
        str | None,
        typer.Option(help="with --window: the window's end, RFC 3339 or unix seconds (now)"),
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="the deployed ServingConfig as YAML or JSON")
    ] = None,
    deployment: Annotated[
        int | None,
        typer.Option(
            help="a stored deployment's id (`servetune deployments create`) instead of "
            "--config: its config is used and the observation is stored with it"
        ),
    ] = None,
    model_name: Annotated[
        str | None,
        typer.Option(help="read only series with this model_name label (default: all)"),
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            help="bound of the token histograms' +Inf bucket (default: the config's "
            "max_model_len, else 2x the largest finite bucket)"
        ),
    ] = None,
    latency_model: LatencyModelOption = None,
    seed: Annotated[int, typer.Option(help="seed of the rebuilt arrivals and lengths")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Compare a running vLLM server's metrics over a window with the simulator's
    prediction for its config (and store it with --deployment)."""
    from api.services.observe import ObserveError, observe, store
    from optimizer.telemetry import TelemetryError

    if max_model_len is not None and max_model_len <= 0:
        fail(f"--max-model-len must be a positive number of tokens, got {max_model_len}")
    if (config is None) == (deployment is None):
        fail("give exactly one of --config (a file) or --deployment (a stored deployment's id)")
    deployed = _deployment(deployment) if deployment is not None else None
    cfg = load_config(config) if config is not None else deployed.config
    if window is not None or at is not None:
        if scrape or window_s is not None or deployed is None or window is None:
            fail("--window [--at] reads a deployment's Prometheus server: give it with "
                 "--deployment and without --scrape or --window-s")  # fmt: skip
        before, after, window_s = _from_prometheus(deployed, window, at, model_name)
    else:
        if len(scrape or ()) != 2:
            fail(f"--scrape: expected two files (BEFORE, then AFTER), got {len(scrape or ())}"
                 " (or --deployment ID --window 1h to read its Prometheus server)")  # fmt: skip
        if window_s is None or not (math.isfinite(window_s) and window_s > 0):
            shown = "none" if window_s is None else f"{window_s:g}"
            fail(f"--window-s must be a positive number of seconds, got {shown}")
        before = _read_scrape(scrape[0], "BEFORE", model_name)
        after = _read_scrape(scrape[1], "AFTER", model_name)
    latency, label = resolve_latency(cfg.model, latency_model)
    calibration_id = None
    if deployed is not None:
        from api.services.calibrate import deployment_latency

        with session() as s:
            applied = deployment_latency(s, deployed.id, latency, label)
        latency, label, calibration_id = applied.source, applied.label, applied.calibration_id
    try:
        observed = observe(before, after, window_s, cfg, latency, label,
                           max_model_len=max_model_len, seed=seed)  # fmt: skip
    except (TelemetryError, ObserveError) as exc:
        fail(str(exc))
    stored = None
    if deployment is not None:
        with session() as s:
            stored = store(s, deployment, observed, calibration_id=calibration_id)
    report, result, priced_as = observed.report, observed.result, observed.priced_as
    if as_json:
        out = observed.document()
        out |= {"config": cfg.to_dict(), "latency_is_estimate": result.latency_is_estimate}
        if stored is not None:
            out |= {"deployment_id": deployment, "observation_id": stored.id}
        typer.echo(json.dumps(out, indent=2))
        return
    capped = (
        f", {report.num_simulated:,} replayed" if report.num_simulated < report.num_requests else ""
    )
    title = (
        f"{report.num_requests:,} requests in {report.window_s:g} s "
        f"({report.request_rate:.2f} req/s{capped}) on {cfg.mode.value} ({result.num_gpus} GPUs), "
        f"latency: {label}; priced as {priced_as}"
    )
    table = Table("figure", "observed", "predicted", title=title)
    for row in report_rows(report):
        table.add_row(*row)
    console.print(table)
    console.print(f"ITL read from {report.itl.metric}; quantiles interpolated in its buckets")
    if result.latency_is_estimate:
        console.print("[yellow]figures priced by a roofline estimate, not measured kernels[/]")
    if stored is not None:
        console.print(f"stored observation {stored.id} of deployment {deployment}")
