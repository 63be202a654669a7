"""`servetune tune`, `servetune worker` and `servetune explain`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from api.cli.common import console, fail, session, trace_source

if TYPE_CHECKING:
    from optimizer.search import TuneRequest
    from optimizer.search.outcome import TuneOutcome


def _trace_id(trace: str) -> int:
    """The stored trace's id, storing a trace file first."""
    path = trace_source(trace)
    if isinstance(path, int):
        return path
    from api.ingest import ingest_trace

    with session() as s:
        result = ingest_trace(s, path)
    return result.trace.id


def print_outcome(outcome: TuneOutcome) -> None:
    est = (
        " [yellow](roofline estimate: no measured profile)[/]"
        if outcome.latency.is_estimate
        else ""
    )
    console.print(f"\n[bold]Latency model:[/] {outcome.latency.label}{est}")
    table = Table(title="Pareto front (meets the SLOs at the trace's rate)")
    for col in ("trial", "mode", "GPUs", "tp", "tokens", "seqs", "chunked", "K",
                "goodput/GPU", "tok/s/user", "TTFT p90 ms", "TPOT p90 ms"):  # fmt: skip
        table.add_column(col, justify="right")
    rec_trial = outcome.recommendation.trial if outcome.recommendation else None
    for p in outcome.pareto:
        ev, cfg = p.predicted, p.config
        front, back = cfg.roles()[0].instance, cfg.roles()[-1].instance
        mode = cfg.mode.value + (
            f" {cfg.num_prefill}P:{cfg.num_decode}D" if cfg.num_prefill else ""
        )
        star = "*" if p.trial == rec_trial else ""
        table.add_row(
            f"{p.trial}{star}", mode, str(ev.num_gpus), f"{front.tp}/{back.tp}"
            if front is not back else str(front.tp), str(front.max_num_batched_tokens),
            str(back.max_num_seqs), "on" if front.enable_chunked_prefill else "off",
            str(cfg.speculation.num_speculative_tokens), f"{ev.goodput_per_gpu:.3f}",
            f"{ev.interactivity_tok_s:.1f}", f"{ev.ttft_p90_ms:.0f}", f"{ev.tpot_p90_ms:.1f}",
        )  # fmt: skip
    console.print(table)
    b = outcome.baseline
    console.print(
        f"[bold]Baseline[/] ({b.description}): {b.predicted.goodput_per_gpu:.3f} req/s per GPU"
    )
    rec = outcome.recommendation
    if rec is None:
        console.print("[red]No config meets the SLOs at the trace's rate.[/]")
        return
    gain = f"{b.gain:.2f}x the baseline" if b.gain else "baseline sustains nothing"
    console.print(
        f"[bold green]Recommendation[/] "
        f"({'the engine defaults' if rec.trial is None else f'trial {rec.trial}'}): "
        f"{rec.predicted.goodput_per_gpu:.3f} req/s per GPU on {rec.predicted.num_gpus} GPUs, "
        f"{gain}; attainment at the trace's rate {rec.predicted.attainment:.1%}"
    )
    for c in rec.slo_checks:
        mark = "[green]ok[/]" if c.ok else "[red]over[/]"
        console.print(f"  {c.metric}: {c.predicted:.1f} vs SLO {c.target:g}  {mark}")
    for c in rec.launch:
        console.print(f"\n[bold]{c.engine} {c.role}[/] (x{c.count}):", highlight=False)
        console.print(c.command, highlight=False, soft_wrap=True)
    console.print("\n[bold]Diagnosis[/]")
    for line in outcome.diagnosis.account:
        console.print(f"  {line}", highlight=False)


def write_outputs(outcome: TuneOutcome, out_dir: Path) -> list[Path]:
    from optimizer.search.report import write_html, write_png

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "outcome.json"]
    paths[0].write_text(json.dumps(outcome.to_dict(), indent=2), encoding="utf-8")
    if outcome.recommendation:
        p = out_dir / "recommended.yaml"
        p.write_text(outcome.recommendation.yaml(), encoding="utf-8")
        paths.append(p)
    paths.append(write_png(outcome, out_dir / "pareto.png"))
    paths.append(write_html(outcome, out_dir / "pareto.html"))
    return paths


def tune(
    trace: Annotated[str, typer.Option(help="stored trace id, or a trace file to import")],
    model: Annotated[str, typer.Option(help="model shape preset, e.g. llama-3.1-8b")],
    gpu: Annotated[list[str], typer.Option(help="GPU type on offer (repeat for several)")],
    gpus: Annotated[int, typer.Option(help="GPU budget")],
    slo_ttft_ms: Annotated[float, typer.Option(help="TTFT SLO, ms")],
    slo_tpot_ms: Annotated[float, typer.Option(help="TPOT SLO, ms")],
    trials: Annotated[int, typer.Option(help="trials in the study (in total)")] = 100,
    attainment: Annotated[float, typer.Option(help="share of requests meeting both SLOs")] = 0.9,
    seed: Annotated[int, typer.Option()] = 0,
    study: Annotated[str | None, typer.Option(help="study name (resumes when it exists)")] = None,
    space: Annotated[str | None, typer.Option(help="search-space overrides as JSON")] = None,
    max_requests: Annotated[int, typer.Option(help="evaluation window (first N requests)")] = 600,
    out: Annotated[Path | None, typer.Option(help="folder for JSON/YAML/PNG/HTML")] = None,
) -> None:
    """Search for goodput-maximising configs and print the recommendation."""
    from optimizer.search import TuneRequest, TuneRequestError

    try:
        overrides = json.loads(space) if space else {}
        request = TuneRequest(
            trace_id=_trace_id(trace), model=model, gpu_types=tuple(gpu), gpu_budget=gpus,
            slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, attainment=attainment,
            num_trials=trials, seed=seed, search_space=overrides, max_requests=max_requests,
        )  # fmt: skip
    except (TuneRequestError, json.JSONDecodeError) as exc:
        fail(str(exc))
    outcome = run_study(request, study or f"tune-{uuid.uuid4().hex[:8]}")
    if out is not None:
        for p in write_outputs(outcome, out):
            console.print(f"wrote {p}")


def run_study(request: TuneRequest, name: str) -> TuneOutcome:
    """Run (or resume) study `name` with a progress bar, then print its outcome."""
    from api.services.tuning import run_tuning_job
    from api.settings import get_settings
    from storage.traces import TraceNotFound

    with Progress(
        TextColumn("[bold]tuning[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("best {task.fields[best]}"), TimeRemainingColumn(), console=console,
        transient=False,
    ) as bar:  # fmt: skip
        task = bar.add_task("tune", total=request.num_trials, best="-")

        def on_progress(p) -> None:
            best = f"{p.best_goodput_per_gpu:.3f} req/s/GPU" if p.best_goodput_per_gpu else "-"
            bar.update(task, completed=p.trials_done, best=best)

        try:
            outcome = run_tuning_job(
                request, database_url=get_settings().database_url, study_name=name,
                should_stop=lambda: False, on_progress=on_progress,
                num_threads=get_settings().native_threads,
            )  # fmt: skip
        except (TraceNotFound, ValueError) as exc:
            fail(str(exc))
    console.print(f"study [bold]{name}[/] ({outcome.num_trials} trials)")
    print_outcome(outcome)
    return outcome


def worker(
    study: Annotated[str, typer.Option(help="name of an existing study to join")],
) -> None:
    """Join a study through the database and run trials until its budget is reached."""
    from api.cli.common import engine
    from api.services.tuning import run_worker
    from api.settings import get_settings

    engine()  # migrates the database
    url = get_settings().database_url
    try:
        done = run_worker(url, study, num_threads=get_settings().native_threads)
    except (LookupError, KeyError, ValueError) as exc:
        fail(str(exc))
    console.print(f"study {study}: {done} finished trials")


def explain(
    job_or_config: Annotated[str, typer.Argument(help="a study name, or an outcome.json file")],
) -> None:
    """Print the phase breakdown and the plain-language diagnosis of a tuning result."""
    path = Path(job_or_config)
    if path.suffix == ".json" and path.exists():
        data = json.loads(path.read_text(encoding="utf-8"))
    else:
        from storage.tuning import TuningRunNotFound, get_tuning_run

        try:
            with session() as s:
                run = get_tuning_run(s, job_or_config)
        except TuningRunNotFound as exc:
            fail(f"{exc}; expected a study name or an outcome.json path")
        if run.outcome is None:
            fail(f"study {job_or_config!r} has no outcome yet (status {run.status.value})")
        data = run.outcome
    diag = data.get("diagnosis") if isinstance(data, dict) else None
    if not diag:
        fail(f"{job_or_config}: no diagnosis in this outcome")
    table = Table(title="Phase breakdown")
    table.add_column("metric")
    rows = [d for d in (diag["baseline"], diag.get("recommendation")) if d]
    for d in rows:
        table.add_column(d["label"], justify="right")
    for key in ("rate", "prefill_share", "decode_share", "mixed_share", "mean_batch",
                "decode_intensity", "prefill_intensity", "ridge", "kv_utilization",
                "num_preemptions", "queueing_share_of_ttft", "itl_spike_share", "itl_p99_ms",
                "ttft_p90_ms", "tpot_p90_ms"):  # fmt: skip
        table.add_row(key, *(f"{d[key]:.3g}" if d[key] is not None else "-" for d in rows))
    console.print(table)
    for line in diag["account"]:
        console.print(line, highlight=False)
