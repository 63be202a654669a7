"""`servetune tune`, `servetune worker` and `servetune explain`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from api.cli.common import console, fail, output_dir, session, trace_source

if TYPE_CHECKING:
    from optimizer.search import TuneRequest
    from optimizer.search.outcome import Recommendation, TuneOutcome
    from optimizer.search.tables import TextTable


def _trace_id(trace: str) -> int:
    """The stored trace's id, storing a trace file first."""
    path = trace_source(trace)
    if isinstance(path, int):
        return path
    from api.cli.traces import print_plausibility
    from api.services.ingest import ingest_trace

    with session() as s:
        result = ingest_trace(s, path)
    print_plausibility(result.plausibility_warnings)
    return result.trace.id


def _price_hint(outcome: TuneOutcome) -> str:
    """How to get dollar figures, naming the GPUs of this run."""
    gpu = outcome.request.gpu_types[0]
    return f'no GPU prices given: --space \'{{"prices": [["{gpu}", 2.5]]}}\' adds $'


def print_header(outcome: TuneOutcome) -> None:
    """What was tuned: model, GPUs, SLOs, attainment, the evaluated trace."""
    from optimizer.search.verdict import tuned_text

    console.print(f"\n{tuned_text(outcome.request)}", highlight=False)
    console.print(outcome.evaluated.describe(), highlight=False)
    label = outcome.latency.label
    if outcome.latency.is_estimate:
        label = f"[yellow]{label} (no measured profile: an estimate)[/]"
    console.print(f"[bold]Latency model:[/] {label}")


def _rich(table: TextTable, *, right: bool = True) -> Table:
    """A table of the answer's text cells (`optimizer.search.tables`) for the terminal."""
    out = Table(title=table.title, caption=table.note or None)
    for col in table.head:  # numbers fold at 80 columns rather than turn into "15.…"
        out.add_column(col, justify="right" if right else "left", overflow="fold")
    for row in table.rows:
        out.add_row(*row)
    return out


def print_outcome(outcome: TuneOutcome) -> None:
    print_header(outcome)
    from optimizer.search.tables import pareto_table

    console.print(_rich(pareto_table(outcome)))
    verdict = outcome.verdict
    console.print(verdict.baseline, highlight=False)
    rec = outcome.recommendation
    if rec is None:
        console.print(f"[red]{verdict.headline}[/]", highlight=False)
    else:
        _print_recommendation(outcome, rec)
    console.print(
        f"\n`servetune explain {outcome.study_name}`: every trial, why each lost, and what "
        "would change the answer",
        highlight=False,
    )


def _print_recommendation(outcome: TuneOutcome, rec: Recommendation) -> None:
    console.print(f"[bold green]{outcome.verdict.headline}[/]", highlight=False)
    if rec.predicted.price_per_hour is None:
        console.print(f"  ({_price_hint(outcome)})", highlight=False)
    load = "with the clients" if outcome.evaluated.clients else "at the trace's own rate"
    for c in rec.slo_checks:
        mark = "[green]ok[/]" if c.ok else "[red]over[/]"
        console.print(f"  {c.metric} {load}: {c.predicted:.1f} vs SLO {c.target:g}  {mark}")
    if outcome.capacity:
        from optimizer.search.tables import capacity_table

        console.print(_rich(capacity_table(outcome)))
    if rec.launch:
        console.print(
            "\n[bold]Launch commands[/] (vLLM's or SGLang's, each on the node it names; GPUs "
            "are numbered from 0 on every node)",
            highlight=False,
        )
    for c in rec.launch:
        note = f" [dim]({c.note})[/]" if c.note else ""
        where = f"node {c.node}" + (f", {c.accelerator}" if c.accelerator else "")
        times = f" x{c.count}" if c.count > 1 else ""  # outcomes stored before the layout
        console.print(f"\n[bold]{c.engine} {c.role}[/]{times} on {where}:{note}", highlight=False)
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


def _workload_source(path: Path) -> dict:
    """A `vllm bench serve` workload file as a request's workload: an open loop (a finite
    rate, no binding concurrency) stored as the trace its client sends (once), a closed
    loop as its parameters (fleets are sized for its clients)."""
    from api.services.ingest import ingest_bench_workload
    from optimizer.bench_serve import BenchServeError, BenchServeSpec

    try:
        spec = BenchServeSpec.load(path)
        if not spec.is_open_loop:
            return {"workload": spec.to_plain()}
        with session() as s:
            return {"trace_id": ingest_bench_workload(s, spec).id}
    except BenchServeError as exc:
        fail(f"--workload {exc}")


def tune(
    model: Annotated[str, typer.Option(help="model shape preset, e.g. llama-3.1-8b")],
    gpu: Annotated[list[str], typer.Option(help="GPU type on offer (repeat for several)")],
    gpus: Annotated[int, typer.Option(help="GPU budget")],
    slo_ttft_ms: Annotated[float, typer.Option(help="TTFT SLO, ms")],
    slo_tpot_ms: Annotated[float, typer.Option(help="TPOT SLO, ms")],
    trials: Annotated[int, typer.Option(help="trials in the study (in total)")] = 100,
    attainment: Annotated[float, typer.Option(help="share of requests meeting both SLOs")] = 0.9,
    seed: Annotated[int, typer.Option()] = 0,
    study: Annotated[str | None, typer.Option(help="study name (resumes when it exists)")] = None,
    space: Annotated[
        str | None,
        typer.Option(
            help="search-space overrides as JSON, each key a list of the values to try: modes "
            "(colocated, disaggregated), tp, max_num_batched_tokens, max_num_seqs, "
            "chunked_prefill, pd_ratios ([[1, 2], ...]), prefix_caching, kv_cache_dtype "
            '(auto, fp8), spec_k; and prices ([["h100", 2.5]], USD per GPU-hour), '
            "quantization (fp8), engine (vllm or sglang: whose tables and rules price it), "
            "engine_version (its release, e.g. 0.12.0), "
            "max_model_len, kv_link. E.g. '{\"tp\": [1, 2]}'"
        ),
    ] = None,
    max_requests: Annotated[
        int | None, typer.Option(help="evaluate only the trace's first N requests (default: all)")
    ] = None,
    screen_requests: Annotated[
        int, typer.Option(help="trials screen on the busiest N consecutive requests (0: all)")
    ] = 2000,
    headroom: Annotated[
        float, typer.Option(help="size fleets for the peak rate x this factor (>= 1)")
    ] = 1.0,
    peak_window_s: Annotated[
        float, typer.Option(help="the peak rate is the busiest window of this many seconds")
    ] = 60.0,
    workers: Annotated[int, typer.Option(help="processes running trials together")] = 2,
    draft_model: Annotated[
        str | None,
        typer.Option(
            help="search speculation with this drafter: a model shape preset (e.g. "
            "llama-3.2-1b) or an EAGLE head's Hugging Face id"
        ),
    ] = None,
    acceptance_rate: Annotated[
        float | None,
        typer.Option(help="drafted tokens accepted, per token (default: the trace's, else 0.7)"),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="folder for JSON/YAML/PNG/HTML")] = None,
    trace: Annotated[
        str | None, typer.Option(help="stored trace id, or a trace file to import")
    ] = None,
    workload: Annotated[
        Path | None,
        typer.Option(
            help="a vllm bench serve workload file (random_input_len, ...): at a finite "
            "request_rate, tuned as the trace its client sends; with max_concurrency below "
            "num_prompts, a closed loop whose fleet is sized for its clients"
        ),
    ] = None,
    deployment: Annotated[
        int | None,
        typer.Option(
            help="tune for this stored deployment: priced with its newest calibration "
            "(`servetune deployments calibrate`)"
        ),
    ] = None,
) -> None:
    """Find the fewest GPUs (or lowest $/h) that meet the SLOs, and the configs to run."""
    from api.services.floors import check_request_floors
    from optimizer.search import TuneRequest, TuneRequestError

    if (trace is None) == (workload is None):
        fail("give exactly one of --trace (a trace) or --workload (a vllm bench serve file)")

    try:
        overrides = json.loads(space) if space else {}
    except json.JSONDecodeError as exc:
        fail(
            f"--space: not valid JSON ({exc.msg} at character {exc.pos}); e.g. '{{\"tp\": [1, 2]}}'"
        )
    if not isinstance(overrides, dict):
        fail(f"--space: expected a JSON object of search-space overrides, got {space!r}")
    try:
        source = {"trace_id": _trace_id(trace)} if trace is not None else _workload_source(workload)
        request = TuneRequest(
            **source, model=model, gpu_types=tuple(gpu), gpu_budget=gpus,
            slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, attainment=attainment,
            num_trials=trials, seed=seed, search_space=overrides, max_requests=max_requests,
            screen_requests=screen_requests, headroom=headroom, peak_window_s=peak_window_s,
            draft_model=draft_model, acceptance_rate=acceptance_rate, deployment_id=deployment,
        )  # fmt: skip
        with session() as s:  # an SLO below a physical floor is refused before any study
            check_request_floors(s, request)
    except TuneRequestError as exc:
        fail(str(exc).replace("search_space: ", "--space: ", 1))
    if not 1 <= workers <= 64:
        fail(f"--workers: expected 1 to 64 processes, got {workers}")
    if deployment is not None:
        from api.cli.deployment_loop import check_deployment_model

        check_deployment_model(deployment, model)
    if out is not None:
        output_dir(out)  # before the study runs, not after
    outcome = run_study(request, study or f"tune-{uuid.uuid4().hex[:8]}", workers=workers)
    if out is not None:
        for p in write_outputs(outcome, out):
            console.print(f"wrote {p}")


def run_study(request: TuneRequest, name: str, *, workers: int = 1) -> TuneOutcome:
    """Run (or resume) study `name` with a progress bar, then print its outcome."""
    from api.services.tuning import run_tuning_job
    from api.settings import get_settings
    from optimizer.search import TrialError
    from storage.traces import TraceNotFound

    with Progress(
        TextColumn("[bold]tuning[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[best]}"), TimeRemainingColumn(), console=console,
        transient=False,
    ) as bar:  # fmt: skip
        task = bar.add_task("tune", total=request.num_trials, best="")

        def on_progress(p) -> None:
            best = ""
            if p.screened_fewest_gpus:
                best = f"fewest so far ~{p.screened_fewest_gpus} GPUs (screened)"
            if p.stage == "done":
                best = "done"
            elif p.stage != "searching":
                best = p.stage
            bar.update(task, completed=p.trials_done, best=best)

        error = None
        try:
            outcome = run_tuning_job(
                request, database_url=get_settings().database_url, study_name=name,
                should_stop=lambda: False, on_progress=on_progress,
                num_threads=get_settings().native_threads, workers=workers,
            )  # fmt: skip
        except TrialError as exc:
            error = f"{exc.details()}\nThis is a servetune bug, not a bad config: please report it."
        except (TraceNotFound, ValueError) as exc:
            error = str(exc)
        if error is not None:
            bar.live.transient = True  # the run never started: leave no empty bar behind
    if error is not None:
        fail(error)
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


def _load_outcome(job_or_config: str) -> TuneOutcome:
    """The outcome in an outcome.json file or stored for a study."""
    from optimizer.search.outcome import OutcomeFormatError, TuneOutcome

    path = Path(job_or_config)
    if path.suffix == ".json" and path.exists():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            fail(f"{path}: not a readable outcome.json ({exc})")
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
    try:
        return TuneOutcome.from_dict(data)
    except OutcomeFormatError as exc:
        fail(f"{job_or_config}: {exc}; run the study again to explain it")


# The phase breakdown's rows: (label, field, format).
_PHASE_ROWS = (
    ("load (req/s)", "rate", "{:.2f}"),
    ("GPU time in prefill-only steps", "prefill_share", "{:.0%}"),
    ("GPU time in decode-only steps", "decode_share", "{:.0%}"),
    ("GPU time in mixed steps", "mixed_share", "{:.0%}"),
    ("sequences per step (mean)", "mean_batch", "{:.1f}"),
    ("decode intensity (FLOP/byte)", "decode_intensity", "{:.0f}"),
    ("prefill chunk intensity (FLOP/byte)", "prefill_intensity", "{:,.0f}"),
    ("GPU ridge point (FLOP/byte)", "ridge", "{:.0f}"),
    ("KV cache in use (mean)", "kv_utilization", "{:.0%}"),
    ("preemptions", "num_preemptions", "{:,}"),
    ("queueing share of TTFT", "queueing_share_of_ttft", "{:.0%}"),
    ("decode tokens hit by an ITL spike", "itl_spike_share", "{:.1%}"),
    ("ITL p99 (ms)", "itl_p99_ms", "{:,.1f}"),
    ("TTFT p90 (ms)", "ttft_p90_ms", "{:,.0f}"),
    ("TPOT p90 (ms)", "tpot_p90_ms", "{:.1f}"),
)


def _print_explanation(outcome: TuneOutcome) -> None:
    verdict = outcome.verdict
    print_header(outcome)
    colour = "green" if outcome.recommendation is not None else "red"
    console.print(f"[bold {colour}]{verdict.headline}[/]", highlight=False)
    console.print(verdict.baseline, highlight=False)
    from optimizer.search.tables import lost_line, trials_table

    console.print(_rich(trials_table(outcome), right=False))
    if outcome.trials.lost:
        console.print("[bold]Trials that lost, by reason[/]")
        for g in outcome.trials.lost:
            console.print(f"  {lost_line(g)}", highlight=False)
    if verdict.runner_up:
        console.print("\n[bold]Why the recommendation beats the runner-up[/]")
        console.print(f"  {verdict.runner_up}", highlight=False)
    if verdict.what_ifs:
        console.print("\n[bold]What would change the answer[/]")
        for line in verdict.what_ifs:
            console.print(f"  - {line}", highlight=False)
    diag = outcome.diagnosis
    phases = [d for d in (diag.baseline, diag.recommendation) if d is not None]
    if phases:
        table = Table(title="Where GPU time goes (at the workload's own load)")
        table.add_column("")
        for d in phases:
            table.add_column(d.label, justify="right")
        for label, key, fmt in _PHASE_ROWS:
            table.add_row(label, *(fmt.format(getattr(d, key)) for d in phases))
        console.print(table)
    console.print("[bold]Diagnosis[/]")
    for line in diag.account:
        console.print(f"  {line}", highlight=False)


def explain(
    job_or_config: Annotated[str, typer.Argument(help="a study name, or an outcome.json file")],
) -> None:
    """Explain a tuning result: the verdict, every trial and why it lost, why the
    recommendation beats the runner-up, what would change the answer, where GPU time goes."""
    _print_explanation(_load_outcome(job_or_config))
