"""The per-step check on the measured MoE steps (issue 27): vLLM 0.20.1 (V1, async
scheduling) serving Qwen/Qwen3.6-35B-A3B bf16 on B300 (observations/aic-fpm-b300; the
shared data README says what `latency_ms` is), each step priced as the simulator prices
it with the B300 tables (the per-step check of `benchmarks/bench_devset.py`, mirrored:
the same reader, step pricing and error summary). Usage:

    .venv/bin/python benchmarks/bench_moe_steps.py [--routing DISTRIBUTION|all]

Runs: `fpm_upfront_qwen36_moe_full_once_*` (TP 1/2/4/8 without EP, `tpN_ep1`, and with
--enable-expert-parallel, `tpN_epN`; tp8_ep1 recorded no steps) and
`fpm_gap_qwen36_dp_ep_official_*` (--data-parallel-size dp with EP over tp x dp GPUs,
`tpT_epE`: dp = E / T; rank 0's steps). Budget: 8,192 batched tokens (the README).

The model's dimensions are not in the run's files (vllm_metadata.json names the
checkpoint and the architecture, Qwen3_5MoeForConditionalGeneration); the shape priced is
`QWEN36_MOE` below, Qwen3.5/3.6-35B-A3B's text model as published: 40 layers of hidden
2048, 256 routed experts of 512 (top 8) plus one shared expert of 512 in every layer,
vocabulary 248,320. Its attention is hybrid: every fourth layer is gated full attention
(16 query heads, 2 KV heads of 256), the other 30 are Gated DeltaNet (linear attention
with a recurrent state), which servetune has no operator for. They are priced as
sliding-window attention over the last `DELTANET_WINDOW` keys: the window whose KV bytes
equal the DeltaNet state a decode step reads (32 heads x 128 x 128 bf16 = 1 MiB per layer
and sequence; 2 KiB of KV per token and layer), an approximation stated here, not
measured. Their projections are priced as the full-attention layers' (narrower than
DeltaNet's), their convolution and gating not at all.

Routing: AIConfigurator measured the fused MoE with balanced routing and two power-law
skews; the import keeps power_law_1.01, AIConfigurator's own default. `--routing` picks
which rows the MoE op is fitted on (all: one report each), to show how far routing skew
moves the steps.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator
from pathlib import Path

from bench_common import AICONFIGURATOR, SHARED

from optimizer.engines import EngineRelease
from optimizer.latency import TableReach, build_catalog, fit_latency_model
from optimizer.latency.model import FitOptions, LatencyModel
from optimizer.parallel import ExpertLayout
from optimizer.records import OpKind
from optimizer.shape_parts import MoESpec
from optimizer.shapes import DEFAULT_PRECISION, ModelShape
from optimizer.validation.forward_passes import (
    PhaseError,
    phase_errors,
    price_step_s,
    read_forward_pass_metrics,
    summarize_phases,
)
from profiler.importers.aiconfigurator_moe import DEFAULT_MOE_DISTRIBUTION, MOE_DISTRIBUTIONS

RUNS = SHARED / "observations" / "aic-fpm-b300"
UPFRONT = RUNS / "fpm_upfront_qwen36_moe_full_once_20260613_201336"
DP_EP = RUNS / "fpm_gap_qwen36_dp_ep_official_20260614_025420"
RELEASE = EngineRelease("vllm", "0.20.1")
REACH = TableReach(8192, 256, 8192, 32768)
DELTANET_WINDOW = 512  # KV tokens of bytes equal to one DeltaNet layer's decode state
QWEN36_MOE = ModelShape(
    "qwen3.6-35b-a3b-hybrid-approx", 40, 2048, 16, 2, 256, 512, 248320,
    moe=MoESpec(256, 8, 512, shared_intermediate_size=512),
    sliding_window=DELTANET_WINDOW, sliding_window_layers=30,
)  # fmt: skip


def folders() -> Iterator[tuple[Path, int, ExpertLayout]]:
    """(folder, tp, layout) of every MoE run that recorded steps."""
    for d in sorted(UPFRONT.glob("tp*_ep*_past4096")):
        tp, ep = (int(x) for x in d.name.removeprefix("tp").split("_past")[0].split("_ep"))
        yield d, tp, ExpertLayout(1, ep > 1)
    for d in sorted(DP_EP.glob("tp*_dp_ep/tp*_ep*_past4096")):
        tp, ep = (int(x) for x in d.name.removeprefix("tp").split("_past")[0].split("_ep"))
        yield d, tp, ExpertLayout(ep // tp, True)


def fit_b300(routing: str = DEFAULT_MOE_DISTRIBUTION, max_iter: int = 100) -> LatencyModel:
    """The B300 tables fitted as `servetune profile import` + fit does, the MoE op on
    `routing`'s rows."""
    from profiler.importers import ImportFormat, import_profile
    from profiler.importers.aiconfigurator_moe import moe_samples

    folder = AICONFIGURATOR / "b300_sxm"
    samples = import_profile(folder, ImportFormat.AICONFIGURATOR).samples
    if routing != DEFAULT_MOE_DISTRIBUTION:
        samples = [s for s in samples if s.op is not OpKind.MOE] + moe_samples(folder, routing)
    return fit_latency_model(samples, accelerator="b300", options=FitOptions(max_iter=max_iter))


def folder_errors(model: LatencyModel, folder: Path, tp: int, layout: ExpertLayout):
    """Per step type, how the fitted B300 model prices the steps of one folder; and the
    table (its `estimated_ops` say what the roofline priced)."""
    table = build_catalog(QWEN36_MOE, [model]).for_instance(
        "b300", tp, REACH, DEFAULT_PRECISION, engine=RELEASE, layout=layout
    )
    steps = read_forward_pass_metrics(folder / "fpm_metrics_detail.csv")
    return phase_errors(steps, lambda s: price_step_s(table, s)), table


def report(routing: str) -> None:
    model = fit_b300(routing)
    print(f"\n== {RELEASE.label}, Qwen3.6-35B-A3B bf16 on B300, MoE fitted on {routing} "
          f"routing ({QWEN36_MOE.name}) ==")  # fmt: skip
    worst: dict[str, list[float]] = {}
    for folder, tp, layout in folders():
        if not (folder / "fpm_metrics_detail.csv").is_file():
            print(f" {folder.name}: no steps recorded")
            continue
        errors, table = folder_errors(model, folder, tp, layout)
        run = "dp+ep" if layout.dp > 1 else "tp/ep"
        print(
            f" {run} {folder.name} (tp {tp}, {layout.key or 'no EP'}): {summarize_phases(errors)}"
        )
        for e in errors:
            worst.setdefault(e.phase.value, []).append(e.median_abs_error)
    print(f" roofline-priced: {', '.join(table.estimated_ops) or 'none'}")
    for phase, values in worst.items():
        print(f"  {phase:8s} median over folders {statistics.median(values):6.1%}, worst "
              f"{max(values):6.1%} (target <= 10%)")  # fmt: skip


def _by_phase(errors: list[PhaseError]) -> dict[str, float]:
    return {e.phase.value: e.median_abs_error for e in errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--routing", default="all", choices=[*MOE_DISTRIBUTIONS, "all"])
    args = parser.parse_args()
    for routing in MOE_DISTRIBUTIONS if args.routing == "all" else (args.routing,):
        report(routing)


if __name__ == "__main__":
    main()
