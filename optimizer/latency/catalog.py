"""A `LatencySource`: compiled step latencies per (accelerator, TP degree), made on demand.

Learned models come first; an accelerator without one gets the roofline
estimate (labelled as such, `is_estimate=True`) when the catalog allows it,
including any accelerator described by a spec file path.

Nothing is compiled until a run asks for an (accelerator, TP) pair, and then
only the part of the grid its loads can reach (`TableReach`; a later, larger
reach compiles the next tier). A fitted model is loaded only when one of its
tables must be compiled (`ModelRef.load`: unpickling a model imports
scikit-learn), and a `TableStore` (the database, see `api.services.latency`)
keeps compiled tables across processes and machines, keyed by the fitted
model, the shape, the accelerator, the TP degree and the grid tier.
Compilation runs scikit-learn's predictions under `num_threads` native threads
(OpenMP): more oversubscribes a shared 2-core machine badly, and the results are
identical. A catalog can be pickled into simulator worker processes (its store
reconnects there).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, field
from typing import Protocol

from optimizer.hardware import Accelerator, HardwareError, get_accelerator
from optimizer.latency.base import StepLatency, TableReach
from optimizer.latency.compose import Pricing
from optimizer.latency.model import LatencyModel
from optimizer.latency.overhead import DEFAULT_ENGINE_OVERHEAD, EngineOverhead
from optimizer.latency.roofline import ROOFLINE_LABEL, RooflineOptions, RooflinePricer
from optimizer.latency.table import (
    TABLE_FORMAT,
    CompiledStepLatency,
    TableGrid,
    compile_step_latency,
)
from optimizer.shapes import DEFAULT_PRECISION, ModelShape, Precision


def model_overhead(model: LatencyModel, overhead: EngineOverhead | None = None) -> EngineOverhead:
    """`overhead` when given, else the model's own fitted constant (whole-step
    measurements), else `DEFAULT_ENGINE_OVERHEAD` (calibrated on measured vLLM runs)."""
    if overhead is not None:
        return overhead
    if model.overhead_s is None:
        return DEFAULT_ENGINE_OVERHEAD
    return EngineOverhead.constant(model.overhead_s)


def compile_learned(
    shape: ModelShape,
    model: LatencyModel,
    tp: int,
    *,
    overhead: EngineOverhead | None = None,
    accelerator: Accelerator | None = None,
    grid: TableGrid | None = None,
) -> CompiledStepLatency:
    """Compile a fitted model for one shape and TP degree (roofline for uncovered ops),
    with the engine overhead of `model_overhead`."""
    acc = accelerator or get_accelerator(model.accelerator)
    pricing = Pricing(shape, tp, RooflinePricer(acc), model)
    label = f"learned ({model.source})" if model.source else "learned"
    return compile_step_latency(
        pricing, model_overhead(model, overhead), label=label, is_estimate=False, grid=grid
    )


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
        pricing, options.overhead, label=ROOFLINE_LABEL, is_estimate=True, grid=grid
    )


class ModelRef(Protocol):
    """A fitted latency model the catalog may compile, loaded only when it must be."""

    @property
    def accelerator(self) -> str: ...

    @property
    def cache_key(self) -> str:
        """Identifies the fitted model for the table store ("" = do not store)."""
        ...

    def load(self) -> LatencyModel: ...


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A `ModelRef` for a model already in memory (never stored: no identity to key by)."""

    model: LatencyModel
    cache_key: str = ""

    @property
    def accelerator(self) -> str:
        return self.model.accelerator

    def load(self) -> LatencyModel:
        return self.model


class TableStore(Protocol):
    """Compiled tables kept between processes (safe for concurrent writers)."""

    def get(self, key: str) -> CompiledStepLatency | None: ...

    def put(self, key: str, table: CompiledStepLatency, model_key: str) -> None:
        """Keep `table` under `key`; `model_key` is its model's `ModelRef.cache_key`
        ("" for the roofline), so a store can drop a model's tables with the model."""
        ...


def shape_fingerprint(shape: ModelShape) -> str:
    """The shape's dimensions as a short hash (a config.json path may reuse a name)."""
    return hashlib.sha256(repr(astuple(shape)).encode()).hexdigest()[:16]


@dataclass(slots=True)
class LatencyCatalog:
    """Implements `LatencySource` for one model shape (see the module docstring)."""

    shape: ModelShape
    models: dict[str, ModelRef] = field(default_factory=dict)  # by accelerator preset name
    allow_roofline: bool = True
    roofline_options: RooflineOptions = field(default_factory=RooflineOptions)
    store: TableStore | None = None
    num_threads: int = 1  # native (OpenMP) threads while compiling
    overhead: EngineOverhead | None = None  # for every learned table, instead of each model's
    default_grid: TableGrid = field(default_factory=TableGrid)  # when a run names no reach
    _compiled: dict[tuple[str, int, Precision], CompiledStepLatency] = field(default_factory=dict)
    _loaded: dict[str, LatencyModel] = field(default_factory=dict)

    def available(self) -> list[str]:
        return sorted(self.models)

    def _ref(self, acc: Accelerator) -> ModelRef | None:
        """The model fitted on this accelerator, else on its chip (an A100 40 GB is priced by
        an A100's model; GH200 by the H100's)."""
        return self.models.get(acc.name) or self.models.get(acc.family)

    def for_instance(
        self,
        accelerator: str,
        tp: int,
        reach: TableReach | None = None,
        precision: Precision = DEFAULT_PRECISION,
    ) -> StepLatency:
        """The compiled table of `accelerator` at `tp` for the catalog's shape in
        `precision`, covering `reach` (None: the catalog's default grid, the full one
        unless set); LookupError when none can be made."""
        try:
            acc = get_accelerator(accelerator)
        except HardwareError as exc:
            raise LookupError(f"no latency model for accelerator {accelerator!r}: {exc}") from exc
        if self._ref(acc) is None and not self.allow_roofline:
            raise LookupError(
                f"no fitted latency model for {self.shape.name} on {acc.name} at tp={tp}; "
                f"fitted for: {self.available()}; roofline fallback is off"
            )
        if tp < 1 or self.shape.num_heads % tp:
            raise LookupError(
                f"{self.shape.name}: tp={tp} must be >= 1 and divide num_heads "
                f"({self.shape.num_heads})"
            )
        grid = self.default_grid if reach is None else TableGrid.covering(reach)
        return self.table(acc, tp, grid, precision)

    def table(
        self,
        acc: Accelerator,
        tp: int,
        grid: TableGrid,
        precision: Precision = DEFAULT_PRECISION,
    ) -> CompiledStepLatency:
        """The table of (`acc`, `tp`, `precision`) on at least `grid` (compiled, stored or
        kept)."""
        key = (acc.name, tp, precision)
        have = self._compiled.get(key)
        if have is not None:
            if have.grid.union(grid) == have.grid:
                return have
            grid = grid.union(have.grid)  # grow: the tables only get larger
        table = self._make(acc, tp, grid, self.shape.with_precision(precision))
        self._compiled[key] = table
        return table

    def _store_key(
        self, ref: ModelRef | None, acc: Accelerator, tp: int, grid: TableGrid, shape: ModelShape
    ) -> str:
        """The table's key in the store ("" = not stored: an in-memory model)."""
        if ref is None:
            source = (
                f"roofline-{hashlib.sha256(repr(self.roofline_options).encode()).hexdigest()[:12]}"
            )
        elif ref.cache_key:
            overhead = "model" if self.overhead is None else repr(astuple(self.overhead))
            source = f"{ref.cache_key}-overhead-{overhead}"
        else:
            return ""
        spec = hashlib.sha256(repr(astuple(acc)).encode()).hexdigest()[:12]  # a spec file's
        return "|".join((
            f"table-v{TABLE_FORMAT}", source, shape.name, shape_fingerprint(shape),
            f"{acc.name}-{spec}", f"tp{tp}", grid.tier,
        ))  # fmt: skip

    def _make(
        self, acc: Accelerator, tp: int, grid: TableGrid, shape: ModelShape
    ) -> CompiledStepLatency:
        ref = self._ref(acc)
        store_key = self._store_key(ref, acc, tp, grid, shape) if self.store is not None else ""
        if store_key and self.store is not None:
            cached = self.store.get(store_key)
            if cached is not None:
                return cached
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=self.num_threads):
            if ref is None:
                table = compile_roofline(shape, acc, tp, options=self.roofline_options, grid=grid)
            else:
                owner = acc.name if acc.name in self.models else acc.family
                model = self._loaded.get(owner)
                if model is None:
                    model = self._loaded[owner] = ref.load()
                table = compile_learned(
                    shape, model, tp, overhead=self.overhead, accelerator=acc, grid=grid
                )
        if store_key and self.store is not None:
            self.store.put(store_key, table, ref.cache_key if ref is not None else "")
        return table


def build_catalog(
    shape: ModelShape,
    models: Sequence[LatencyModel | ModelRef],
    tps: Iterable[int] = (),
    *,
    overhead: EngineOverhead | None = None,
    allow_roofline: bool = True,
    grid: TableGrid | None = None,
    store: TableStore | None = None,
    num_threads: int = 1,
) -> LatencyCatalog:
    """A catalog of fitted `models` (one per accelerator) for `shape`. Tables compile on
    first use; `tps` compiles those TP degrees now, on `grid` (default: the full grid).
    Overhead: `overhead` for all when given, else each model's (see `model_overhead`)."""
    refs: dict[str, ModelRef] = {}
    for m in models:
        ref = LoadedModel(m) if isinstance(m, LatencyModel) else m
        refs[get_accelerator(ref.accelerator).name] = ref
    catalog = LatencyCatalog(
        shape, refs, allow_roofline, store=store, num_threads=num_threads, overhead=overhead,
        default_grid=grid or TableGrid(),
    )  # fmt: skip
    for acc in refs:
        for tp in tps:
            if shape.num_heads % tp == 0:
                catalog.table(get_accelerator(acc), tp, catalog.default_grid)
    return catalog
