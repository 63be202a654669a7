"""`servetune profile`: measure kernel timings, import public tables, inspect stored runs.

Torch is imported only when a command needs it (`profile run`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from api.cli.common import console, fail, session
from optimizer.records import DeviceInfo, KernelSample, ProfileRunInfo
from profiler.importers import ImportFormat

if TYPE_CHECKING:
    from profiler.importers.aiconfigurator_package import AicPackage, SystemChoice
    from profiler.sweep import ProfileGrid
    from storage.latency_models import LatencyModelInfo

app = typer.Typer(help="Kernel profiles: measure, import, inspect.", no_args_is_help=True)


def _grid(spec: str, device_kind: str) -> ProfileGrid:
    from profiler.sweep import default_cpu_grid, default_gpu_grid, load_grid, quick_grid

    base = default_gpu_grid() if device_kind == "cuda" else default_cpu_grid()
    if spec == "quick":
        return quick_grid()
    if spec == "default":
        return base
    path = Path(spec)
    if not path.is_file():
        fail(f"--grid {spec!r}: expected quick, default or a JSON/YAML grid file")
    try:
        return load_grid(path, base=base)
    except ValueError as exc:
        fail(str(exc))


def _store(
    name: str,
    source: str,
    accelerator: str,
    device: DeviceInfo,
    samples: list[KernelSample],
    engine: str = "",
) -> ProfileRunInfo:
    from storage.profiles import create_profile_run

    try:
        with session() as s:
            return create_profile_run(
                s,
                name=name,
                source=source,
                accelerator=accelerator,
                device=device,
                samples=samples,
                engine=engine,
            )
    except ValueError as exc:
        fail(f"nothing stored: {exc}")


@app.command("run")
def run(
    model: Annotated[str, typer.Option(help="model shape preset (e.g. tiny) or config.json path")],
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N")] = "cpu",
    grid: Annotated[
        str, typer.Option(help="quick, default, or a JSON/YAML file overriding the default grid")
    ] = "default",
    name: Annotated[str | None, typer.Option(help="name to store (default: model@device)")] = None,
    dtype: Annotated[
        str | None, typer.Option(help="override the shape's dtype (float32, bfloat16, float16)")
    ] = None,
    threads: Annotated[
        int | None, typer.Option(min=1, help="CPU: torch threads (default: the grid's, 1)")
    ] = None,
) -> None:
    """Measure every operator of a model shape on a device and store the run."""
    from dataclasses import replace

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from optimizer.shapes import ShapeError, get_shape
    from profiler.device import DeviceError, accelerator_name, describe_device, parse_device
    from profiler.sweep import plan_cases, run_sweep

    try:
        shape = get_shape(model)
        if dtype is not None:
            shape = shape.with_dtype(dtype)
            from profiler.kernels import torch_dtype

            torch_dtype(shape.dtype)
    except (ShapeError, ValueError) as exc:
        fail(f"--model/--dtype: {exc}")
    try:
        dev = parse_device(device)
    except DeviceError as exc:
        fail(str(exc))
    profile_grid = _grid(grid, dev.type)
    if threads is not None:
        profile_grid = replace(profile_grid, num_threads=threads)
    try:
        total = len(plan_cases(shape, profile_grid))
    except ValueError as exc:
        fail(str(exc))
    info = describe_device(dev, profile_grid.num_threads if dev.type == "cpu" else None)
    accelerator = accelerator_name(info)
    console.print(f"profiling [bold]{shape.name}[/] ({shape.dtype}) on {info.name}: {total} cases")
    columns = (
        TextColumn("{task.description}", style="cyan"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    start = time.perf_counter()
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("starting", total=total)

        def advance(done: int, _total: int, label: str) -> None:
            progress.update(task, completed=done, description=label)

        samples = run_sweep(shape, profile_grid, dev, progress=advance)
    wall_s = time.perf_counter() - start
    stored = _store(name or f"{shape.name}@{accelerator}", "profiler", accelerator, info, samples)
    console.print(
        f"stored profile run [bold]{stored.id}[/]: {stored.num_samples:,} samples in {wall_s:.1f} s"
    )


@app.command("import")
def import_(
    path: Annotated[
        Path | None,
        typer.Argument(help="AIConfigurator GPU folder or Vidur CSV/folder (or --aiconfigurator)"),
    ] = None,
    format: Annotated[
        ImportFormat | None, typer.Option("--format", help="source format of PATH")
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            help="with PATH: accelerator of the files whose path names none (h100_sxm/, "
            "a100_dgx/ ...); with --aiconfigurator: h100, h200, b200 ... or all"
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            help="name to store (default: source:path; with --aiconfigurator: the package, "
            "its version, the system and engine)"
        ),
    ] = None,
    aiconfigurator: Annotated[
        bool,
        typer.Option(
            "--aiconfigurator",
            help="import the tables of the installed aiconfigurator-core "
            "(pip install 'servetune\\[aic]') and fit a latency model on each",
        ),
    ] = False,
    engine: Annotated[
        str | None,
        typer.Option(help="with --aiconfigurator: whose tables, vllm (default), sglang or trtllm"),
    ] = None,
) -> None:
    """Import public GPU kernel measurements into a stored profile run."""
    from profiler.importers import ProfileImportError, import_profile

    if aiconfigurator:
        if path is not None or format is not None:
            fail("PATH/--format and --aiconfigurator are mutually exclusive: pass one source")
        _import_aiconfigurator_package(gpu, engine or "vllm", name)
        return
    if path is None:
        fail("pass PATH --format FORMAT, or --aiconfigurator --gpu NAME (NAME or all)")
    if format is None:
        fail("--format is required with PATH (aiconfigurator or vidur)")
    if engine is not None:
        fail("--engine applies to --aiconfigurator only")
    try:
        imported = import_profile(path, format, gpu)  # checks that `path` exists
    except ProfileImportError as exc:
        fail(str(exc))
    if not imported.samples:
        fail(f"{path}: no {format.value} samples found")
    stored = _store(
        name or f"{imported.source}:{path.name}",
        imported.source,
        imported.accelerator,
        imported.device,
        imported.samples,
        imported.engine,
    )
    console.print(
        f"stored profile run [bold]{stored.id}[/] ({stored.accelerator}): "
        f"{stored.num_samples:,} samples"
    )


def _import_aiconfigurator_package(gpu: str | None, engine: str, name: str | None) -> None:
    """`profile import --aiconfigurator`: each chosen system of the installed package is
    imported, stored and fitted (as `latency fit --profile ID`), one after the other. With
    several (`--gpu all`) a system that fails is reported and the rest still import; the
    command then exits 1 naming the failed ones."""
    from rich.markup import escape

    from profiler.importers import ProfileImportError
    from profiler.importers.aiconfigurator_package import (
        ALL,
        choose_systems,
        describe_systems,
        locate_package,
    )

    try:
        package = locate_package()
        if gpu is None:
            fail(f"--aiconfigurator needs --gpu NAME or --gpu {ALL}. {describe_systems(package)}")
        chosen, skipped = choose_systems(package, gpu, engine)
    except ProfileImportError as exc:
        fail(escape(str(exc)))  # the install hint's [aic] is not markup
    if name is not None and len(chosen) > 1:
        fail(f"--name names one profile run; --gpu {ALL} imports {len(chosen)}")
    for s in skipped:
        console.print(f"skipped {s.system}: {s.reason}")
    if not chosen:
        fail(f"{package.label}: no system holds {engine} tables servetune can import")
    if len(chosen) == 1:  # one system: its error is the command's
        import_package_system(package, chosen[0], engine, name)
        return
    failed: list[str] = []
    for choice in chosen:
        try:  # each system on its own: a failure is reported and the rest still import
            import_package_system(package, choice, engine, name)
        except typer.Exit:  # `fail` printed why
            failed.append(choice.system)
    if failed:
        fail(
            f"{len(failed)} of {len(chosen)} systems failed: {', '.join(failed)} "
            "(the others were stored and fitted)",
            code=1,
        )


def import_package_system(
    package: AicPackage, choice: SystemChoice, engine: str, name: str | None
) -> LatencyModelInfo:
    """One system of the package imported, stored and fitted (the stored model returned);
    exits through `fail`."""
    from rich.markup import escape

    from api.cli.latency import fit_profile_run
    from profiler.importers import ProfileImportError
    from profiler.importers.aiconfigurator_package import import_system

    for note in package.notes(choice.system):
        console.print(f"note: {note}")
    with console.status(f"importing {package.label} {choice.system} ({engine})"):
        try:
            imported = import_system(package, choice, engine)
        except ProfileImportError as exc:
            fail(f"{choice.system}: {escape(str(exc))}")
    stored = _store(
        name or f"{package.label}: {choice.system} {engine}",
        imported.source,
        imported.accelerator,
        imported.device,
        imported.samples,
        imported.engine,
    )
    del imported  # one system's samples in memory at a time
    console.print(
        f"stored profile run [bold]{stored.id}[/] ({stored.accelerator}): "
        f"{stored.num_samples:,} samples from {package.label} {choice.system} ({engine})"
    )
    return fit_profile_run(stored.id)


@app.command("list")
def list_() -> None:
    """List stored profile runs."""
    from storage.profiles import list_profile_runs

    with session() as s:
        runs = list_profile_runs(s)
    if not runs:
        console.print("no profile runs stored yet: `servetune profile run --model tiny`")
        return
    table = Table("id", "name", "source", "accelerator", "device", "samples", "created (UTC)")
    for r in runs:
        table.add_row(
            str(r.id),
            r.name,
            r.source,
            r.accelerator,
            r.device.name,
            f"{r.num_samples:,}",
            f"{r.created_at:%Y-%m-%d %H:%M}",
        )
    console.print(table)


def _device_table(info: ProfileRunInfo) -> Table:
    d = info.device
    table = Table(title=f"profile run {info.id}: {info.name}", show_header=False)
    table.add_column("figure")
    table.add_column("value")
    rows = [
        ("source", info.source),
        ("accelerator", info.accelerator),
        ("device", f"{d.name} ({d.kind})"),
        ("memory", None if d.memory_gb is None else f"{d.memory_gb:,.1f} GB"),
        ("compute capability", d.compute_capability),
        ("driver", d.driver),
        ("CUDA", d.cuda_version),
        ("torch", d.torch_version),
        ("threads", None if d.num_threads is None else str(d.num_threads)),
        ("samples", f"{info.num_samples:,}"),
        ("created (UTC)", f"{info.created_at:%Y-%m-%d %H:%M}"),
    ]
    for label, value in rows:
        if value is not None:
            table.add_row(label, value)
    return table


@app.command("show")
def show(run_id: Annotated[int, typer.Argument(help="profile run id")]) -> None:
    """Show a run's device metadata and its samples per operator."""
    from storage.profiles import ProfileRunNotFound, count_samples_by_op, get_profile_run

    try:
        with session() as s:
            info = get_profile_run(s, run_id)
            counts = count_samples_by_op(s, run_id)
    except ProfileRunNotFound as exc:
        fail(str(exc))
    console.print(_device_table(info))
    table = Table("op", "samples", "median ms (min)", "median ms (max)")
    for op, (n, lo, hi) in counts.items():
        table.add_row(str(op), f"{n:,}", f"{lo:.4g}", f"{hi:.4g}")
    console.print(table)


@app.command("delete")
def delete(run_id: Annotated[int, typer.Argument(help="profile run id")]) -> None:
    """Delete a stored run and its samples."""
    from storage.profiles import ProfileRunNotFound, delete_profile_run

    try:
        with session() as s:
            delete_profile_run(s, run_id)
    except ProfileRunNotFound as exc:
        fail(str(exc))
    console.print(f"deleted profile run {run_id}")
