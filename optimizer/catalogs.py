"""Which latency model prices a run: stored fitted models first, else the roofline.

`resolve_latency(session, model)` builds the `LatencySource` every command and
job uses: for each accelerator with a stored fitted latency model, the newest
one (or the ids the caller names) compiled for the model shape; any other
accelerator falls back to the roofline estimate, labelled as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from optimizer.latency.base import LatencySource
from optimizer.latency.catalog import LatencyCatalog, build_catalog
from optimizer.latency.persist import load_model
from profiler.shapes import get_shape
from storage.latency_models import (
    LatencyModelInfo,
    get_latency_model,
    list_latency_models,
    load_latency_payload,
)

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
    tps: Sequence[int] = (1, 2, 4, 8),
) -> ResolvedLatency:
    """The latency source for `model` (a shape preset or HF config path).

    With `latency_model_ids`, exactly those stored models are used (a missing id
    raises LookupError); otherwise, when `use_stored`, the newest stored model per
    accelerator. Accelerators without one are priced by the roofline estimate.
    """
    shape = get_shape(model)
    if latency_model_ids:
        infos = [get_latency_model(session, i) for i in latency_model_ids]
    elif use_stored:
        infos = _newest_per_accelerator(list_latency_models(session))
    else:
        infos = []
    if not infos:
        return ResolvedLatency(LatencyCatalog(shape), ROOFLINE_ONLY, True)
    fitted = [load_model(*load_latency_payload(session, i.id)) for i in infos]
    catalog = build_catalog(shape, fitted, tps)
    used = ", ".join(f"{i.accelerator} #{i.id} ({i.name} v{i.version})" for i in infos)
    return ResolvedLatency(
        catalog,
        f"fitted latency models: {used}; roofline estimate for other accelerators",
        False,
        tuple(i.id for i in infos),
    )
