"""A `LatencySource`: compiled step latencies per (accelerator, TP degree).

Learned models come first; an accelerator without one gets the roofline
estimate (labelled as such, `is_estimate=True`) when the catalog allows it,
including any accelerator described by a spec file path. Everything is
compiled up front or on first request and kept in the catalog's own cache, so
a catalog can be pickled into simulator worker processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from optimizer.hardware import Accelerator, HardwareError, get_accelerator
from optimizer.latency.base import StepLatency
from optimizer.latency.compose import DEFAULT_OVERHEAD_S, Pricing
from optimizer.latency.model import LatencyModel
from optimizer.latency.roofline import ROOFLINE_LABEL, RooflineOptions, RooflinePricer
from optimizer.latency.table import CompiledStepLatency, TableGrid, compile_step_latency
from optimizer.shapes import ModelShape


def model_overhead_s(model: LatencyModel, overhead_s: float | None = None) -> float:
    """`overhead_s` when given, else the model's fitted overhead, else the default."""
    if overhead_s is not None:
        return overhead_s
    return DEFAULT_OVERHEAD_S if model.overhead_s is None else model.overhead_s


def compile_learned(
    shape: ModelShape,
    model: LatencyModel,
    tp: int,
    *,
    overhead_s: float | None = None,
    accelerator: Accelerator | None = None,
    grid: TableGrid | None = None,
) -> CompiledStepLatency:
    """Compile a fitted model for one shape and TP degree (roofline for uncovered ops).

    The per-iteration overhead is `overhead_s` when given, else the model's own
    (fitted on mixed iterations), else `DEFAULT_OVERHEAD_S`.
    """
    acc = accelerator or get_accelerator(model.accelerator)
    pricing = Pricing(shape, tp, RooflinePricer(acc), model)
    label = f"learned ({model.source})" if model.source else "learned"
    overhead = model_overhead_s(model, overhead_s)
    return compile_step_latency(pricing, overhead, label=label, is_estimate=False, grid=grid)


def compile_roofline(
    shape: ModelShape,
    accelerator: Accelerator,
    tp: int,
    *,
    options: RooflineOptions | None = None,
    grid: TableGrid | None = None,
) -> CompiledStepLatency:
    """The roofline estimate for one shape, accelerator and TP degree."""
    options = options or RooflineOptions()
    pricing = Pricing(shape, tp, RooflinePricer(accelerator, options))
    return compile_step_latency(
        pricing, options.overhead_s, label=ROOFLINE_LABEL, is_estimate=True, grid=grid
    )


@dataclass(frozen=True, slots=True)
class LatencyCatalog:
    """Implements `LatencySource` for one model shape."""

    shape: ModelShape
    compiled: dict[tuple[str, int], CompiledStepLatency] = field(default_factory=dict)
    allow_roofline: bool = True
    roofline_options: RooflineOptions = field(default_factory=RooflineOptions)
    _estimates: dict[tuple[str, int], CompiledStepLatency] = field(default_factory=dict)

    def available(self) -> list[tuple[str, int]]:
        return sorted(self.compiled)

    def for_instance(self, accelerator: str, tp: int) -> StepLatency:
        try:
            acc = get_accelerator(accelerator)
        except HardwareError as exc:
            raise LookupError(f"no latency model for accelerator {accelerator!r}: {exc}") from exc
        key = (acc.name, tp)
        if key in self.compiled:
            return self.compiled[key]
        if not self.allow_roofline:
            raise LookupError(
                f"no fitted latency model for {self.shape.name} on {acc.name} at tp={tp}; "
                f"available (accelerator, tp): {self.available()}; roofline fallback is off"
            )
        if tp < 1 or self.shape.num_heads % tp:
            raise LookupError(
                f"{self.shape.name}: tp={tp} must be >= 1 and divide num_heads "
                f"({self.shape.num_heads})"
            )
        if key not in self._estimates:
            self._estimates[key] = compile_roofline(
                self.shape, acc, tp, options=self.roofline_options
            )
        return self._estimates[key]


def build_catalog(
    shape: ModelShape,
    models: Sequence[LatencyModel],
    tps: Iterable[int] = (1, 2, 4, 8),
    *,
    overhead_s: float | None = None,
    allow_roofline: bool = True,
    grid: TableGrid | None = None,
) -> LatencyCatalog:
    """Compile every fitted model for each TP degree that divides the shape's heads
    (overhead: `overhead_s` for all when given, else each model's, see compile_learned)."""
    compiled: dict[tuple[str, int], CompiledStepLatency] = {}
    for model in models:
        acc = get_accelerator(model.accelerator)
        for tp in tps:
            if shape.num_heads % tp == 0:
                compiled[(acc.name, tp)] = compile_learned(
                    shape, model, tp, overhead_s=overhead_s, accelerator=acc, grid=grid
                )
    return LatencyCatalog(shape, compiled, allow_roofline)
