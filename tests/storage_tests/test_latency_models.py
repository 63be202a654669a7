"""Fitted latency models in the database: round trip, versions, errors, both back-ends."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.latency import StepLoad, build_catalog
from optimizer.latency.fit import fit_latency_model
from optimizer.latency.model import FitOptions
from optimizer.latency.persist import (
    PAYLOAD_SCHEMA_VERSION,
    PayloadError,
    dump_model,
    feature_names,
    load_model,
)
from optimizer.records import DeviceInfo, KernelSample, OpKind
from optimizer.shapes import get_shape
from storage.db import session_scope
from storage.latency_models import (
    HoldoutMetric,
    LatencyModelNotFound,
    get_latency_model,
    latest_latency_model,
    list_latency_models,
    load_latency_payload,
    save_latency_model,
)
from storage.profiles import create_profile_run


def _samples() -> list[KernelSample]:
    rng = np.random.default_rng(0)
    m = rng.integers(1, 4096, 300)
    t = 0.005 + m * 4096 * 4096 * 2 / 600e9
    return [
        KernelSample(OpKind.GEMM, float(x), float(x), float(x), num_tokens=int(a), n=4096, k=4096)
        for a, x in zip(m, t, strict=True)
    ]


def test_round_trip_and_versions(engine) -> None:
    samples = _samples()
    model = fit_latency_model(samples, accelerator="h100", source="test", options=FitOptions(50))
    metrics = (HoldoutMetric("gemm", "random", 60, 1.5, 4.25),)
    with session_scope(engine) as s:
        run = create_profile_run(
            s,
            name="r",
            source="aiconfigurator",
            accelerator="h100",
            device=DeviceInfo(kind="imported", name="H100"),
            samples=samples,
        )
        first = save_latency_model(
            s,
            name="h100-aic",
            accelerator="h100",
            payload=dump_model(model),
            schema_version=PAYLOAD_SCHEMA_VERSION,
            profile_run_id=run.id,
            tp_degrees=(1, 2),
            features=feature_names(model),
            metrics=metrics,
        )
        second = save_latency_model(
            s, name="h100-aic", accelerator="h100", payload=b"x", schema_version=99
        )
    assert (first.version, second.version) == (1, 2)
    with session_scope(engine) as s:
        info = get_latency_model(s, first.id)
        payload, version = load_latency_payload(s, first.id)
        assert latest_latency_model(s, name="h100-aic").id == second.id
        assert [m.id for m in list_latency_models(s, accelerator="h100")] == [first.id, second.id]
        assert list_latency_models(s, accelerator="a100") == []
    assert info.profile_run_id == run.id and info.tp_degrees == (1, 2)
    assert info.metrics == metrics and info.features == ("gemm:flops,bytes,log-shape v2",)
    assert info.created_at.tzinfo is not None and info.payload_bytes == len(payload)
    restored = load_model(payload, version)
    shape = get_shape("llama-3.1-8b")
    load = StepLoad(600, 65, (512,), (2048,), 64, 64 * 1000)
    a = build_catalog(shape, [model], tps=(1,)).for_instance("h100", 1).step_time_s(load)
    b = build_catalog(shape, [restored], tps=(1,)).for_instance("h100", 1).step_time_s(load)
    assert a == b


def test_errors(engine) -> None:
    with session_scope(engine) as s:
        with pytest.raises(LatencyModelNotFound, match="id 12345"):
            get_latency_model(s, 12345)
        with pytest.raises(LatencyModelNotFound):
            latest_latency_model(s, accelerator="h100")
        with pytest.raises(ValueError, match="empty payload"):
            save_latency_model(s, name="x", accelerator="h100", payload=b"", schema_version=1)
        with pytest.raises(ValueError, match="tp_degrees"):
            save_latency_model(
                s, name="x", accelerator="h100", payload=b"1", schema_version=1, tp_degrees=(0,)
            )
    with pytest.raises(PayloadError, match="schema_version"):
        load_model(b"not a model", PAYLOAD_SCHEMA_VERSION)
