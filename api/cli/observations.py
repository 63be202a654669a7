"""`servetune observations` and `servetune calibrate`: real benchmark results against predictions.

    servetune observations import result.json --config deploy.yaml [--latency-model ID]
    servetune observations list
    servetune calibrate --observations 1,2,3 --holdout 4 [--latency-model ID]

`import` stores a `vllm bench serve --save-result --save-detailed` JSON with
the config that served it, simulates the same workload and prints the
comparison (calibrated when a calibration is stored for the latency model).
`calibrate` fits a per-step overhead and prefill/decode efficiency scales on
the given observations, reports the error before and after on the held-out
ones, and stores the calibration with the latency model; later simulations
and searches that load calibrations apply it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from api.cli.common import console, fail, session
from api.cli.simulate import resolve_latency
from api.cli.validate import comparison_table

app = typer.Typer(help="Observed runs (vllm bench serve results).", no_args_is_help=True)


@app.command("import")
def import_(
    path: Annotated[Path, typer.Argument(help="vllm bench serve --save-detailed JSON")],
    config: Annotated[Path, typer.Option(help="the serving config that produced it (YAML/JSON)")],
    name: Annotated[str | None, typer.Option(help="name to store (default: file name)")] = None,
    latency_model: Annotated[int | None, typer.Option(help="stored latency model id")] = None,
    calibrated: Annotated[bool, typer.Option(help="apply stored calibrations")] = True,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Store an observed run and compare it with a simulation of the same workload."""
    from api.cli.simulate import load_config
    from optimizer.sim import SimulationError
    from optimizer.validation import ObservationFormatError, compare_observation, load_vllm_result
    from optimizer.validation.api import observation_arrays
    from storage.validation import save_observation, save_validation_run

    cfg = load_config(config)
    try:
        obs = load_vllm_result(path, name=name)
    except ObservationFormatError as exc:
        fail(str(exc))
    latency, label = resolve_latency(cfg.model, latency_model, calibrated=calibrated)
    try:
        comparison = compare_observation(obs, cfg, latency, seed=seed)
    except (SimulationError, LookupError, ValueError) as exc:
        fail(f"cannot simulate the observed workload on this config: {exc}")
    with session() as s:
        rec = save_observation(
            s, name=obs.name, source="vllm-bench", config=cfg.to_dict(), summary=obs.summary,
            num_failed=obs.num_failed, arrays=observation_arrays(obs),
        )  # fmt: skip
        run = save_validation_run(
            s, kind="observation", workload=obs.name, config=cfg.to_dict(), latency=label,
            comparison=comparison.to_dict(), observation_id=rec.id,
        )  # fmt: skip
    console.print(
        comparison_table(comparison, f"observation {rec.id}: {obs.name} (latency: {label})")
    )
    console.print(
        f"stored observation {rec.id} ({obs.workload.num_requests} requests, "
        f"{obs.num_failed} failed dropped) and comparison {run.id}"
    )


@app.command("list")
def list_() -> None:
    """Stored observations."""
    from storage.validation import list_observations

    with session() as s:
        rows = list_observations(s)
    table = Table(title="observations")
    for col in ("id", "name", "source", "requests", "failed", "model", "created"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r.id), r.name, r.source, str(r.num_requests), str(r.num_failed),
            str(r.config.get("model", "")), f"{r.created_at:%Y-%m-%d %H:%M}",
        )  # fmt: skip
    console.print(table)


def _ids(text: str, option: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{option}: expected comma-separated observation ids, got {text!r}")
    if not ids:
        fail(f"{option}: no observation ids given")
    return ids


def _cases(ids: list[int]):
    from optimizer.config import ConfigError, ServingConfig
    from optimizer.validation import CalibrationCase
    from optimizer.validation.api import observation_from_arrays
    from storage.validation import ValidationNotFound, get_observation

    cases = []
    with session() as s:
        for oid in ids:
            try:
                rec = get_observation(s, oid)
            except ValidationNotFound as exc:
                fail(str(exc))
            try:
                cfg = ServingConfig.from_dict(rec.config)
            except ConfigError as exc:
                fail(f"observation {oid}: stored config is no longer valid: {exc}")
            arrays = {
                k: getattr(rec, k)
                for k in ("arrival_s", "input_tokens", "output_tokens", "ttft_s", "e2e_s")
            }
            obs = observation_from_arrays(rec.name, arrays, summary=rec.summary)
            cases.append(CalibrationCase(obs.workload, cfg, obs.outcomes, rec.name))
    return cases


def calibrate(
    observations: Annotated[str, typer.Option(help="observation ids to fit on, e.g. 1,2")],
    holdout: Annotated[str | None, typer.Option(help="observation ids to test on")] = None,
    latency_model: Annotated[int | None, typer.Option(help="stored latency model id")] = None,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Fit a per-step overhead and prefill/decode scales; report held-out error; store."""
    from optimizer.validation import Metric, default_slo, evaluate, fit_calibration
    from optimizer.validation.calibration import CalibratedSource
    from storage.validation import save_calibration

    fit_cases = _cases(_ids(observations, "--observations"))
    test_cases = _cases(_ids(holdout, "--holdout")) if holdout else fit_cases
    models = {c.config.model for c in fit_cases + test_cases}
    roles = {
        (p.instance.accelerator.lower(), p.instance.tp) for c in fit_cases for p in c.config.roles()
    }
    if len(models) != 1 or len(roles) != 1:
        fail(
            "calibrate one model on one (accelerator, tp) at a time; "
            f"got {sorted(models)} on {sorted(roles)}"
        )
    model, (acc, tp) = models.pop(), roles.pop()
    base, label = resolve_latency(model, latency_model, calibrated=False)
    fit = fit_calibration(fit_cases, base, seed=seed)
    cal = fit.calibration
    tuned = CalibratedSource(base, default=cal)
    table = Table(title=f"hold-out error before -> after calibration ({label})")
    table.add_column("observation")
    metrics = (Metric.MEAN_TTFT, Metric.P99_TTFT, Metric.MEAN_TPOT, Metric.P99_TPOT, Metric.GOODPUT)
    for m in metrics:
        table.add_column(m.value, justify="right")
    details: dict[str, dict[str, list[float | None]]] = {}
    for case in test_cases:
        slo = default_slo(case.measured)
        (before,), (after,) = (
            evaluate([case], base, slo, seed=seed),
            evaluate([case], tuned, slo, seed=seed),
        )
        cells = []
        details[case.name] = {}
        for m in metrics:
            b, a = before.error(m), after.error(m)
            details[case.name][m.value] = [b, a]
            cells.append(f"{b * 100:+.1f}% -> {a * 100:+.1f}%")
        table.add_row(case.name, *cells)
    console.print(table)
    console.print(
        f"calibration: overhead {cal.overhead_s * 1e3:.3f} ms/step, "
        f"prefill x{cal.prefill_scale:.3f}, decode x{cal.decode_scale:.3f} "
        f"(fit loss {fit.loss_before:.4f} -> {fit.loss_after:.4f}, "
        f"{fit.num_evaluations} simulations)"
    )
    with session() as s:
        rec = save_calibration(
            s, shape_name=model, accelerator=acc, tp=tp, overhead_s=cal.overhead_s,
            prefill_scale=cal.prefill_scale, decode_scale=cal.decode_scale,
            loss_before=fit.loss_before, loss_after=fit.loss_after,
            latency_model_id=latency_model, observation_ids=_ids(observations, "--observations"),
            details={"holdout": details},
        )  # fmt: skip
    console.print(f"stored calibration {rec.id} for {model} on {acc} tp={tp}")
