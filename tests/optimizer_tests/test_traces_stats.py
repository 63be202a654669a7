"""compute_stats on hand-worked traces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.records import TraceColumns
from optimizer.traces import compute_stats, prefix_hit_ratio, token_stats
from optimizer.traces.stats import infer_block_size, nearest_rank, peak_rate


def cols(arrival: list[float], inp: list[int], out: list[int], **kw: object) -> TraceColumns:
    return TraceColumns(
        np.array(arrival, dtype=np.float64),
        np.array(inp, dtype=np.int64),
        np.array(out, dtype=np.int64),
        **kw,  # type: ignore[arg-type]
    )


def test_nearest_rank_by_hand() -> None:
    values = np.arange(1, 11)  # 1..10
    # ceil(0.5*10)=5 -> 5; ceil(0.9*10)=9 -> 9; ceil(0.99*10)=10 -> 10; ceil(0.01*10)=1 -> 1.
    assert [nearest_rank(values, q) for q in (50, 90, 99, 1)] == [5, 9, 10, 1]
    assert nearest_rank(np.array([7]), 50) == 7
    assert nearest_rank(np.array([], dtype=np.int64), 50) == 0


def test_token_stats_by_hand() -> None:
    s = token_stats(np.array([30, 10, 20, 40], dtype=np.int64))
    # sorted 10 20 30 40: p50 rank 2 -> 20, p90 rank ceil(3.6)=4 -> 40, p99 -> 40.
    assert (s.mean, s.p50, s.p90, s.p99, s.max, s.total) == (25.0, 20, 40, 40, 40, 100)


def test_compute_stats_golden() -> None:
    # Arrivals 0, 0.5, 0.9, 2, 10: gaps 0.5 0.4 1.1 8 (mean 2.5).
    c = cols([0.0, 0.5, 0.9, 2.0, 10.0], [1, 2, 3, 4, 5], [5, 4, 3, 2, 1])
    s = compute_stats(c, num_dropped=2, warnings=("w",))
    assert s.num_requests == 5 and s.duration_s == 10.0 and s.mean_rate == 0.5
    gaps = np.array([0.5, 0.4, 1.1, 8.0])
    std = math.sqrt(((gaps - 2.5) ** 2).mean())
    assert s.interarrival_cv == pytest.approx(std / 2.5)
    # [0, 1) holds 0, 0.5, 0.9 -> 3/s; [0, 10) holds four -> 0.4/s; 60 s holds all five.
    assert (s.peak_rate_1s, s.peak_rate_10s) == (3.0, 0.4)
    assert s.peak_rate_60s == pytest.approx(5 / 60)
    assert s.input_tokens.total == 15 and s.output_tokens.p50 == 3
    assert s.prefix_hit_ratio is None and s.num_dropped == 2 and s.warnings == ("w",)


def test_peak_windows_are_half_open_and_sliding() -> None:
    arrival = np.array([0.0, 0.6, 1.0, 1.4, 1.5])
    # [0.6, 1.6) holds 4; a tumbling [1, 2) would see only 3; [0, 1) excludes 1.0.
    assert peak_rate(arrival, 1.0) == 4.0
    assert peak_rate(np.array([]), 1.0) == 0.0


def test_degenerate_traces() -> None:
    one = compute_stats(cols([0.0], [3], [4]))
    assert (one.duration_s, one.mean_rate, one.interarrival_cv, one.peak_rate_1s) == (
        0.0,
        0.0,
        0.0,
        1.0,
    )
    same = compute_stats(cols([0.0, 0.0], [3, 3], [4, 4]))
    assert same.interarrival_cv == 0.0 and same.peak_rate_1s == 2.0


def test_prefix_hit_leading_blocks_only() -> None:
    block = 4
    hashes = [
        np.array([1, 2, 3]),  # 10 tokens, nothing seen
        np.array([1, 2, 9]),  # 12 tokens: 1, 2 seen -> 8
        np.array([7, 2]),  # 8 tokens: 7 unseen stops the run although 2 was seen -> 0
        np.array([1, 2, 3]),  # 9 tokens: all seen, last block partial -> min(12, 9) = 9
        np.array([], dtype=np.int64),  # 5 tokens, no blocks
    ]
    inp = np.array([10, 12, 8, 9, 5])
    expected = (0 + 8 + 0 + 9 + 0) / 44
    assert prefix_hit_ratio(inp, hashes, block) == pytest.approx(expected)
    c = cols([0, 1, 2, 3, 4], inp.tolist(), [1] * 5, prefix_hashes=hashes)
    assert compute_stats(c, block_size=block).prefix_hit_ratio == pytest.approx(expected)


def test_prefix_hit_repeat_within_one_request_is_not_a_hit() -> None:
    assert prefix_hit_ratio(np.array([8]), [np.array([5, 5])], 4) == 0.0


def test_infer_block_size() -> None:
    inp = np.array([1000, 513, 40160, 16])
    hashes = [np.zeros(math.ceil(n / 512), dtype=np.int64) for n in inp]
    assert infer_block_size(inp, hashes) == 512
    inp16 = np.array([20, 33, 16])
    assert infer_block_size(inp16, [np.zeros(math.ceil(n / 16)) for n in inp16]) == 16
    assert infer_block_size(np.array([5]), [np.array([], dtype=np.int64)]) is None
