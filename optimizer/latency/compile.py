"""Turning a fitted model, or an accelerator's spec, into one compiled table: how a step
is priced beyond its operators (`step_pricing`: the engine release's rules, kernel scale
and overheads) and the two compilers the catalog calls (`compile_learned`,
`compile_roofline`). Torch-free; predicting calls scikit-learn.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

from optimizer.engines import (
    DEFAULT_RELEASE,
    LEGACY_RULES,
    NO_OVERHEAD,
    EngineOverhead,
    EngineRelease,
    StepRules,
)
from optimizer.hardware import Accelerator, get_accelerator
from optimizer.latency.compose import Pricing
from optimizer.latency.launches import HostFloor, host_floor
from optimizer.latency.model import LatencyModel
from optimizer.latency.roofline import ROOFLINE_LABEL, RooflineOptions, RooflinePricer
from optimizer.latency.table import CompiledStepLatency, TableGrid, compile_step_latency
from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.shapes import ModelShape


@dataclass(frozen=True, slots=True)
class StepPricing:
    """How one table prices steps beyond its operators' isolated timings: the step rules,
    the kernels' scale in a sustained forward, the overhead the GPU waits for, the CPU
    work hidden behind the GPU (async scheduling), and the engine's name."""

    rules: StepRules
    kernel_scale: float
    overhead: EngineOverhead
    hidden: EngineOverhead
    engine: str
    host_launch_s: float = 0.0  # the host's time per launch outside CUDA graphs


def step_pricing(
    model: LatencyModel | None,
    engine: EngineRelease = DEFAULT_RELEASE,
    overhead: EngineOverhead | None = None,
    accelerator: Accelerator | None = None,
) -> StepPricing:
    """How a table of `model` prices steps. A model with its own whole-step measurements
    (servetune's reference engine) keeps the legacy rules and its fitted constant and
    scale; any other is priced as the engine release runs a step (`optimizer.engines`):
    a synchronous engine's CPU work adds to each step, an asynchronous one's bounds it
    below; a forward lasts at least its launches outside CUDA graphs at the generation's
    `host_launch_s`. `overhead`, when given, replaces both (nothing hidden)."""
    if model is not None and model.overhead_s is not None:
        own = EngineOverhead.constant(model.overhead_s) if overhead is None else overhead
        return StepPricing(LEGACY_RULES, 1.0, own, NO_OVERHEAD, "servetune reference engine")
    g = engine.generation
    scale = g.kernel_scale(accelerator.family) if accelerator is not None else 1.0
    host = g.host_launch_s
    if overhead is not None:
        return StepPricing(engine.rules, scale, overhead, NO_OVERHEAD, engine.label, host)
    if g.async_scheduling:
        return StepPricing(engine.rules, scale, g.overhead, g.cpu, engine.label, host)
    exposed = EngineOverhead(*(a + b for a, b in zip(astuple(g.overhead), astuple(g.cpu),
                                                     strict=True)))  # fmt: skip
    return StepPricing(engine.rules, scale, exposed, NO_OVERHEAD, engine.label, host)


def compile_learned(
    shape: ModelShape,
    model: LatencyModel,
    tp: int,
    *,
    engine: EngineRelease = DEFAULT_RELEASE,
    overhead: EngineOverhead | None = None,
    accelerator: Accelerator | None = None,
    grid: TableGrid | None = None,
    layout: ExpertLayout = DENSE_LAYOUT,
) -> CompiledStepLatency:
    """Compile a fitted model for one shape, TP degree and MoE layout (roofline for
    uncovered ops), priced as `engine` runs a step (`step_pricing`)."""
    acc = accelerator or get_accelerator(model.accelerator)
    how = step_pricing(model, engine, overhead, acc)
    pricing = Pricing(
        shape, tp, RooflinePricer(acc), model, how.rules, how.kernel_scale, layout=layout
    )
    label = f"learned ({model.source})" if model.source else "learned"
    return compile_step_latency(
        pricing, how.overhead, label=label, is_estimate=False, grid=grid, hidden=how.hidden,
        engine=how.engine, host=_host(pricing, how),
    )  # fmt: skip


def compile_roofline(
    shape: ModelShape,
    accelerator: Accelerator,
    tp: int,
    *,
    options: RooflineOptions | None = None,
    grid: TableGrid | None = None,
    engine: EngineRelease = DEFAULT_RELEASE,
    layout: ExpertLayout = DENSE_LAYOUT,
) -> CompiledStepLatency:
    """The roofline estimate for one shape, accelerator, TP degree and MoE layout, priced
    as `engine` runs a step (its overheads unless `options.overhead` names one)."""
    options = options or RooflineOptions()
    how = step_pricing(None, engine, options.overhead, accelerator)
    pricing = Pricing(
        shape, tp, RooflinePricer(accelerator, options), rules=how.rules,
        kernel_scale=how.kernel_scale, layout=layout,
    )  # fmt: skip
    return compile_step_latency(
        pricing, how.overhead, label=ROOFLINE_LABEL, is_estimate=True, grid=grid,
        hidden=how.hidden, engine=how.engine, host=_host(pricing, how),
    )  # fmt: skip


def _host(pricing: Pricing, how: StepPricing) -> HostFloor:
    return host_floor(pricing.shape, pricing.tp, pricing.layout, how.rules, how.host_launch_s,
                      pricing.all2all)  # fmt: skip
