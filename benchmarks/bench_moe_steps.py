"""The per-step check on the measured MoE steps (issue 27): vLLM 0.20.1 (V1, async
scheduling) serving Qwen/Qwen3.6-35B-A3B bf16 on B300 (observations/aic-fpm-b300; the
shared data README says what `latency_ms` is), each step priced as the simulator prices
it with the B300 tables (the per-step check of `benchmarks/bench_devset.py`, mirrored:
the same reader, step pricing and error summary). Usage:

    .venv/bin/python benchmarks/bench_moe_steps.py [--routing DISTRIBUTION|all] [--fit]
        [--gdn-tables] [--aic-package | --tables shared|package|both]

Runs: `fpm_upfront_qwen36_moe_full_once_*` (TP 1/2/4/8 without EP, `tpN_ep1`, and with
--enable-expert-parallel, `tpN_epN`; tp8_ep1 recorded no steps) and
`fpm_gap_qwen36_dp_ep_official_*` (--data-parallel-size dp with EP over tp x dp GPUs,
`tpT_epE`: dp = E / T; rank 0's steps). Budget: 8,192 batched tokens (the README).

The model is the `qwen3.6-35b-a3b` preset (vllm_metadata.json names the checkpoint):
40 layers of hidden 2048, 256 routed experts of 512 (top 8) plus a shared expert of 512,
30 Gated DeltaNet layers and 10 gated full-attention layers (`optimizer.latency.gdn`).

`--fit` prints the async generation's constants fitted as `optimizer/engines.py` holds
them (benchmarks/step_fit.py: on the dense Qwen3-32B steps and on the prefill and mixed
steps of these TP/EP runs at TP >= 2 that do not follow an idle gap, where the host's
launches outside CUDA graphs bind; the DP + EP runs are left out of the fit and check it).

Routing: AIConfigurator measured the fused MoE with balanced routing and two power-law
skews; the import keeps power_law_1.01, AIConfigurator's own default. `--routing` picks
which rows the MoE op is fitted on (all: one report each), to show how far routing skew
moves the steps.

GDN: the shared copy of the B300 tables holds no linear_attention folder, so the GDN
cores are the estimate's (`optimizer.latency.gdn`). `--gdn-tables` adds the installed
aiconfigurator-core's B300 vLLM GDN tables (`gdn_prefill` / `gdn_decode`, fitted apart
and added to the model: each op is fitted on its own samples) to show how the measured
cores move the steps (the step constants stay those fitted with the estimate).

Tables: the shared copy's B300 folder (profiles/aiconfigurator/b300_sxm) by default;
`--aic-package` takes the installed aiconfigurator-core's b300_sxm instead (as `servetune
profile import --aiconfigurator --gpu b300` reads it), `--tables both` runs each and ends
with their per-step-type figures side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

from step_fit import (
    RELEASE,
    STEPS,
    TABLES,
    describe,
    fit_b300,
    fit_v1_async,
    moe_folders,
    table,
)

from optimizer.latency.fit import fit_latency_model
from optimizer.latency.model import LatencyModel
from optimizer.parallel import ExpertLayout
from optimizer.shapes import get_shape
from optimizer.validation.forward_passes import (
    phase_errors,
    price_step_s,
    read_forward_pass_metrics,
    summarize_phases,
)
from profiler.importers.aiconfigurator_gdn import gdn_samples
from profiler.importers.aiconfigurator_moe import MOE_DISTRIBUTIONS
from profiler.importers.aiconfigurator_package import locate_package

QWEN36_MOE = get_shape("qwen3.6-35b-a3b")


def folder_errors(model: LatencyModel, folder: Path, tp: int, layout: ExpertLayout):
    """Per step type, how the fitted B300 model prices the steps of one folder; and the
    table (its `estimated_ops` say what the roofline priced)."""
    t = table(model, QWEN36_MOE, tp, layout)
    steps = read_forward_pass_metrics(folder / STEPS)
    return phase_errors(steps, lambda s: price_step_s(t, s)), t


def with_gdn_tables(model: LatencyModel) -> LatencyModel:
    """`model` plus the installed package's B300 vLLM GDN core ops, fitted on their own."""
    samples = gdn_samples(locate_package().folder("b300_sxm"))
    gdn = fit_latency_model(samples, accelerator="b300", source="aic")
    return dataclasses.replace(model, ops={**model.ops, **gdn.ops})


# per step type: (median over folders, worst folder, median over the DP + EP runs)
PhaseFigures = dict[str, tuple[float, float, float]]


def report(routing: str, tables: str = "shared", gdn_tables: bool = False) -> PhaseFigures:
    model = fit_b300(routing, tables=tables)
    if gdn_tables:
        model = with_gdn_tables(model)
    cores = "measured GDN cores" if gdn_tables or tables == "package" else "estimated GDN cores"
    print(f"\n== {RELEASE.label}, Qwen3.6-35B-A3B bf16 on B300 ({tables} tables, {cores}), "
          f"MoE fitted on {routing} routing ({QWEN36_MOE.name}) ==")  # fmt: skip
    worst: dict[str, list[float]] = {}
    held: dict[str, list[float]] = {}
    for folder, tp, layout in moe_folders():
        if not (folder / STEPS).is_file():
            print(f" {folder.name}: no steps recorded")
            continue
        errors, t = folder_errors(model, folder, tp, layout)
        run = "dp+ep" if layout.dp > 1 else "tp/ep"
        print(
            f" {run} {folder.name} (tp {tp}, {layout.key or 'no EP'}): {summarize_phases(errors)}"
        )
        for e in errors:
            worst.setdefault(e.phase.value, []).append(e.median_abs_error)
            if layout.dp > 1:
                held.setdefault(e.phase.value, []).append(e.median_abs_error)
    print(f" roofline-priced: {', '.join(t.estimated_ops) or 'none'}")
    figures: PhaseFigures = {}
    for phase, values in worst.items():
        figures[phase] = (statistics.median(values), max(values), statistics.median(held[phase]))
        print(f"  {phase:8s} median over folders {figures[phase][0]:6.1%}, worst "
              f"{figures[phase][1]:6.1%}; over the DP + EP runs (out of the fit) "
              f"{figures[phase][2]:6.1%} (target <= 10%)")  # fmt: skip
    return figures


def side_by_side(figures: dict[tuple[str, str], PhaseFigures]) -> None:
    """Per routing and step type, each table source's figures (median |error| per folder:
    median over folders, worst, median over the DP + EP runs)."""
    sources = list(dict.fromkeys(src for _, src in figures))
    print("\nper step type, median |error| per folder: median over folders / worst / DP + EP")
    print(f"{'routing':18s}{'step':9s}" + "".join(f"{src + ' tables':>26s}" for src in sources))
    for routing in dict.fromkeys(r for r, _ in figures):
        phases = dict.fromkeys(p for src in sources for p in figures.get((routing, src), {}))
        for phase in phases:
            cells = [figures.get((routing, src), {}).get(phase) for src in sources]
            print(f"{routing:18s}{phase:9s}" + "".join(
                f"{c[0]:10.1%} /{c[1]:6.1%} /{c[2]:6.1%}" if c else f"{'-':>26s}" for c in cells
            ))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--routing", default="all", choices=[*MOE_DISTRIBUTIONS, "all"])
    parser.add_argument("--fit", action="store_true", help="print the fitted step constants")
    parser.add_argument(
        "--gdn-tables", action="store_true", help="price the GDN cores by the package's tables"
    )
    parser.add_argument("--tables", default="shared", choices=[*TABLES, "both"],
                        help="the B300 tables: the shared copy's, the installed package's, "
                        "or each side by side")  # fmt: skip
    parser.add_argument("--aic-package", dest="tables", action="store_const", const="package",
                        help="the installed aiconfigurator-core's B300 tables "
                        "(--tables package)")  # fmt: skip
    args = parser.parse_args()
    sources = TABLES if args.tables == "both" else (args.tables,)
    if args.fit:
        for src in sources:
            fitted = describe(fit_v1_async(fit_b300(tables=src)))
            print(f"fitted ({RELEASE.generation.title}, B300, {src} tables): {fitted}")
    figures: dict[tuple[str, str], PhaseFigures] = {}
    for routing in MOE_DISTRIBUTIONS if args.routing == "all" else (args.routing,):
        for src in sources:
            figures[routing, src] = report(routing, src, args.gdn_tables)
    if len(sources) > 1:
        side_by_side(figures)


if __name__ == "__main__":
    main()
