"""A window rebuilt from vLLM-style histograms and simulated again: the reconstruction's
contract, and a round trip in which the same config must predict what it produced."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
import yaml

from optimizer.config import ServingConfig
from optimizer.latency import build_catalog
from optimizer.shapes import get_shape
from optimizer.sim import SimulationResult, simulate
from optimizer.telemetry import (
    Histogram,
    ObservedWindow,
    compare,
    observed_window,
    parse_exposition,
    read_vllm,
    reconstruct_workload,
)
from optimizer.telemetry.reconstruct import scale_to_window
from optimizer.telemetry.synthetic import VllmTraffic, render_vllm_page
from optimizer.workload import LognormalLength, Workload, synthetic_workload

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "colocated-h100.yaml"
RATE = 12.0


@cache
def _setup() -> tuple[ServingConfig, object, Workload, SimulationResult, ObservedWindow]:
    cfg = ServingConfig.from_dict(yaml.safe_load(CONFIG.read_text()))
    latency = build_catalog(get_shape(cfg.model), [])  # the roofline estimate
    served = synthetic_workload(2000, RATE, input_lengths=LognormalLength(700),
                                output_lengths=LognormalLength(150), seed=3)  # fmt: skip
    result = simulate(served, cfg, latency)
    warm = VllmTraffic.of(simulate(served.head(200), cfg, latency))
    before = render_vllm_page(warm)
    after = render_vllm_page(warm.plus(VllmTraffic.of(result)))

    def read(text: str, source: str):
        return read_vllm(parse_exposition(text, source=source), source=source)

    window = observed_window(read(before, "BEFORE"), read(after, "AFTER"), served.duration_s)
    return cfg, latency, served, result, window


def _cdf(h: Histogram) -> np.ndarray:
    return np.asarray(h.cumulative) / h.count


def test_reconstruction_rate_count_lengths_and_seed() -> None:
    _, _, served, _, window = _setup()
    rebuilt = reconstruct_workload(window, seed=7)
    assert rebuilt.num_requests == 2000 == window.num_requests
    assert rebuilt.arrival_s[0] == 0.0
    assert rebuilt.mean_rate == pytest.approx(RATE, rel=0.08)  # Poisson at 2000 / window
    # Lengths: means match the exact _sum/_count (to rounding up to whole tokens).
    assert rebuilt.input_tokens.mean() == pytest.approx(served.input_tokens.mean(), rel=0.01)
    assert rebuilt.output_tokens.mean() == pytest.approx(served.output_tokens.mean(), rel=0.01)
    again = reconstruct_workload(window, seed=7)
    assert np.array_equal(again.input_tokens, rebuilt.input_tokens)
    assert not np.array_equal(reconstruct_workload(window, seed=8).arrival_s, rebuilt.arrival_s)


def test_reconstruction_caps_and_bounds() -> None:
    _, _, _, _, window = _setup()
    capped = reconstruct_workload(window, seed=0, max_requests=100)
    assert capped.num_requests == 100
    bounded = reconstruct_workload(window, seed=0, max_model_len=512)
    assert int((bounded.input_tokens + bounded.output_tokens).max()) <= 512


def test_the_config_that_served_the_window_predicts_it() -> None:
    cfg, latency, _, _, window = _setup()
    rebuilt = reconstruct_workload(window, seed=0)
    result = simulate(rebuilt, cfg, latency)
    report = compare(window, rebuilt, result)
    assert report.num_requests == report.num_simulated == 2000
    for c in (report.ttft, report.itl, report.e2e):
        assert c.predicted.p50 == pytest.approx(c.observed.p50, rel=0.15), c.metric
        assert c.predicted_mean_s == pytest.approx(c.observed_mean_s, rel=0.15), c.metric
    # Upper quantiles sit near bucket bounds (p90 of ITL near vLLM's 10 ms bound moves by
    # half a bucket between seeds), so the tails are compared as shares below each bound.
    for observed, values, weights in (
        (window.ttft, result.ttft_s, None),
        (window.itl, result.itl_gaps_s, result.itl_gap_weights),
        (window.e2e, result.e2e_s, None),
    ):
        predicted = Histogram.of(values, observed.upper_bounds, weights)
        gap = np.abs(_cdf(observed) - _cdf(predicted)).max()
        assert gap < 0.08, (observed.upper_bounds, gap)  # KS noise at n=2000 is ~0.04
    assert report.queue_mean_s.predicted is not None
    assert report.kv_cache_usage.observed == 0.25 and report.kv_cache_usage.predicted is not None
    assert 0.0 < report.kv_cache_usage.predicted < 1.0
    data = report.to_dict()
    assert data["itl"]["metric"] == "vllm:inter_token_latency_seconds"
    assert data["num_preemptions"] == {"observed": 0.0, "predicted": 0.0}


def test_a_slower_deployment_is_predicted_slower() -> None:
    # The comparison must be able to disagree: three times the traffic is slower.
    cfg, latency, _, _, window = _setup()
    rebuilt = reconstruct_workload(window, seed=0)
    slow = compare(window, rebuilt, simulate(rebuilt.rate_scaled(3.0), cfg, latency))
    assert slow.e2e.predicted.p90 > slow.e2e.observed.p90 * 1.25


def test_a_capped_replay_scales_its_counts_to_the_window() -> None:
    cfg, latency, _, _, window = _setup()
    capped = reconstruct_workload(window, seed=0, max_requests=500)
    result = simulate(capped, cfg, latency)
    report = compare(window, capped, result)
    assert (report.num_requests, report.num_simulated) == (2000, 500)
    assert scale_to_window(3.0, window, capped) == 12.0  # 3 x 2000 / 500
    expected = float(result.num_preemptions.sum()) * 4
    assert report.num_preemptions.predicted == expected
