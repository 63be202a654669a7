"""A tuning request's physical floors checked on stored data, before anything is queued or
searched (`optimizer.search.floors`): `servetune tune` and `POST /v1/tuning-jobs` call it.

The workload's lengths come from what is already at hand: a stored trace's statistics
(one row), the first `max_requests` requests' token counts when the request cuts the
trace, a closed-loop benchmark's parameters. A stream's or deployment's request is checked
on the newest upload of its window (`trace_ids`), the trace its job will run on; with no
trace known yet, the worker's check (`api.services.tuning.run_tuning_job`) is the one.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from optimizer.search.floors import FloorError, WorkloadLengths, check_floors
from optimizer.search.request import TuneRequest
from storage.traces import TraceNotFound, get_trace, load_token_counts

__all__ = ["FloorError", "check_request_floors", "stored_lengths"]


def stored_lengths(
    session: Session,
    request: TuneRequest,
    *,
    project: str | None = None,
    trace_ids: Sequence[int] = (),
) -> WorkloadLengths | None:
    """The lengths `request` will run on (None: no trace known yet, or none stored)."""
    if request.workload is not None:
        return WorkloadLengths.of_spec(request.bench_spec(), request.max_requests)
    trace_id = request.trace_id if request.trace_id is not None else (trace_ids or (None,))[-1]
    if trace_id is None:
        return None
    try:
        stats = get_trace(session, trace_id, project=project).stats
    except TraceNotFound:  # the caller's own lookup reports it, as it always has
        return None
    cut = request.max_requests
    if cut is None or cut >= stats.num_requests:
        return WorkloadLengths.of_stats(stats)
    inp, out = load_token_counts(session, trace_id, cut)
    return WorkloadLengths.of_arrays(inp, out, prefix_hashes=stats.prefix_hit_ratio is not None)


def check_request_floors(
    session: Session,
    request: TuneRequest,
    *,
    project: str | None = None,
    trace_ids: Sequence[int] = (),
) -> None:
    """Raise `FloorError` when an SLO of `request` lies below a physical floor."""
    lengths = stored_lengths(session, request, project=project, trace_ids=trace_ids)
    if lengths is not None:
        check_floors(request, lengths)
