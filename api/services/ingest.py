"""Trace ingest: parse and validate a file, then store it in one transaction.

Used by the CLI and the REST API alike. Parsing happens before any database
work, so a bad file never touches stored data; storing is atomic and
idempotent by content hash. A file's plausibility warnings (a rate, a span, a
length real traffic hardly shows) are stored with it; a workload the service
built is stored without any.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from optimizer.bench_serve import BenchServeSpec
from optimizer.records import TraceColumns, TraceFormat, TraceInfo, TraceWarning
from optimizer.traces import ColumnMapping, IngestLimits, parse_trace
from optimizer.traces.stats import compute_stats
from optimizer.workload import Workload
from storage.traces import DEFAULT_PROJECT, find_trace_by_hash, store_trace


@dataclass(frozen=True, slots=True)
class IngestResult:
    trace: TraceInfo
    created: bool  # False: the same content was already stored
    warnings: tuple[str, ...]  # the repairs made
    num_dropped: int
    # What this file shows that real traffic hardly does (stored with a new trace)
    plausibility_warnings: tuple[TraceWarning, ...] = ()


def ingest_trace(
    session: Session,
    path: str | Path,
    *,
    name: str | None = None,
    format: TraceFormat | None = None,
    mapping: ColumnMapping | None = None,
    limits: IngestLimits | None = None,
    project: str = DEFAULT_PROJECT,
    stream: str | None = None,
) -> IngestResult:
    """Parse `path` and store it in `project` (optionally as an upload of `stream`);
    return the stored (or already existing) trace."""
    path = Path(path)
    parsed = parse_trace(path, format=format, mapping=mapping, limits=limits or IngestLimits())
    existing = find_trace_by_hash(session, parsed.content_hash, project=project)
    found = parsed.plausibility_warnings
    if existing is not None:
        return IngestResult(existing, False, parsed.warnings, parsed.num_dropped, found)
    info, created = store_trace(
        session,
        name=name or path.stem,
        source_format=parsed.format,
        content_hash=parsed.content_hash,
        columns=parsed.columns,
        stats=parsed.stats,
        project=project,
        stream=stream,
        plausibility_warnings=found,
    )
    return IngestResult(info, created, parsed.warnings, parsed.num_dropped, found)


def ingest_bench_workload(
    session: Session, spec: BenchServeSpec, *, project: str = DEFAULT_PROJECT
) -> TraceInfo:
    """`spec`'s open-loop trace (`BenchServeSpec.open_loop`; BenchServeError for a closed
    loop), stored once per distinct spec (its content hash is the spec's)."""
    digest = hashlib.sha256(f"bench-serve {spec!r}".encode()).hexdigest()
    return store_workload(session, spec.open_loop(), digest=digest, project=project)


def store_workload(
    session: Session,
    wl: Workload,
    *,
    digest: str,
    name: str | None = None,
    project: str = DEFAULT_PROJECT,
) -> TraceInfo:
    """A workload the service built (not an upload) stored as a trace, once per `digest`."""
    columns = TraceColumns(
        arrival_s=wl.arrival_s,
        input_tokens=wl.input_tokens,
        output_tokens=wl.output_tokens,
        prefix_hashes=None if wl.prefix_hashes is None else list(wl.prefix_hashes),
    )
    stats = compute_stats(columns, block_size=wl.prefix_block_tokens or None)
    info, _ = store_trace(
        session, name=name or wl.name, source_format=TraceFormat.GENERIC, content_hash=digest,
        columns=columns, stats=stats, project=project,
    )  # fmt: skip
    return info
