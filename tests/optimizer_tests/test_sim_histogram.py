"""`LogHistogram`: percentiles within 1% of the exact nearest-rank ones, exact mean and
max, zeros counted exactly, merges equal to one histogram of everything."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from optimizer.sim.histogram import RELATIVE_ERROR, LogHistogram
from optimizer.sim.metrics import Percentiles


def _exact(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.lexsort((weights, values))
    v, cw = values[order], np.cumsum(weights[order])
    return float(v[min(int(np.searchsorted(cw, q * cw[-1], side="left")), v.size - 1)])


@pytest.mark.parametrize("seed", range(8))
def test_percentiles_are_within_one_percent_of_the_exact_ones(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    values = rng.lognormal(mean=-4.0, sigma=float(rng.uniform(0.1, 2.0)), size=n)
    values[rng.random(n) < 0.05] = 0.0  # speculative gaps of 0
    weights = rng.integers(1, 64, size=n).astype(float)
    hist = LogHistogram()
    half = n // 2
    for v, w in zip(values[:half], weights[:half], strict=True):
        hist.add(float(v), float(w))
    hist.add_many(values[half:], weights[half:])
    for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0):
        exact = _exact(values, weights, q)
        assert hist.percentile(q) == pytest.approx(exact, rel=RELATIVE_ERROR, abs=0.0)
    assert RELATIVE_ERROR <= 0.01
    assert hist.mean == pytest.approx(float(np.dot(values, weights) / weights.sum()), rel=1e-12)
    assert hist.max == values.max() and hist.min == values.min()
    ref = Percentiles.of(values, weights)
    assert hist.percentile(0.99) == pytest.approx(ref.p99, rel=RELATIVE_ERROR)


def test_a_hand_worked_case() -> None:
    """Weights 3 at 0, 1 at 10 ms, 6 at 20 ms: total 10. p50 is the 5th unit of weight
    (20 ms), p25 the 2.5th (a zero gap), p30 the 3rd (still zero), p35 the 3.5th (10 ms);
    the mean is (0.01 + 0.12) / 10."""
    hist = LogHistogram()
    hist.add(0.0, 3.0)
    hist.add(0.010)
    hist.add(0.020, 6.0)
    assert hist.percentile(0.25) == 0.0
    assert hist.percentile(0.30) == 0.0
    assert hist.percentile(0.35) == pytest.approx(0.010, rel=RELATIVE_ERROR)
    assert hist.percentile(0.50) == pytest.approx(0.020, rel=RELATIVE_ERROR)
    assert hist.percentile(1.0) == 0.020  # clipped to the exact max
    assert hist.mean == pytest.approx(0.013, rel=1e-12)
    values, weights = hist.representatives()
    assert values[0] == 0.0 and weights.tolist() == [3.0, 1.0, 6.0]
    assert values[1] == pytest.approx(0.010, rel=RELATIVE_ERROR)


def test_merging_two_halves_equals_the_histogram_of_all() -> None:
    rng = np.random.default_rng(1)
    values = rng.lognormal(-3.0, 1.0, size=2000)
    weights = rng.integers(1, 9, size=2000).astype(float)
    whole, a, b = LogHistogram(), LogHistogram(), LogHistogram()
    whole.add_many(values, weights)
    a.add_many(values[:700], weights[:700])
    b.add_many(values[700:], weights[700:])
    a.merge(b)
    assert np.array_equal(a.counts, whole.counts)
    assert (a.total, a.max, a.min, a.zeros) == (whole.total, whole.max, whole.min, whole.zeros)
    assert a.mean == pytest.approx(whole.mean, rel=1e-12)
    assert pickle.loads(pickle.dumps(a)) == a


def test_zero_weights_count_nothing_and_empty_is_nan() -> None:
    hist = LogHistogram()
    hist.add(5.0, 0.0)
    hist.add_many(np.array([7.0]), np.array([0.0]))
    assert hist.total == 0.0 and math.isnan(hist.percentile(0.5)) and math.isnan(hist.mean)


@pytest.mark.parametrize("bad", [-1e-3, math.nan, 1e9, math.inf])
def test_bad_values_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match=r"LogHistogram\.add"):
        LogHistogram().add(bad)
    with pytest.raises(ValueError, match=r"LogHistogram\.add_many"):
        LogHistogram().add_many(np.array([0.1, bad]))
    with pytest.raises(ValueError, match="weight"):
        LogHistogram().add(0.1, -1.0)
