"""The Azure conv trace end to end on one replica (shared data; about a second)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.sim import SLO, simulate
from optimizer.workload import Workload


@pytest.mark.shared_data
def test_azure_conv_trace_completes_and_conserves_tokens(shared_data):
    path = shared_data / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
    df = pl.read_csv(path, schema_overrides={"TIMESTAMP": pl.Utf8})
    ts = df["TIMESTAMP"].str.to_datetime("%Y-%m-%d %H:%M:%S%.f").dt.epoch("us").to_numpy()
    order = np.argsort(ts, kind="stable")
    wl = Workload(
        (ts[order] - ts[order][0]) / 1e6,
        df["ContextTokens"].to_numpy()[order],
        df["GeneratedTokens"].to_numpy()[order],
    )
    lat = SingleLatencySource(LinearLatency(7e-3, 27e-6, 39e-9, 1e-9))
    cfg = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_batched_tokens=2048))
    res = simulate(wl, cfg, lat, slo=SLO(ttft_s=2.0, tpot_s=0.1))
    assert len(wl) == 19_366
    assert res.num_completed == 19_366 and res.num_rejected == 0
    assert res.num_tokens_emitted == wl.total_output_tokens == 4_088_665
    assert res.tpot.p50 >= 0.007  # never faster than a step's fixed cost
    assert 0.0 < res.slo_attainment <= 1.0
