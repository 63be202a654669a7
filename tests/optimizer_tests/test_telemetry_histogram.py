"""Histogram arithmetic worked by hand: quantile interpolation, window deltas, binning,
and sampling from buckets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.telemetry import (
    BucketMismatchError,
    CounterResetError,
    Histogram,
    TelemetryError,
)

INF = math.inf
BOUNDS = (0.1, 0.5, 1.0, INF)


def test_quantiles_by_bucket_interpolation_golden() -> None:
    # Cumulative 10 / 30 / 40 / 40: 10 in (0, 0.1], 20 in (0.1, 0.5], 10 in (0.5, 1], none above.
    h = Histogram(BOUNDS, (10, 30, 40, 40), sum=18.0, count=40)
    # p50: rank 0.5 x 40 = 20 falls in (0.1, 0.5] holding ranks 10..30: 0.1 + 0.4 x 10/20.
    assert h.quantile(0.5) == pytest.approx(0.3)
    # p90: rank 36 in (0.5, 1] holding 30..40: 0.5 + 0.5 x 6/10.
    assert h.quantile(0.9) == pytest.approx(0.8)
    # p99: rank 39.6: 0.5 + 0.5 x 9.6/10.
    assert h.quantile(0.99) == pytest.approx(0.98)
    # p10: rank 4 in the first bucket, whose lower bound is 0: 0.1 x 4/10.
    assert h.quantile(0.1) == pytest.approx(0.04)
    assert h.mean == pytest.approx(0.45)


def test_quantile_in_the_inf_bucket_is_the_largest_finite_bound() -> None:
    h = Histogram(BOUNDS, (10, 30, 40, 50), sum=0.0, count=50)
    assert h.quantile(0.9) == 1.0  # rank 45 > 40: above every finite bound
    assert math.isnan(Histogram(BOUNDS, (0, 0, 0, 0), 0.0, 0).quantile(0.5))


def test_window_delta_golden() -> None:
    before = Histogram(BOUNDS, (5, 10, 12, 12), sum=3.0, count=12)
    after = Histogram(BOUNDS, (15, 40, 52, 52), sum=21.0, count=52)
    delta = after.minus(before, "vllm:e2e_request_latency_seconds")
    assert delta.cumulative == (10, 30, 40, 40)
    assert delta.bucket_counts.tolist() == [10, 20, 10, 0]
    assert delta.sum == 18.0 and delta.count == 40
    assert delta.quantile(0.5) == pytest.approx(0.3)


def test_a_bucket_that_falls_is_a_counter_reset() -> None:
    before = Histogram(BOUNDS, (5, 10, 12, 12), sum=3.0, count=12)
    after = Histogram(BOUNDS, (5, 9, 14, 14), sum=4.0, count=14)
    with pytest.raises(CounterResetError) as info:
        after.minus(before, "vllm:time_to_first_token_seconds")
    assert str(info.value) == (
        "counter reset between the scrapes: vllm:time_to_first_token_seconds_bucket"
        '{le="0.5"} fell from 10 to 9; take both scrapes from one server process'
    )


def test_bucket_boundaries_must_agree() -> None:
    before = Histogram((0.1, 0.5, INF), (1, 2, 2), 0.3, 2)
    after = Histogram(BOUNDS, (1, 2, 3, 3), 1.0, 3)
    with pytest.raises(BucketMismatchError, match=r"BEFORE le=\[0.1,0.5,\+Inf\], AFTER le="):
        after.minus(before, "vllm:request_prompt_tokens")


def test_histogram_shape_is_checked() -> None:
    with pytest.raises(TelemetryError, match="last le to be \\+Inf"):
        Histogram((0.1, 0.5), (1, 2), 0.0, 2)
    with pytest.raises(TelemetryError, match="strictly ascending"):
        Histogram((0.5, 0.1, INF), (1, 2, 2), 0.0, 2)


def test_binning_counts_a_value_in_every_bucket_at_or_above_it() -> None:
    h = Histogram.of(np.array([0.1, 0.2, 0.5, 2.0, np.nan]), BOUNDS)
    assert h.cumulative == (1, 3, 3, 4)  # 0.1 is in le=0.1 (upper bounds are inclusive)
    assert h.count == 4 and h.sum == pytest.approx(2.8)
    weighted = Histogram.of(np.array([0.05, 0.7]), BOUNDS, np.array([3.0, 1.0]))
    assert weighted.cumulative == (3, 3, 4, 4) and weighted.sum == pytest.approx(0.85)


def test_sampling_keeps_bucket_shares_and_the_exact_mean() -> None:
    h = Histogram((10.0, 100.0, 1000.0, INF), (100, 700, 1000, 1000), sum=150_000.0, count=1000)
    values = h.sample(np.random.default_rng(0), 20_000)
    shares = np.bincount(np.searchsorted(h.upper_bounds, values), minlength=4) / values.size
    assert shares == pytest.approx([0.1, 0.6, 0.3, 0.0], abs=0.015)
    assert values.mean() == pytest.approx(150.0, rel=1e-3)  # the exact sum / count
    assert values.min() > 0 and values.max() <= 1000.0


def test_sampling_the_inf_bucket_up_to_a_bound() -> None:
    h = Histogram((10.0, INF), (0, 10), sum=math.nan, count=10)  # no usable mean: uniform
    rng = np.random.default_rng(1)
    default = h.sample(rng, 1000)
    assert default.min() >= 10.0 and default.max() <= 20.0  # 2 x the largest finite bound
    bounded = h.sample(rng, 1000, inf_upper=50.0)
    assert bounded.max() <= 50.0 and bounded.max() > 20.0
    with pytest.raises(TelemetryError, match="empty histogram"):
        Histogram(BOUNDS, (0, 0, 0, 0), 0.0, 0).sample(rng, 3)


def test_sampling_follows_a_lognormal_inside_wide_buckets() -> None:
    """Prompts of a lognormal (median 265, sigma 0.5) in vLLM's 1-2-5 token buckets: the
    rebuilt p90 falls in the (500, 1000] bucket, and a lognormal-shaped fill puts it near
    the truth where a uniform fill of that bucket overshoots."""
    rng = np.random.default_rng(3)
    truth = rng.lognormal(math.log(265), 0.5, 20_000)
    bounds = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, INF)
    h = Histogram.of(truth, bounds)
    mu, sigma = h.lognormal_fit()
    assert mu == pytest.approx(math.log(265), abs=0.05) and sigma == pytest.approx(0.5, abs=0.05)
    rebuilt = h.sample(np.random.default_rng(4), 20_000)
    for q in (50, 90, 99):
        assert np.percentile(rebuilt, q) == pytest.approx(np.percentile(truth, q), rel=0.05), q
    assert rebuilt.mean() == pytest.approx(h.mean, rel=1e-3)
    assert Histogram((10.0, INF), (5, 5), 25.0, 5).lognormal_fit() is None  # one bucket
