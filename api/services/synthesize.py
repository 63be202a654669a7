"""Synthetic traces: a stored sample's request lengths under a rate curve, stored as a
trace labelled synthetic (`optimizer.traces.synthesize` draws the rows).

The request is checked against the sample's stored statistics before any row is read
or drawn, so a bad request stores nothing; the same request again returns the trace
already stored (its content hash is the request's: the sample's content, the curve's
points, days, mean rate, seed). The new trace joins the sample's project.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from optimizer.records import RateCurve, SyntheticOrigin, TraceFormat, TraceInfo
from optimizer.traces.stats import compute_stats
from optimizer.traces.synthesize import (
    SynthesisError,
    check_request,
    default_name,
    origin_digest,
    synthesize,
)
from storage.traces import find_trace_by_hash, get_trace, load_token_counts, store_trace

MAX_NAME_CHARS = 200  # the traces table's name column


@dataclass(frozen=True, slots=True)
class SynthesisResult:
    trace: TraceInfo
    created: bool  # False: the same synthesis was already stored


def synthesize_trace(
    session: Session,
    *,
    from_trace_id: int,
    curve: RateCurve,
    days: float,
    mean_rate: float,
    seed: int = 0,
    name: str | None = None,
    project: str | None = None,
    max_requests: int | None = None,
) -> SynthesisResult:
    """Synthesize from stored trace `from_trace_id` (looked up in `project`; None: any) and
    store the result. Raises `TraceNotFound`, `SynthesisError` or `RateCurveError`."""
    sample = get_trace(session, from_trace_id, project=project)
    if name is not None and not 0 < len(name.strip()) <= MAX_NAME_CHARS:
        raise SynthesisError(f"--name {name!r}; expected 1 to {MAX_NAME_CHARS} characters")
    num_sample = sample.stats.num_requests
    check_request(
        num_sample=num_sample,
        curve=curve,
        days=days,
        mean_rate=mean_rate,
        seed=seed,
        max_requests=max_requests,
    )
    origin = SyntheticOrigin(
        from_trace_id=sample.id,
        from_trace_name=sample.name,
        from_content_hash=sample.content_hash,
        rate_curve=curve,
        days=float(days),
        mean_rate=float(mean_rate),
        seed=int(seed),
    )
    digest = origin_digest(origin)
    existing = find_trace_by_hash(session, digest, project=sample.project)
    if existing is not None:
        return SynthesisResult(existing, False)
    inputs, outputs = load_token_counts(session, sample.id, num_sample)
    columns = synthesize(
        inputs,
        outputs,
        curve=curve,
        days=origin.days,
        mean_rate=origin.mean_rate,
        seed=origin.seed,
        max_requests=max_requests,
    )
    info, created = store_trace(
        session,
        name=name.strip() if name is not None else default_name(origin),
        source_format=TraceFormat.GENERIC,
        content_hash=digest,
        columns=columns,
        stats=compute_stats(columns),
        project=sample.project,
        synthetic=origin,
    )
    return SynthesisResult(info, created)
