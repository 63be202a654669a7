"""The Azure conv trace end to end on one replica (shared data; about a second)."""

from __future__ import annotations

import pytest

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.sim import SLO, simulate
from tests.factories import azure_workload


@pytest.mark.shared_data
def test_azure_conv_trace_completes_and_conserves_tokens(shared_data):
    wl = azure_workload(shared_data, "conv")
    lat = SingleLatencySource(LinearLatency(7e-3, 27e-6, 39e-9, 1e-9))
    cfg = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_batched_tokens=2048))
    res = simulate(wl, cfg, lat, slo=SLO(ttft_s=2.0, tpot_s=0.1))
    assert len(wl) == 19_366
    assert res.num_completed == 19_366 and res.num_rejected == 0
    assert res.num_tokens_emitted == wl.total_output_tokens == 4_088_665
    assert res.tpot.p50 >= 0.007  # never faster than a step's fixed cost
    assert 0.0 < res.slo_attainment <= 1.0
