"""Which latency model prices a run: stored fitted models first, else the roofline.

`resolve_latency(session, model)` builds the `LatencySource` every command and
job uses: for each accelerator with a stored fitted latency model, the newest
one (or the ids the caller names) compiled for the model shape; any other
accelerator falls back to the roofline estimate, labelled as such. Stored
calibrations (fitted on observed runs by `servetune calibrate`) of whatever
prices an accelerator are applied on top.

`fit_and_store(session, profile_run_id)` turns a stored profile run into a
stored latency model: fit, hold-out metrics, save.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from optimizer.latency.base import LatencySource
from optimizer.latency.catalog import LatencyCatalog, build_catalog
from optimizer.latency.evaluate import evaluate_holdout
from optimizer.latency.fit import fit_latency_model
from optimizer.latency.model import FitOptions, LatencyModelError
from optimizer.latency.persist import PAYLOAD_SCHEMA_VERSION, dump_model, feature_names, load_model
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


@dataclass(frozen=True, slots=True)
class ResolvedLatency:
    source: LatencySource
    label: str  # what prices the run, for people
    is_estimate: bool  # True when nothing measured is used
    model_ids: tuple[int, ...] = ()  # stored latency models used


def _newest_per_accelerator(infos: Sequence[LatencyModelInfo]) -> list[LatencyModelInfo]:
    newest: dict[str, LatencyModelInfo] = {}
    for info in infos:
        if info.accelerator not in newest or info.id > newest[info.accelerator].id:
            newest[info.accelerator] = info
    return sorted(newest.values(), key=lambda i: i.accelerator)


def resolve_latency(
    session: Session,
    model: str,
    *,
    latency_model_ids: Sequence[int] = (),
    use_stored: bool = True,
    calibrated: bool = True,
    tps: Sequence[int] = (1, 2, 4, 8),
) -> ResolvedLatency:
    """The latency source for `model` (a shape preset or HF config path).

    With `latency_model_ids`, exactly those stored models are used (a missing id
    raises LookupError); otherwise, when `use_stored`, the newest stored model per
    accelerator. Accelerators without one are priced by the roofline estimate.
    When `calibrated`, the stored calibrations that belong to those sources apply.
    """
    shape = get_shape(model)
    if latency_model_ids:
        infos = [get_latency_model(session, i) for i in latency_model_ids]
    elif use_stored:
        infos = _newest_per_accelerator(list_latency_models(session))
    else:
        infos = []
    if infos:
        fitted = [load_model(*load_latency_payload(session, i.id)) for i in infos]
        source: LatencySource = build_catalog(shape, fitted, tps)
        used = ", ".join(f"{i.accelerator} #{i.id} ({i.name} v{i.version})" for i in infos)
        label = f"fitted latency models: {used}; roofline estimate for other accelerators"
    else:
        source, label = LatencyCatalog(shape), ROOFLINE_ONLY
    cals = []
    if calibrated:
        cals = _calibrations(session, shape.name, {i.accelerator.lower(): i.id for i in infos})
    if cals:
        source = calibrated_source(source, cals)
        keys = ", ".join(f"calibration {c.id} ({c.accelerator} tp{c.tp})" for c in cals)
        label += f"; calibrated by {keys} from observed runs"
    return ResolvedLatency(source, label, not infos, tuple(i.id for i in infos))


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
    session: Session,
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
    """
    say = progress or (lambda _stage: None)
    run = get_profile_run(session, profile_run_id)
    say(f"loading samples of profile run {run.id} ({run.num_samples:,})")
    samples = load_samples(session, run.id)
    if isinstance(shape, str):
        shape = get_shape(shape)
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
    )


__all__ = [
    "ROOFLINE_ONLY",
    "FitProgress",
    "LatencyModelError",
    "ResolvedLatency",
    "fit_and_store",
    "resolve_latency",
]
