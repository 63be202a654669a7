"""Properties: parsing round-trips arbitrary valid traces; vectorised stats match references."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.traces import ColumnMapping, TimeUnit, parse_trace, prefix_hit_ratio
from optimizer.traces.stats import peak_rate

rows = st.lists(
    st.tuples(
        st.integers(0, 10_000),  # arrival in ms, unsorted, duplicates likely
        st.integers(1, 100_000),
        st.integers(1, 5_000),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None)
@given(rows)
def test_generic_csv_round_trip(data: list[tuple[int, int, int]]) -> None:
    t_ms, inp, out = (list(col) for col in zip(*data, strict=True))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.csv"
        pl.DataFrame({"t": t_ms, "i": inp, "o": out}).write_csv(path)
        parsed = parse_trace(path, mapping=ColumnMapping("t", "i", "o", TimeUnit.MS))
    order = sorted(range(len(data)), key=lambda k: t_ms[k])  # Python's sort is stable
    first = min(t_ms)
    cols = parsed.columns
    assert np.allclose(cols.arrival_s, [(t_ms[k] - first) / 1000 for k in order], atol=1e-12)
    assert cols.input_tokens.tolist() == [inp[k] for k in order]
    assert cols.output_tokens.tolist() == [out[k] for k in order]
    assert (len(parsed.warnings) == 1) == (t_ms != sorted(t_ms))
    assert parsed.stats.num_requests == len(data)


def _reference_hit(inp: list[int], hashes: list[list[int]], block: int) -> float:
    seen: set[int] = set()
    covered = 0
    for n, blocks in zip(inp, hashes, strict=True):
        run = 0
        for h in blocks:
            if h not in seen:
                break
            run += 1
        covered += min(run * block, n)
        seen.update(blocks)
    return covered / sum(inp)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 12), max_size=6), min_size=1, max_size=25))
def test_prefix_hit_matches_reference_loop(hashes: list[list[int]]) -> None:
    block = 4
    inp = [max(1, len(h) * block - (k % block)) for k, h in enumerate(hashes)]
    arrays = [np.array(h, dtype=np.int64) for h in hashes]
    got = prefix_hit_ratio(np.array(inp), arrays, block)
    assert abs(got - _reference_hit(inp, hashes, block)) < 1e-12


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 200), min_size=1, max_size=40),
    st.sampled_from([1.0, 10.0, 60.0]),
)
def test_peak_rate_matches_brute_force(tenths: list[int], window: float) -> None:
    arrival = np.sort(np.array(tenths, dtype=np.float64) / 10)
    brute = max(int(((arrival >= t) & (arrival < t + window)).sum()) for t in arrival)
    assert peak_rate(arrival, window) == brute / window
