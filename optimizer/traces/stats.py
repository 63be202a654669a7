"""Trace statistics (DOMAIN.md §2, §7), computed once at ingest.

Definitions:
- duration_s = last arrival − first arrival; mean_rate = num_requests / duration_s
  (0 when the duration is 0).
- interarrival_cv = population std / mean of the inter-arrival gaps (0 with fewer
  than two requests or a zero mean gap).
- peak_rate_{1,10,60}s: sliding windows. The largest number of arrivals in any
  half-open window [t, t + w) divided by w. A busiest window can always be slid
  right until it starts at an arrival, so windows anchored at each arrival give the
  exact maximum over all window positions (unlike tumbling windows, which split a
  burst that straddles a boundary). A trace shorter than w gives num_requests / w.
- token percentiles by nearest rank: the value at 1-based rank ceil(q/100 · n) of
  the sorted values.
- prefix_hit_ratio (ideal prefix cache, infinite capacity): for each request in
  arrival order, its leading run of hash_ids blocks that appeared in any earlier
  request counts as cached; those blocks cover min(run · block_size,
  input_tokens) tokens (the last block of a prompt may be partial). The ratio is
  covered tokens / total input tokens. 0.651 on the Mooncake synthetic sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from optimizer.records import TokenStats, TraceColumns, TraceStats

PEAK_WINDOWS_S = (1.0, 10.0, 60.0)


def nearest_rank(sorted_values: np.ndarray, q: float) -> int:
    """The nearest-rank q-th percentile (0 < q <= 100) of ascending values."""
    n = int(sorted_values.shape[0])
    if n == 0:
        return 0
    rank = max(1, math.ceil(q / 100.0 * n))
    return int(sorted_values[rank - 1])


def token_stats(tokens: np.ndarray) -> TokenStats:
    """Mean, nearest-rank p50/p90/p99, max and total of per-request token counts."""
    if tokens.shape[0] == 0:
        return TokenStats(mean=0.0, p50=0, p90=0, p99=0, max=0, total=0)
    ordered = np.sort(tokens)
    total = int(ordered.sum(dtype=np.int64))
    return TokenStats(
        mean=total / ordered.shape[0],
        p50=nearest_rank(ordered, 50),
        p90=nearest_rank(ordered, 90),
        p99=nearest_rank(ordered, 99),
        max=int(ordered[-1]),
        total=total,
    )


def peak_rate(arrival_s: np.ndarray, window_s: float) -> float:
    """Most arrivals in any sliding window [t, t + window_s), per second."""
    if arrival_s.shape[0] == 0:
        return 0.0
    ordered = arrival_s if _is_sorted(arrival_s) else np.sort(arrival_s)
    ends = np.searchsorted(ordered, ordered + window_s, side="left")
    return float((ends - np.arange(ordered.shape[0])).max()) / window_s


def interarrival_cv(arrival_s: np.ndarray) -> float:
    if arrival_s.shape[0] < 2:
        return 0.0
    ordered = arrival_s if _is_sorted(arrival_s) else np.sort(arrival_s)
    gaps = np.diff(ordered)
    mean = float(gaps.mean())
    return float(gaps.std()) / mean if mean > 0 else 0.0


def infer_block_size(input_tokens: np.ndarray, prefix_hashes: Sequence[np.ndarray]) -> int | None:
    """Tokens per hash block, from len(hash_ids) == ceil(input / block) on every row.

    Returns the smallest power of two consistent with all rows, or the smallest
    consistent size when no power of two is; None when no row has blocks.
    """
    counts = np.fromiter((h.shape[0] for h in prefix_hashes), np.int64, len(prefix_hashes))
    used = counts > 0
    if not used.any():
        return None
    lengths, counts = input_tokens[used], counts[used]
    low = int(np.max(-(-lengths // counts)))  # block >= ceil(L / n)
    multi = counts > 1
    high = int(np.min(-(-lengths[multi] // (counts[multi] - 1))) - 1) if multi.any() else None
    power = 1 << max(0, (low - 1).bit_length())
    if high is None or power <= high:
        return power
    return low


def prefix_hit_ratio(
    input_tokens: np.ndarray, prefix_hashes: Sequence[np.ndarray], block_size: int | None = None
) -> float:
    """Ideal prefix-cache hit ratio over requests in the given (arrival) order."""
    total = int(input_tokens.sum(dtype=np.int64))
    if total == 0 or len(prefix_hashes) == 0:
        return 0.0
    if block_size is None:
        block_size = infer_block_size(input_tokens, prefix_hashes)
        if block_size is None:
            return 0.0
    lengths = np.fromiter((h.shape[0] for h in prefix_hashes), np.int64, len(prefix_hashes))
    if lengths.sum() == 0:
        return 0.0
    flat = np.concatenate(prefix_hashes).astype(np.int64, copy=False)
    request = np.repeat(np.arange(lengths.shape[0]), lengths)
    # First request in which each hash appears: flat is in request order.
    _, first_flat, inverse = np.unique(flat, return_index=True, return_inverse=True)
    seen_before = request[first_flat][inverse] < request
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    position = np.arange(flat.shape[0]) - np.repeat(starts, lengths)
    # Leading run = index of the first unseen block, or the block count when all are seen.
    first_miss = np.where(seen_before, np.repeat(lengths, lengths), position)
    nonempty = lengths > 0
    run = np.zeros_like(lengths)
    run[nonempty] = np.minimum.reduceat(first_miss, starts[nonempty])
    covered = np.minimum(run * block_size, input_tokens)
    return float(covered.sum(dtype=np.int64)) / total


def compute_stats(
    columns: TraceColumns,
    *,
    num_dropped: int = 0,
    warnings: Sequence[str] = (),
    block_size: int | None = None,
) -> TraceStats:
    """All TraceStats of a trace; `block_size` (tokens per hash block) is inferred if None."""
    arrival = np.asarray(columns.arrival_s, dtype=np.float64)
    n = int(arrival.shape[0])
    duration = float(arrival.max() - arrival.min()) if n else 0.0
    hit = None
    if columns.prefix_hashes is not None:
        hit = prefix_hit_ratio(columns.input_tokens, columns.prefix_hashes, block_size)
    return TraceStats(
        num_requests=n,
        duration_s=duration,
        mean_rate=n / duration if duration > 0 else 0.0,
        interarrival_cv=interarrival_cv(arrival),
        peak_rate_1s=peak_rate(arrival, PEAK_WINDOWS_S[0]),
        peak_rate_10s=peak_rate(arrival, PEAK_WINDOWS_S[1]),
        peak_rate_60s=peak_rate(arrival, PEAK_WINDOWS_S[2]),
        input_tokens=token_stats(np.asarray(columns.input_tokens, dtype=np.int64)),
        output_tokens=token_stats(np.asarray(columns.output_tokens, dtype=np.int64)),
        prefix_hit_ratio=hit,
        num_dropped=num_dropped,
        warnings=tuple(warnings),
    )


def _is_sorted(values: np.ndarray) -> bool:
    return bool(np.all(values[1:] >= values[:-1]))
