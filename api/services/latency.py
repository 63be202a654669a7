"""Which latency model prices a run: stored fitted models first, else the roofline.

`resolve_latency(session, model)` builds the `LatencySource` every command and
job uses: for each accelerator and engine with a stored fitted latency model, the
newest one (or the ids the caller names) for the model shape. A deployment is priced
by its engine's tables, else vLLM's (`optimizer.latency.catalog.model_key`); any
other accelerator falls back to the roofline estimate, labelled as such. Stored calibrations
(fitted on observed runs by `servetune calibrate`) of whatever prices an
accelerator are applied on top.

It only reads which models exist: the catalog compiles a table when a run first
needs one (accelerator, TP), over what the run can reach, in no transaction of
the caller's. Compiled tables are kept in the database (`storage.latency_tables`,
`DatabaseTableStore`), so a later process, or another machine on the same
PostgreSQL, neither compiles them again nor loads the fitted model (unpickling
one imports scikit-learn); calibrations apply on top of the tables at run time,
so changing one needs no recompilation.

`fit_and_store(session, profile_run_id)` turns a stored profile run into a
stored latency model: fit, hold-out metrics, save.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from optimizer.engines import ENGINES, EngineOverhead, EngineRelease
from optimizer.hardware import HardwareError, get_accelerator
from optimizer.latency.base import LatencySource
from optimizer.latency.catalog import ENGINE_NAMES, LatencyCatalog, model_key
from optimizer.latency.evaluate import evaluate_holdout
from optimizer.latency.fit import fit_latency_model
from optimizer.latency.model import FitOptions, LatencyModel, LatencyModelError
from optimizer.latency.persist import PAYLOAD_SCHEMA_VERSION, dump_model, feature_names, load_model
from optimizer.latency.table import CompiledStepLatency
from optimizer.latency.table_bytes import table_from_bytes, table_to_bytes
from optimizer.records import OpKind
from optimizer.shapes import ModelShape, get_shape
from optimizer.validation.api import calibrated_source
from storage.latency_models import (
    LatencyModelInfo,
    get_latency_model,
    list_latency_models,
    load_latency_payload,
    save_latency_model,
)
from storage.profiles import get_profile_run, load_samples
from storage.validation import CalibrationRecord, latest_calibrations

# A stage of fit_and_store, for a progress display.
FitProgress = Callable[[str], None]

ROOFLINE_ONLY = "roofline estimate (accelerator specs)"
PRICED_ENGINES = ("", *ENGINES)  # tables of these engines price deployments


def _url_of(session: Session) -> str:
    return session.get_bind().url.render_as_string(hide_password=False)


class _EngineHolder:
    """A database engine made on first use and left out of pickles (made again there)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._engine = None

    @property
    def engine(self):
        if self._engine is None:
            from storage.db import make_engine

            self._engine = make_engine(self.database_url)
        return self._engine

    def __getstate__(self) -> dict:
        return {"database_url": self.database_url}

    def __setstate__(self, state: dict) -> None:
        self.database_url = state["database_url"]
        self._engine = None


class StoredModel(_EngineHolder):
    """A `ModelRef` to a stored fitted model: its payload is read and unpickled only when a
    table of it must be compiled."""

    def __init__(self, database_url: str, info: LatencyModelInfo) -> None:
        super().__init__(database_url)
        self.model_id = info.id
        self.accelerator = info.accelerator
        self.tables_engine = info.engine
        # Rows are immutable; the creation time guards against a reused id.
        self.cache_key = f"latency-model-{info.id}@{info.created_at.isoformat()}"

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "id": self.model_id, "acc": self.accelerator,
                "tables": self.tables_engine, "key": self.cache_key}  # fmt: skip

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.model_id, self.accelerator, self.cache_key = state["id"], state["acc"], state["key"]
        self.tables_engine = state["tables"]

    def load(self) -> LatencyModel:
        from storage.db import session_scope

        with session_scope(self.engine) as s:
            payload = load_latency_payload(s, self.model_id)
        return load_model(*payload)


class DatabaseTableStore(_EngineHolder):
    """A `TableStore` in the database (short transactions of its own; concurrent-safe)."""

    def __init__(self, database_url: str, model_ids: dict[str, int]) -> None:
        super().__init__(database_url)
        self.model_ids = model_ids  # ModelRef.cache_key -> stored model id (for deletion)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "ids": self.model_ids}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.model_ids = state["ids"]

    def get(self, key: str) -> CompiledStepLatency | None:
        from storage.latency_tables import get_table

        data = get_table(self.engine, key)
        if data is None:
            return None
        try:
            return table_from_bytes(data)
        except ValueError:
            return None  # written by another build: compiled again

    def put(self, key: str, table: CompiledStepLatency, model_key: str) -> None:
        from storage.latency_tables import put_table

        model_id = self.model_ids.get(model_key)
        put_table(self.engine, key, table_to_bytes(table), latency_model_id=model_id)


@dataclass(frozen=True, slots=True)
class ResolvedLatency:
    source: LatencySource
    label: str  # what prices the run, for people
    is_estimate: bool  # True when nothing measured is used
    model_ids: tuple[int, ...] = ()  # stored latency models used
    catalog: LatencyCatalog | None = None  # the fitted models by accelerator and engine

    def tables_for(self, accelerators: Sequence[str], release: EngineRelease) -> str:
        """Whose kernel tables price `release` on each accelerator, for people: "h100:
        SGLang's tables (model #7)", "h100: vLLM's tables: no SGLang tables for h100 (model
        #3)" or "h100: roofline estimate"; "" for a source of the caller's own (no catalog)."""
        if self.catalog is None:
            return ""
        parts = []
        for name in dict.fromkeys(a.lower() for a in accelerators):
            chosen = None
            if self.catalog is not None:
                try:
                    acc = get_accelerator(name)
                except HardwareError:
                    acc = None
                chosen = None if acc is None else self.catalog.choose(acc, release)
            if chosen is None or acc is None:
                parts.append(f"{name}: roofline estimate")
                continue
            model_id = getattr(chosen.ref, "model_id", None)
            which = f" (model #{model_id})" if model_id is not None else ""
            parts.append(f"{name}: {chosen.note(acc, release)}{which}")
        return "; ".join(parts)


def _key(info: LatencyModelInfo) -> str:
    return model_key(info.accelerator.lower(), info.engine)


def _newest_per_accelerator(infos: Sequence[LatencyModelInfo]) -> list[LatencyModelInfo]:
    """The newest model per accelerator and engine's tables (vLLM's and no engine's
    together: either prices vLLM)."""
    newest: dict[str, LatencyModelInfo] = {}
    for info in infos:
        if info.engine not in PRICED_ENGINES:
            continue  # TensorRT-LLM's tables import, but no deployment is priced by them
        key = _key(info)
        if key not in newest or info.id > newest[key].id:
            newest[key] = info
    return sorted(newest.values(), key=_key)


def _describe(info: LatencyModelInfo) -> str:
    whose = ENGINE_NAMES.get(info.engine)
    tables = f", {whose}'s tables" if whose else ""
    return f"{info.accelerator} #{info.id} ({info.name} v{info.version}{tables})"


def resolve_latency(
    session: Session,
    model: str,
    *,
    latency_model_ids: Sequence[int] = (),
    use_stored: bool = True,
    calibrated: bool = True,
    num_threads: int = 1,
    overhead: EngineOverhead | None = None,
) -> ResolvedLatency:
    """The latency source for `model` (a shape preset or HF config path).

    With `latency_model_ids`, exactly those stored models are used (a missing id
    raises LookupError); otherwise, when `use_stored`, the newest stored model per
    accelerator and engine's tables. Accelerators without one are priced by the roofline
    estimate.
    When `calibrated`, the stored calibrations that belong to those sources apply.
    Tables compile later, when a run asks, with `num_threads` native threads.
    `overhead` replaces every fitted model's engine overhead (None: each model's own,
    else the engine release's, `optimizer.engines`).
    """
    shape = get_shape(model)
    if latency_model_ids:
        infos = [get_latency_model(session, i) for i in latency_model_ids]
    elif use_stored:
        infos = _newest_per_accelerator(list_latency_models(session))
    else:
        infos = []
    url = _url_of(session)
    refs = {_key(i): StoredModel(url, i) for i in infos}
    store = DatabaseTableStore(url, {r.cache_key: r.model_id for r in refs.values()})
    catalog = LatencyCatalog(shape, refs, store=store, num_threads=num_threads, overhead=overhead)
    source: LatencySource = catalog
    if infos:
        used = ", ".join(_describe(i) for i in infos)
        label = f"fitted latency models: {used}; roofline estimate for other accelerators"
    else:
        label = ROOFLINE_ONLY
    cals = []
    if calibrated:
        vllm = {i.accelerator.lower(): i.id for i in infos if _key(i) == i.accelerator.lower()}
        cals = _calibrations(session, shape.name, vllm)
    if cals:
        source = calibrated_source(source, cals)
        keys = ", ".join(f"calibration {c.id} ({c.accelerator} tp{c.tp})" for c in cals)
        label += f"; calibrated by {keys} from observed runs"
    return ResolvedLatency(source, label, not infos, tuple(i.id for i in infos), catalog)


def _calibrations(
    session: Session, shape_name: str, model_ids: dict[str, int]
) -> list[CalibrationRecord]:
    """The newest stored calibration per (accelerator, TP) that belongs to what prices it:
    the fitted model in use for that accelerator, or the roofline (no model id)."""
    chosen: dict[tuple[str, int], CalibrationRecord] = {}
    for c in latest_calibrations(session, shape_name=shape_name):
        if c.latency_model_id is None and c.accelerator.lower() not in model_ids:
            chosen[(c.accelerator.lower(), c.tp)] = c
    for acc, model_id in model_ids.items():
        for c in latest_calibrations(session, shape_name=shape_name, latency_model_id=model_id):
            if c.accelerator.lower() == acc:
                chosen[(acc, c.tp)] = c
    return sorted(chosen.values(), key=lambda c: (c.accelerator, c.tp))


def fit_and_store(
    engine: Engine,
    profile_run_id: int,
    *,
    name: str | None = None,
    shape: ModelShape | str | None = None,
    options: FitOptions | None = None,
    progress: FitProgress | None = None,
) -> LatencyModelInfo:
    """Fit a latency model on a stored profile run, evaluate it on hold-outs, store it.

    `shape` names the model whose mixed iterations the profile measured (default:
    the shape preset its samples name). Raises ProfileRunNotFound for a missing
    run and LatencyModelError (a ValueError) when it cannot be fitted; nothing is
    stored then. The new model is the next version of `name` (default: the run's).
    Reading the samples and saving the model are two short transactions; no
    transaction is open while fitting (which takes seconds to minutes).
    """
    from storage.db import session_scope

    say = progress or (lambda _stage: None)
    if isinstance(shape, str):
        shape = get_shape(shape)
    with session_scope(engine) as session:
        run = get_profile_run(session, profile_run_id)
        say(f"loading samples of profile run {run.id} ({run.num_samples:,})")
        samples = load_samples(session, run.id)
    say("fitting operator models")
    model = fit_latency_model(
        samples, accelerator=run.accelerator, source=run.source, options=options, shape=shape
    )
    metrics = evaluate_holdout(
        samples, options=options, progress=lambda op, split: say(f"hold-out: {op} ({split})")
    )
    shapes = sorted({s.model for s in samples if s.model})
    shape_name = shape.name if shape is not None else (shapes[0] if len(shapes) == 1 else "")
    tps = sorted({s.tp for s in samples if s.op is not OpKind.MIXED_ITERATION and s.tp >= 1})
    say("saving")
    with session_scope(engine) as session:
        return save_latency_model(
            session,
            name=name or run.name,
            accelerator=run.accelerator,
            payload=dump_model(model),
            schema_version=PAYLOAD_SCHEMA_VERSION,
            profile_run_id=run.id,
            shape_name=shape_name,
            tp_degrees=tuple(tps) or (1,),
            features=feature_names(model),
            metrics=metrics,
            engine=run.engine,
        )


__all__ = [
    "ROOFLINE_ONLY",
    "FitProgress",
    "LatencyModelError",
    "ResolvedLatency",
    "fit_and_store",
    "resolve_latency",
]
