"""Workload utilities: wrapping stored traces, scaling, windows, sampling, synthesis."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.closed_loop_workload import ClosedLoopWorkload
from optimizer.records import TraceColumns
from optimizer.workload import (
    ArrivalProcess,
    EmpiricalLength,
    FixedLength,
    LognormalLength,
    Workload,
    WorkloadError,
    infer_prefix_block_tokens,
    synthetic_workload,
)


def wl(n: int = 5) -> Workload:
    return Workload(np.arange(n, dtype=float), np.arange(1, n + 1) * 10, np.full(n, 3))


def test_from_columns_keeps_arrays_and_infers_the_hash_block_size():
    cols = TraceColumns(
        arrival_s=np.array([0.0, 1.5]),
        input_tokens=np.array([1000, 513]),
        output_tokens=np.array([5, 7]),
        prefix_hashes=[np.array([1, 2]), np.array([1, 3])],
        acceptance_length=np.array([2.5, np.nan]),
    )
    w = Workload.from_columns(cols, name="t")
    assert len(w) == 2 and w.prefix_block_tokens == 512
    assert w.input_tokens.dtype == np.int64 and w.arrival_s.dtype == np.float64
    assert w.duration_s == 1.5 and w.mean_rate == pytest.approx(1 / 1.5)
    assert w.total_output_tokens == 12
    assert np.isnan(w.acceptance_length[1])


def test_time_and_rate_scaling():
    w = wl()
    np.testing.assert_allclose(w.time_scaled(0.5).arrival_s, [0, 0.5, 1, 1.5, 2])
    np.testing.assert_allclose(w.rate_scaled(4).arrival_s, [0, 0.25, 0.5, 0.75, 1])
    assert w.rate_scaled(2).mean_rate == pytest.approx(2 * w.mean_rate)
    np.testing.assert_array_equal(w.rate_scaled(2).input_tokens, w.input_tokens)
    with pytest.raises(WorkloadError, match="positive finite"):
        w.time_scaled(0)


def test_window_rebases_and_head_and_sample():
    w = wl(10)
    win = w.window(2.0, 5.0)
    np.testing.assert_allclose(win.arrival_s, [0, 1, 2])
    np.testing.assert_array_equal(win.input_tokens, [30, 40, 50])
    with pytest.raises(WorkloadError, match=r"no request arrives in \[20"):
        w.window(20, 30)
    assert len(w.head(3)) == 3
    a, b = w.sample(4, seed=1), w.sample(4, seed=1)
    np.testing.assert_array_equal(a.input_tokens, b.input_tokens)
    assert np.all(np.diff(a.arrival_s) >= 0) and a.arrival_s[0] == 0
    with pytest.raises(WorkloadError, match="cannot sample 11 of 10"):
        w.sample(11, seed=0)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"arrival_s": [1.0, 0.5]}, r"must be sorted; arrival_s\[1\] < arrival_s\[0\]"),
        ({"input_tokens": [5, 0]}, r"input_tokens\[1\] = 0: token counts must be > 0"),
        ({"output_tokens": [5]}, r"output_tokens: 1 values for 2 arrivals"),
        ({"arrival_s": [0.0, math.inf]}, r"arrival_s\[1\] is not finite"),
    ],
)
def test_bad_workloads_are_rejected_with_where_and_what(kwargs, message):
    base = {"arrival_s": [0.0, 1.0], "input_tokens": [5, 6], "output_tokens": [1, 2]}
    base.update(kwargs)
    with pytest.raises(WorkloadError, match=message):
        Workload(**{k: np.asarray(v) for k, v in base.items()})


def test_synthetic_poisson_has_the_asked_rate_and_cv_one():
    w = synthetic_workload(
        20_000, 5.0, input_lengths=FixedLength(100), output_lengths=FixedLength(10), seed=3
    )
    gaps = np.diff(w.arrival_s)
    assert w.mean_rate == pytest.approx(5.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    again = synthetic_workload(
        20_000, 5.0, input_lengths=FixedLength(100), output_lengths=FixedLength(10), seed=3
    )
    np.testing.assert_array_equal(w.arrival_s, again.arrival_s)


def test_synthetic_gamma_cv_and_length_distributions():
    w = synthetic_workload(
        20_000, 2.0, arrival=ArrivalProcess.GAMMA, cv=3.0,
        input_lengths=LognormalLength(mean=800, sigma=0.8),
        output_lengths=EmpiricalLength((10, 20, 30)), seed=5,
    )  # fmt: skip
    gaps = np.diff(w.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)
    assert w.input_tokens.mean() == pytest.approx(800, rel=0.05)
    assert set(np.unique(w.output_tokens)) == {10, 20, 30}


def test_closed_loop_generation_and_validation():
    c = ClosedLoopWorkload.generate(
        4, 50, input_lengths=FixedLength(64), output_lengths=LognormalLength(50), seed=0
    )
    assert len(c) == 50 and c.num_clients == 4 and np.all(c.input_tokens == 64)
    with pytest.raises(WorkloadError, match="num_clients must be a positive integer"):
        ClosedLoopWorkload(0, np.array([1]), np.array([1]))


def test_infer_prefix_block_tokens_needs_a_unique_fit():
    assert infer_prefix_block_tokens(np.array([16, 17]), (np.arange(1), np.arange(2))) == 16
    with pytest.raises(WorkloadError, match="cannot infer"):
        infer_prefix_block_tokens(np.array([16]), (np.arange(5),))
