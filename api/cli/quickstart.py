"""`servetune quickstart`: the main job on the embedded default, no set-up needed.

Generates a seeded sample trace shaped like a production chat service, stores
it in the default database (SQLite in the user's data directory unless
SERVETUNE_DATABASE_URL says otherwise), prints its summary, then runs a full
tuning study on it (Llama-3.1-8B on 4 H100s, TTFT <= 2 s, TPOT <= 50 ms at 90%)
and prints the recommendation with its launch commands.

Prices: a fitted H100 model of vLLM's tables already stored; else, when the `aic`
extra is installed, AIConfigurator's measured H100 vLLM tables, imported and fitted
first (`profile import --aiconfigurator --gpu h100`, about a minute, once); else the
roofline estimate, labelled as such, with the command that gets measured prices.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import console

SAMPLE_NAME = "sample-chat"
GPU = "h100"


def measured_prices(allow_import: bool) -> int | None:
    """The stored fitted model that prices the quickstart's GPU with vLLM's tables (or a
    profiler's), imported from the installed aiconfigurator-core first when there is none
    and `allow_import`; None: the roofline prices it (said, with how to do better)."""
    from rich.markup import escape

    from api.cli.common import session
    from api.cli.profile import import_package_system
    from profiler.importers.aiconfigurator_package import (
        INSTALL_HINT,
        PackageNotInstalled,
        choose_systems,
        locate_package,
    )
    from storage.latency_models import list_latency_models

    with session() as s:
        stored = [m for m in list_latency_models(s, accelerator=GPU) if m.engine in ("", "vllm")]
    if stored:
        newest = max(stored, key=lambda m: m.id)
        console.print(f"prices: stored latency model #{newest.id} ({newest.name})")
        return newest.id
    if allow_import:
        try:
            package = locate_package()
        except PackageNotInstalled:
            package = None
        if package is not None:
            console.print(f"prices: importing {package.label}'s measured {GPU} vLLM tables")
            (choice,), _ = choose_systems(package, GPU, "vllm")
            return import_package_system(package, choice, "vllm", None).id
    hint = escape(f"{INSTALL_HINT} && servetune profile import --aiconfigurator --gpu {GPU}")
    console.print(f"[yellow]prices: roofline estimate (no measured {GPU} tables); for measured "
                  f"ones: {hint}[/]")  # fmt: skip
    return None


def write_sample_trace(path: Path, *, num_requests: int = 3000, seed: int = 7) -> Path:
    """A chat-like trace: bursty Gamma arrivals (CV 2) at 5 req/s, lognormal lengths."""
    from api.services.export import write_trace
    from optimizer.records import TraceColumns
    from optimizer.workload import ArrivalProcess, LognormalLength, synthetic_workload

    wl = synthetic_workload(
        num_requests,
        5.0,
        input_lengths=LognormalLength(mean=1150, sigma=0.9, max_tokens=14000),
        output_lengths=LognormalLength(mean=210, sigma=0.9, max_tokens=1000),
        arrival=ArrivalProcess.GAMMA,
        cv=2.0,
        seed=seed,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = TraceColumns(wl.arrival_s, wl.input_tokens, wl.output_tokens)
    write_trace(columns, path, csv=True)
    return path


def quickstart(
    out_dir: Annotated[
        Path | None, typer.Option(help="where to write the sample trace (default: data dir)")
    ] = None,
    trials: Annotated[int, typer.Option(help="tuning trials (0: only store the trace)")] = 40,
    workers: Annotated[int, typer.Option(help="processes running trials together")] = 2,
    measured: Annotated[
        bool,
        typer.Option(
            help="import AIConfigurator's measured H100 tables first when the aic extra is "
            "installed and none are stored (--no-measured: no import; a stored model still "
            "prices it, else the roofline estimate)"
        ),
    ] = True,
) -> None:
    """Generate a sample trace, store it, tune a deployment for it and print the result."""
    from platformdirs import user_data_dir

    from api.cli.common import session
    from api.cli.traces import _summary_table
    from api.services.ingest import ingest_trace
    from api.settings import get_settings

    folder = out_dir or Path(user_data_dir("servetune", appauthor=False))
    path = write_sample_trace(folder / f"{SAMPLE_NAME}.csv")
    console.print(f"sample trace written to {path}")
    console.print(f"database: {get_settings().database_url}")
    with session() as s:
        result = ingest_trace(s, path, name=SAMPLE_NAME)
    verb = "stored as" if result.created else "already stored as"
    console.print(f"{verb} trace [bold]{result.trace.id}[/]")
    console.print(_summary_table(result.trace))
    if trials <= 0:
        return
    from api.cli.tune import run_study
    from optimizer.search import TuneRequest

    model_id = measured_prices(measured)
    priced = f"-m{model_id}" if model_id is not None else ""

    request = TuneRequest(
        trace_id=result.trace.id, model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=4,
        slo_ttft_ms=2000, slo_tpot_ms=50, attainment=0.9, num_trials=trials, seed=0,
    )  # fmt: skip
    run_study(request, f"quickstart-{result.trace.id}-{trials}{priced}", workers=workers)
