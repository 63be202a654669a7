"""A `LatencySource`: compiled step latencies per (accelerator, TP degree), made on demand.

Learned models come first; an accelerator without one gets the roofline
estimate (labelled as such, `is_estimate=True`) when the catalog allows it,
including any accelerator described by a spec file path.

Nothing is compiled until a run asks for an (accelerator, TP) pair, and then
only the part of the grid its loads can reach (`TableReach`; a later, larger
reach compiles the next tier). A fitted model is loaded only when one of its
tables must be compiled (`ModelRef.load`: unpickling a model imports
scikit-learn), and a `TableStore` (the database, see `api.services.latency`)
keeps compiled tables across processes and machines, keyed by everything a
table's numbers depend on: the fitted model, the shape, the accelerator, the TP
degree, the MoE layout (`ExpertLayout`: one table per layout), the grid tier, the
engine release's generation with its step rules and overheads, and the version of
the pricing code itself (`pricing_version`: a hash of the modules that turn a model
into a table), so a table compiled by another build, or for another engine, is never
used.

Each table is priced as the engine release asked for (`optimizer.engines`): its
step rules (which operators fuse, vLLM's all-reduce, CUDA-graph padding) and its
overhead, from the kernel tables of that engine where a model was fitted on them
(`model_key`: SGLang's AIConfigurator tables price an SGLang deployment), else from
vLLM's (or a profiler's, of no engine), the table's label saying so. A model fitted
on its own whole-step measurements (the CPU profiler's mixed iterations, on
servetune's reference engine) keeps its own constant and the reference engine's
(legacy) rules instead.
Compilation runs scikit-learn's predictions under `num_threads` native threads
(OpenMP): more oversubscribes a shared 2-core machine badly, and the results are
identical. A catalog can be pickled into simulator worker processes (its store
reconnects there).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from optimizer.engines import (
    DEFAULT_RELEASE,
    ENGINES,
    EngineOverhead,
    EngineRelease,
)
from optimizer.hardware import Accelerator, HardwareError, get_accelerator
from optimizer.latency.base import StepLatency, TableReach
from optimizer.latency.compile import (  # StepPricing, step_pricing: re-exported
    StepPricing,  # noqa: F401
    compile_learned,
    compile_roofline,
    step_pricing,  # noqa: F401
)
from optimizer.latency.model import LatencyModel
from optimizer.latency.moe import check_layout
from optimizer.latency.roofline import RooflineOptions
from optimizer.latency.table import CompiledStepLatency, TableGrid
from optimizer.latency.table_bytes import TABLE_FORMAT
from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.shapes import DEFAULT_PRECISION, ModelShape, Precision

# The modules whose code turns a fitted model (or an accelerator's spec) into a table.
PRICING_MODULES = (
    "optimizer.dims",
    "optimizer.engines",
    "optimizer.latency.compile",
    "optimizer.latency.compose",
    "optimizer.latency.dsa",
    "optimizer.latency.dsa_module",
    "optimizer.latency.features",
    "optimizer.latency.gdn",
    "optimizer.latency.gdn_module",
    "optimizer.latency.iterations",
    "optimizer.latency.launches",
    "optimizer.latency.mla",
    "optimizer.latency.model",
    "optimizer.latency.moe",
    "optimizer.latency.roofline",
    "optimizer.latency.table",
    "optimizer.latency.table_bytes",
    "optimizer.parallel",
)


@functools.cache
def pricing_version() -> str:
    """A hash of the pricing code (`PRICING_MODULES`' source): part of every stored table's
    key, so a table compiled by another build of servetune is never read back."""
    digest = hashlib.sha256()
    for name in PRICING_MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        digest.update(Path(spec.origin).read_bytes())
    return digest.hexdigest()[:12]


class ModelRef(Protocol):
    """A fitted latency model the catalog may compile, loaded only when it must be."""

    @property
    def accelerator(self) -> str: ...

    @property
    def tables_engine(self) -> str:
        """Whose kernel tables it was fitted on ("vllm", "sglang", ...; "" for none's)."""
        ...

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
    tables_engine: str = ""  # whose kernel tables it was fitted on ("" for none's)

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


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}


def model_key(accelerator: str, engine: str) -> str:
    """A fitted model's key in `LatencyCatalog.models`: the accelerator for a model of
    vLLM's tables or of no engine's (they price vLLM, and every engine without tables of
    its own), "<accelerator>@<engine>" for one of another engine's tables."""
    return accelerator if engine in ("", "vllm") else f"{accelerator}@{engine}"


@dataclass(frozen=True, slots=True)
class ChosenModel:
    """The fitted model that prices an (accelerator, engine) and whose tables it holds."""

    key: str  # in `LatencyCatalog.models`
    ref: ModelRef
    fallback: bool  # the engine has no tables here: vLLM's (or no engine's) price it

    def note(self, acc: Accelerator, engine: EngineRelease) -> str:
        """Whose tables price it, e.g. "SGLang's tables" or "vLLM's tables: no SGLang
        tables for h100"."""
        whose = ENGINE_NAMES.get(self.ref.tables_engine, "")
        tables = f"{whose}'s tables" if whose else "tables of no serving engine"
        if not self.fallback:
            return tables
        return f"{tables}: no {ENGINE_NAMES[engine.engine]} tables for {acc.name}"


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
    _compiled: dict[tuple[str, int, Precision, str, ExpertLayout], CompiledStepLatency] = field(
        default_factory=dict
    )
    _loaded: dict[str, LatencyModel] = field(default_factory=dict)

    def available(self) -> list[str]:
        return sorted(self.models)

    def _ref(self, acc: Accelerator, engine: EngineRelease = DEFAULT_RELEASE) -> ModelRef | None:
        chosen = self.choose(acc, engine)
        return None if chosen is None else chosen.ref

    def choose(
        self, acc: Accelerator, engine: EngineRelease = DEFAULT_RELEASE
    ) -> ChosenModel | None:
        """The model fitted on this accelerator, else on its chip (an A100 40 GB is priced by
        an A100's model; GH200 by the H100's), on `engine`'s tables where there is one, else
        on vLLM's (or on no engine's); None: the roofline prices it."""
        own = (model_key(acc.name, engine.engine), model_key(acc.family, engine.engine))
        vllm = (acc.name, acc.family) if engine.engine != "vllm" else ()
        for keys, fallback in ((own, False), (vllm, True)):
            for key in keys:
                ref = self.models.get(key)
                if ref is not None:
                    return ChosenModel(key, ref, fallback)
        return None

    def for_instance(
        self,
        accelerator: str,
        tp: int,
        reach: TableReach | None = None,
        precision: Precision = DEFAULT_PRECISION,
        engine: EngineRelease = DEFAULT_RELEASE,
        layout: ExpertLayout = DENSE_LAYOUT,
    ) -> StepLatency:
        """The compiled table of `accelerator` at `tp` and `layout` for the catalog's shape
        in `precision`, priced as `engine` runs it, covering `reach` (None: the catalog's
        default grid, the full one unless set); LookupError when none can be made (a
        layout that does not fit the shape included)."""
        try:
            acc = get_accelerator(accelerator)
        except HardwareError as exc:
            raise LookupError(f"no latency model for accelerator {accelerator!r}: {exc}") from exc
        if self._ref(acc, engine) is None and not self.allow_roofline:
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
        try:
            check_layout(self.shape, tp, layout)
        except ValueError as exc:
            raise LookupError(str(exc)) from exc
        return self.table(acc, tp, grid, precision, engine, layout)

    def table(
        self,
        acc: Accelerator,
        tp: int,
        grid: TableGrid,
        precision: Precision = DEFAULT_PRECISION,
        engine: EngineRelease = DEFAULT_RELEASE,
        layout: ExpertLayout = DENSE_LAYOUT,
    ) -> CompiledStepLatency:
        """The table of (`acc`, `tp`, `precision`, `engine`, `layout`) on at least `grid`
        (compiled, stored or kept): one table per layout."""
        key = (acc.name, tp, precision, engine.key, layout)
        have = self._compiled.get(key)
        if have is not None:
            if have.grid.union(grid) == have.grid:
                return have
            grid = grid.union(have.grid)  # grow: the tables only get larger
        table = self._make(acc, tp, grid, self.shape.with_precision(precision), engine, layout)
        self._compiled[key] = table
        return table

    def store_key(
        self,
        ref: ModelRef | None,
        acc: Accelerator,
        tp: int,
        grid: TableGrid,
        shape: ModelShape,
        engine: EngineRelease = DEFAULT_RELEASE,
        layout: ExpertLayout = DENSE_LAYOUT,
    ) -> str:
        """The table's key in the store ("" = not stored: an in-memory model): everything
        its numbers depend on (module docstring), the MoE layout included (a dense
        layout's key has no layout part, as before layouts existed)."""
        if ref is None:
            source = (
                f"roofline-{hashlib.sha256(repr(self.roofline_options).encode()).hexdigest()[:12]}"
            )
        elif ref.cache_key:
            source = ref.cache_key
        else:
            return ""
        override = "engine" if self.overhead is None else repr(astuple(self.overhead))
        pricing = hashlib.sha256(f"{engine.key}|{override}".encode()).hexdigest()[:12]
        spec = hashlib.sha256(repr(astuple(acc)).encode()).hexdigest()[:12]  # a spec file's
        parts = [
            f"table-v{TABLE_FORMAT}-{pricing_version()}", source,
            f"{engine.generation.key}-{pricing}", shape.name, shape_fingerprint(shape),
            f"{acc.name}-{spec}", f"tp{tp}", grid.tier,
        ]  # fmt: skip
        if layout != DENSE_LAYOUT:
            parts.append(f"layout-{layout.key}")
        return "|".join(parts)

    def _make(
        self,
        acc: Accelerator,
        tp: int,
        grid: TableGrid,
        shape: ModelShape,
        engine: EngineRelease = DEFAULT_RELEASE,
        layout: ExpertLayout = DENSE_LAYOUT,
    ) -> CompiledStepLatency:
        chosen = self.choose(acc, engine)
        ref = None if chosen is None else chosen.ref
        store_key = ""
        if self.store is not None:
            store_key = self.store_key(ref, acc, tp, grid, shape, engine, layout)
        if store_key and self.store is not None:
            cached = self.store.get(store_key)
            if cached is not None:
                return cached
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=self.num_threads):
            if ref is None:
                options = self.roofline_options
                if self.overhead is not None:
                    options = replace(options, overhead=self.overhead)
                table = compile_roofline(
                    shape, acc, tp, options=options, grid=grid, engine=engine, layout=layout
                )
            else:
                model = self._loaded.get(chosen.key)
                if model is None:
                    model = self._loaded[chosen.key] = ref.load()
                table = compile_learned(
                    shape, model, tp, engine=engine, overhead=self.overhead, accelerator=acc,
                    grid=grid, layout=layout,
                )  # fmt: skip
                if engine.engine != "vllm":  # whose tables price another engine
                    table = replace(table, label=f"{table.label}, {chosen.note(acc, engine)}")
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
    Overhead: `overhead` for all when given, else each release's (see `step_pricing`)."""
    refs: dict[str, ModelRef] = {}
    for m in models:
        ref = LoadedModel(m) if isinstance(m, LatencyModel) else m
        refs[model_key(get_accelerator(ref.accelerator).name, ref.tables_engine)] = ref
    catalog = LatencyCatalog(
        shape, refs, allow_roofline, store=store, num_threads=num_threads, overhead=overhead,
        default_grid=grid or TableGrid(),
    )  # fmt: skip
    for ref in refs.values():
        if ref.tables_engine not in ("", *ENGINES):
            continue  # tables of an engine servetune does not price (TensorRT-LLM's)
        release = EngineRelease.of(ref.tables_engine or "vllm", None)
        for tp in tps:
            if shape.num_heads % tp == 0:
                acc = get_accelerator(ref.accelerator)
                catalog.table(acc, tp, catalog.default_grid, engine=release)
    return catalog
