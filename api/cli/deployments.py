"""`servetune deployments`: configs running in production, and their observed windows.

    servetune deployments create --name N --config deployed.yaml [--prometheus-url U --selector S]
    servetune deployments list
    servetune deployments show ID      the deployment and its observations, newest first
    servetune deployments delete ID

Observations are added by `servetune observe --deployment ID --scrape B --scrape A`
(or POST /v1/deployments/{id}/observations). The CLI works on the configured database
(SERVETUNE_DATABASE_URL, SQLite by default): `create` stores into --project
("default" unless given), the others see every project's unless --project names one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from api.cli.common import console, fail, session

app = typer.Typer(help="Deployments and their observed windows.", no_args_is_help=True)
DEFAULT_PROJECT = "default"
Project = Annotated[str | None, typer.Option(help="only this project's (default: any)")]


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1e3:,.1f}"


@app.command("create")
def create(
    name: Annotated[str, typer.Option(help="a name for people, e.g. prod-chat")],
    config: Annotated[Path, typer.Option(help="the deployed ServingConfig as YAML or JSON")],
    prometheus_url: Annotated[
        str | None, typer.Option(help="Prometheus base URL, e.g. http://prometheus:9090")
    ] = None,
    selector: Annotated[
        str | None, typer.Option(help="label matcher of its series, e.g. '{job=\"vllm\"}'")
    ] = None,
    project: Annotated[str, typer.Option(help="the project it belongs to")] = DEFAULT_PROJECT,
) -> None:
    """Store a deployment: the config that runs, and where its metrics are."""
    from api.cli.simulate import load_config
    from storage.deployments import create_deployment

    cfg = load_config(config)
    try:
        with session() as s:
            info = create_deployment(
                s, project=project, name=name, config=cfg, prometheus_url=prometheus_url,
                label_selector=selector,
            )  # fmt: skip
    except ValueError as exc:
        fail(str(exc).replace("label_selector", "--selector", 1).replace(
            "prometheus_url", "--prometheus-url", 1))  # fmt: skip
    console.print(
        f"stored deployment {info.id}: {info.name} ({cfg.model}, {cfg.num_gpus} GPUs, "
        f"{cfg.engine_release.label}); observe it with "
        f"`servetune observe --deployment {info.id} --scrape BEFORE --scrape AFTER --window-s S`"
    )


@app.command("list")
def list_(project: Project = None) -> None:
    """Deployments, newest first."""
    from storage.deployments import list_deployments

    with session() as s:
        rows = list_deployments(s, project=project, limit=1000)
    table = Table(title="deployments" if project is None else f"deployments of {project}")
    for col in ("id", "project", "name", "model", "GPUs", "engine", "recommendation", "created"):
        table.add_column(col)
    for d in rows:
        rec = "-" if d.recommendation_id is None else str(d.recommendation_id)
        table.add_row(
            str(d.id), d.project, d.name, d.config.model, str(d.config.num_gpus),
            d.config.engine_release.label, rec, f"{d.created_at:%Y-%m-%d %H:%M}",
        )  # fmt: skip
    console.print(table)


@app.command("show")
def show(
    deployment_id: Annotated[int, typer.Argument(help="deployment id")],
    project: Project = None,
    limit: Annotated[int, typer.Option(help="observations shown, newest first")] = 20,
) -> None:
    """A deployment and its observations: observed against predicted p90 TTFT and ITL."""
    from storage.deployments import DeploymentNotFound, get_deployment, list_observations

    try:
        with session() as s:
            d = get_deployment(s, deployment_id, project=project)
            observations = list_observations(s, deployment_id, limit=max(limit, 1))
    except DeploymentNotFound as exc:
        fail(str(exc) if project is None else f"{exc} in project {project!r}")
    cfg = d.config
    console.print(
        f"deployment {d.id}: {d.name} in {d.project} ({cfg.model} on {cfg.mode.value}, "
        f"{cfg.num_gpus} GPUs, {cfg.engine_release.label}), created {d.created_at:%Y-%m-%d %H:%M}"
    )
    if d.recommendation_id is not None:
        console.print(f"from recommendation {d.recommendation_id}")
    if d.prometheus_url is not None or d.label_selector is not None:
        console.print(f"metrics: {d.prometheus_url or '-'} {d.label_selector or ''}")
    table = Table(title="observations, newest first")
    for col in ("id", "observed at", "window s", "req/s", "TTFT p90 ms obs / pred",
                "ITL p90 ms obs / pred"):  # fmt: skip
        table.add_column(col)
    for o in observations:
        table.add_row(
            str(o.id), f"{o.created_at:%Y-%m-%d %H:%M:%S}", f"{o.window_s:g}",
            f"{o.request_rate:.2f}",
            f"{_ms(o.ttft_p90_observed_s)} / {_ms(o.ttft_p90_predicted_s)}",
            f"{_ms(o.itl_p90_observed_s)} / {_ms(o.itl_p90_predicted_s)}",
        )  # fmt: skip
    console.print(table)
    if not observations:
        console.print(f"no observations yet: `servetune observe --deployment {d.id} ...`")
    print_loop(d.id)


@app.command("delete")
def delete(
    deployment_id: Annotated[int, typer.Argument(help="deployment id")],
    project: Project = None,
) -> None:
    """Delete a deployment and its observations."""
    from storage.deployments import DeploymentNotFound, delete_deployment

    try:
        with session() as s:
            delete_deployment(s, deployment_id, project=project)
    except DeploymentNotFound as exc:
        fail(str(exc) if project is None else f"{exc} in project {project!r}")
    console.print(f"deleted deployment {deployment_id} and its observations")


from api.cli.deployment_loop import calibrate, print_loop, schedule  # noqa: E402

app.command("calibrate")(calibrate)
app.command("schedule")(schedule)
