"""`simulate_parallel`: a round-robin fleet's replicas in forked processes give the serial
run's per-request results; fleets that cannot be split are refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.closed_loop_workload import ClosedLoopWorkload
from optimizer.config import InstanceConfig, RoutingPolicy, ServingConfig
from optimizer.hardware import get_accelerator
from optimizer.latency import compile_roofline
from optimizer.latency.analytic import SingleLatencySource
from optimizer.shapes import get_shape
from optimizer.sim import SLO, SimulationError, simulate
from optimizer.sim.parallel import replica_of_request, serial_reason, simulate_parallel
from optimizer.workload import Workload
from tests.factories import azure_workload

MODEL = "llama-3.1-8b"
ROOFLINE = SingleLatencySource(compile_roofline(get_shape(MODEL), get_accelerator("h100"), 1))
H100 = InstanceConfig(accelerator="h100", max_num_batched_tokens=2048)
SLO_ = SLO(ttft_s=0.5, tpot_s=0.05)


def assert_same_requests(serial, par) -> None:
    for name in ("arrival_s", "ttft_s", "tpot_s", "e2e_s", "queueing_s", "num_preemptions"):
        np.testing.assert_array_equal(getattr(par, name), getattr(serial, name), err_msg=name)
    assert par.num_rejected == serial.num_rejected
    assert par.slo_attainment == serial.slo_attainment
    assert par.num_tokens_emitted == serial.num_tokens_emitted
    assert [(i.index, i.num_steps) for i in par.instances] == [
        (i.index, i.num_steps) for i in serial.instances
    ]
    assert par.phases.num_steps == serial.phases.num_steps
    for name in ("mean", "p50", "p90", "p99", "max"):  # the same gaps, summed in another order
        assert getattr(par.itl, name) == pytest.approx(getattr(serial.itl, name), rel=1e-12)


def test_round_robin_turns_skip_rejected_requests():
    """Hand-worked: 3 replicas; request 2 is too long for the deployment and takes no turn."""
    cfg = ServingConfig.colocated(MODEL, H100, num_replicas=3)
    huge = 10_000_000
    wl = Workload(np.arange(6.0), [10, 10, huge, 10, 10, 10], [5, 5, 5, 5, 5, 5])
    assert replica_of_request(wl, cfg).tolist() == [0, 1, -1, 2, 0, 1]


def test_parallel_equals_serial_with_rejections_and_preemptions():
    rng = np.random.default_rng(7)
    n = 3000
    inp = rng.integers(10, 3000, n)
    inp[::97] = 1_000_000  # rejected at the front
    wl = Workload(np.cumsum(rng.exponential(0.004, n)), inp, rng.integers(1, 400, n))
    cfg = ServingConfig.colocated(MODEL, H100, num_replicas=5)
    serial = simulate(wl, cfg, ROOFLINE, seed=3, slo=SLO_)
    par = simulate_parallel(wl, cfg, ROOFLINE, jobs=2, seed=3, slo=SLO_)
    assert serial.num_rejected == len(range(0, n, 97))
    assert_same_requests(serial, par)


@pytest.mark.shared_data
def test_parallel_equals_serial_on_the_azure_conv_trace(shared_data):
    wl = azure_workload(shared_data, "conv")
    cfg = ServingConfig.colocated(MODEL, H100, num_replicas=4)
    serial = simulate(wl, cfg, ROOFLINE, slo=SLO_)
    par = simulate_parallel(wl, cfg, ROOFLINE, jobs=2, slo=SLO_)
    assert_same_requests(serial, par)


def test_fleets_that_cannot_be_split_say_why():
    wl = Workload(np.arange(4.0), [10] * 4, [5] * 4)
    least = ServingConfig.colocated(
        MODEL, H100, num_replicas=2, routing=RoutingPolicy.LEAST_OUTSTANDING_TOKENS
    )
    assert "least_outstanding_tokens routing" in serial_reason(wl, least)
    assert serial_reason(wl, ServingConfig.colocated(MODEL, H100)) == "one replica"
    closed = ClosedLoopWorkload.__new__(ClosedLoopWorkload)
    assert "closed loop" in serial_reason(closed, ServingConfig.colocated(MODEL, H100))
    with pytest.raises(SimulationError, match="least_outstanding_tokens routing"):
        simulate_parallel(wl, least, ROOFLINE, jobs=2)
    with pytest.raises(SimulationError, match="whole number of processes"):
        two = ServingConfig.colocated(MODEL, H100, num_replicas=2)
        simulate_parallel(wl, two, ROOFLINE, jobs=0)
