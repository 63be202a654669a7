"""A closed loop's clients out of step (`ClosedLoopWorkload.out_of_step`: the other end
of the client's burst, which benchmarks/bench_devset.py compares measured runs with)."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.closed_loop_workload import NO_FRONTEND, ClosedLoopWorkload
from optimizer.workload import WorkloadError


def _loop(prompt: int, n: int = 20, clients: int = 2, warmups: int = 0, release=None):
    return ClosedLoopWorkload(
        num_clients=clients, input_tokens=np.full(n, prompt), output_tokens=np.full(n, 2),
        frontend=NO_FRONTEND, num_warmups=warmups, release_s=release,
    )  # fmt: skip


def test_out_of_step_drops_the_warm_ups_and_spreads_the_first_sends_over_a_cycle():
    w = _loop(100, n=12, clients=3, warmups=2)
    out = w.out_of_step(0.5, seed=3)
    assert len(out) == 10 and out.num_warmups == 0 and out.num_clients == 3
    rel = out.release_s
    assert rel is not None and np.all(np.diff(rel) >= 0)
    assert rel[0] >= 0.0 and rel[2] < 0.5  # each client's first send within one cycle
    assert np.all(rel[3:] == rel[2])  # the later sends wait only for their slot
    assert len(set(rel[:3])) == 3  # independent phases, not one burst
    assert np.array_equal(out.release_s, w.out_of_step(0.5, seed=3).release_s)
    assert not np.array_equal(out.release_s, w.out_of_step(0.5, seed=4).release_s)
    # a request schedule already spreads the sends: refused, not overwritten
    paced = _loop(100, n=12, clients=3, warmups=2, release=np.linspace(0.0, 5.5, 12))
    with pytest.raises(WorkloadError, match="request schedule"):
        paced.out_of_step(0.5)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(WorkloadError, match="cycle_s"):
            w.out_of_step(bad)
