"""A plan's windows (hand-made arrivals), the length-mix buckets and the lower bound's
hand-worked figures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.plan.capacity import Bucketing, LengthBucket, group_windows
from optimizer.plan.errors import PlanError
from optimizer.plan.lower_bound import lower_bound
from optimizer.plan.windows import PlanWindow, cut_windows
from optimizer.workload import Workload


def _trace(arrivals, inp=100, out=10) -> Workload:
    n = len(arrivals)
    inp = np.full(n, inp) if np.isscalar(inp) else np.asarray(inp)
    out = np.full(n, out) if np.isscalar(out) else np.asarray(out)
    return Workload(np.asarray(arrivals, dtype=float), inp, out, name="hand")


def test_windows_by_hand_with_an_empty_one():
    wl = _trace([5, 15, 25, 655, 905, 1195], inp=[100, 200, 300, 400, 500, 600])
    ws = cut_windows(wl, 300.0)
    # span 1190 s: 3 whole windows and 290 s left (>= half a window: a fourth)
    assert [(w.start_s, w.end_s) for w in ws] == [
        (0.0, 300.0),
        (300.0, 600.0),
        (600.0, 900.0),
        (900.0, 1190.0),
    ]
    assert [w.num_requests for w in ws] == [3, 0, 1, 2]
    assert ws[0].mean_input_tokens == pytest.approx(200.0)
    assert ws[0].rate == pytest.approx(3 / 300)
    assert ws[1].rate == 0.0 and math.isnan(ws[1].mean_input_tokens)
    assert ws[3].rate == pytest.approx(2 / 290) and ws[3].mean_input_tokens == 550.0
    assert ws[2].label() == "window 2 (00:10-00:15)"


def test_a_short_remainder_joins_the_window_before():
    ws = cut_windows(_trace([0, 100, 400, 700, 1000]), 300.0)
    # span 1000 s: 3 windows and 100 s left (< 150 s): the third runs to 1000 s
    assert [(w.start_s, w.end_s, w.num_requests) for w in ws] == [
        (0.0, 300.0, 2),
        (300.0, 600.0, 1),
        (600.0, 1000.0, 2),
    ]


def test_windows_and_traces_that_do_not_fit_are_refused():
    wl = _trace([0, 100, 500])
    with pytest.raises(PlanError, match=r"--window 900 s is longer than trace 'hand'.*500 s"):
        cut_windows(wl, 900.0)
    with pytest.raises(PlanError, match=r"shorter than two windows of 300 s.*at least 600 s"):
        cut_windows(wl, 300.0)
    with pytest.raises(PlanError, match="--window"):
        cut_windows(wl, 0.0)
    assert len(cut_windows(wl, 250.0)) == 2


def _window(i, n, mean_in, mean_out, duration=900.0) -> PlanWindow:
    start = i * duration
    return PlanWindow(i, start, start + duration, 0, n, mean_in, mean_out)


def test_windows_of_one_mix_share_a_bucket_and_others_do_not():
    ws = (
        _window(0, 500, 1000.0, 200.0),
        _window(1, 900, 1100.0, 210.0),  # busiest: the first anchor
        _window(2, 400, 4000.0, 200.0),  # 3.6x the prompts: a bucket of its own
        _window(3, 0, math.nan, math.nan),  # no request: no bucket
        _window(4, 5, 3900.0, 190.0),  # too few requests to anchor: the nearest bucket
        _window(5, 300, 1000.0, 600.0),  # 3x the output: its own
    )
    ratio, bucket_of = group_windows(ws)
    assert ratio == 1.25
    assert bucket_of == (0, 0, 1, None, 1, 2)


def test_too_many_mixes_widen_the_ratio():
    ws = tuple(_window(i, 100, 100.0 * 1.5**i, 50.0) for i in range(6))
    ratio, bucket_of = group_windows(ws, max_buckets=3)
    assert ratio > 1.25 and len(set(bucket_of)) <= 3


def _bucketing(capacities, bucket_of) -> Bucketing:
    buckets = tuple(
        LengthBucket(b, (), 0, 0.0, 0.0, cap, 0.9, 1.0, 0.5, True, 1)
        for b, cap in enumerate(capacities)
    )
    return Bucketing(1.25, 30, 100, 0.0, buckets, tuple(bucket_of))


def test_the_lower_bound_by_hand():
    # four 15-min windows: 9, 4.5, 0 and 2 req/s; capacities 2.5 and 1.0 req/s per unit
    rates = (9.0, 4.5, 0.0, 2.0)
    ws = tuple(_window(i, int(r * 900), 500.0, 100.0) for i, r in enumerate(rates))
    lb = lower_bound(ws, _bucketing((2.5, 1.0), (0, 0, None, 1)), 2, 7.0, gpu_budget=8)
    # ceil(9 / 2.5) = 4, ceil(4.5 / 2.5) = 2, 0, ceil(2 / 1) = 2 units of 2 GPUs
    assert lb.units == (4, 2, 0, 2) and lb.gpus == (8, 4, 0, 4)
    # (8 + 4 + 0 + 4) GPUs x 0.25 h = 4 GPU-hours; mean 16 / 4 = 4 GPUs
    assert lb.gpu_hours == pytest.approx(4.0)
    assert lb.peak_gpus == 8 and lb.mean_gpus == pytest.approx(4.0)
    # (4 + 2 + 0 + 2) units x 0.25 h = 2 unit-hours at $7 per unit-hour
    assert lb.dollars == pytest.approx(14.0)


def test_a_peak_beyond_the_budget_names_the_window_and_the_shortfall():
    ws = tuple(_window(i, int(r * 900), 500.0, 100.0) for i, r in enumerate((1.0, 9.0)))
    with pytest.raises(PlanError) as err:
        lower_bound(ws, _bucketing((2.5,), (0, 0)), 2, None, gpu_budget=6)
    text = str(err.value)
    assert "window 1 (00:15-00:30)" in text and "9.00 req/s" in text
    assert "4 units = 8 GPUs" in text and "2 GPUs (33%) over the budget" in text
    assert "--gpus of at least 8" in text


def test_a_mix_no_unit_sustains_is_refused():
    ws = tuple(_window(i, 900, 500.0, 100.0) for i in range(2))
    with pytest.raises(PlanError, match=r"window 0 .* no rate of this length mix"):
        lower_bound(ws, _bucketing((0.0,), (0, 0)), 1, None, gpu_budget=8)
