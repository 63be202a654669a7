"""The simulator's types for fleets that change size: the cold start and its defaults'
parts, replica schedules, and the HPA's recommendation (hand-worked)."""

from __future__ import annotations

import math

import pytest

from optimizer.config import ServingConfig
from optimizer.shapes import get_shape
from optimizer.sim.scaling import (
    DEFAULT_ENGINE_START_S,
    DEFAULT_STORAGE_GB_S,
    AutoscalerPolicy,
    ColdStart,
    ReplicaSchedule,
    ScalingError,
    ScalingMetric,
)


def test_a_cold_start_is_the_weights_at_the_storage_bandwidth_plus_the_engine_start():
    cold = ColdStart(weights_bytes=16_000_000_000, storage_gb_s=2.0, engine_start_s=60.0)
    assert cold.weights_s == pytest.approx(8.0)
    assert cold.total_s == pytest.approx(68.0)
    assert "16.0 GB of weights at 2 GB/s" in cold.describe()
    given = ColdStart(16_000_000_000, override_s=45.0)
    assert given.total_s == 45.0 and "given" in given.describe()


def test_the_default_cold_start_reads_the_whole_checkpoint_whatever_the_tp():
    cold = ColdStart.for_model("llama-3.1-8b")
    assert cold.weights_bytes == get_shape("llama-3.1-8b").weight_bytes(1)
    assert cold.storage_gb_s == DEFAULT_STORAGE_GB_S
    assert cold.engine_start_s == DEFAULT_ENGINE_START_S
    unit = ServingConfig.colocated("llama-3.1-8b")
    assert ColdStart.for_unit(unit, override_s=10.0).total_s == 10.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights_bytes": -1}, "weights_bytes"),
        ({"weights_bytes": 1, "storage_gb_s": 0.0}, "storage_gb_s"),
        ({"weights_bytes": 1, "engine_start_s": math.nan}, "engine_start_s"),
        ({"weights_bytes": 1, "override_s": -5.0}, "override_s"),
    ],
)
def test_a_bad_cold_start_names_its_field(kwargs, match):
    with pytest.raises(ScalingError, match=match):
        ColdStart(**kwargs)


def test_a_schedule_counts_replicas_from_each_time_on():
    s = ReplicaSchedule((-30.0, 0.0, 100.0, 250.0), (1, 2, 4, 1))
    assert s.count_at(-31.0) == 0 and s.count_at(-30.0) == 1 and s.count_at(99.9) == 2
    assert s.count_at(100.0) == 4 and s.count_at(1e9) == 1
    # [0, 300): 2 x 100 + 4 x 150 + 1 x 50 = 850 replica-seconds
    assert s.replica_seconds(0.0, 300.0) == pytest.approx(850.0)
    assert s.replica_seconds(300.0, 300.0) == 0.0
    # started after 0: +2 at 100 s (the step at 0 is the fleet warm at the start)
    assert s.num_started(0.0, 300.0) == 2
    assert s.num_started(-60.0, 300.0) == 3
    assert s.peak == 4


@pytest.mark.parametrize(
    ("times", "counts", "match"),
    [
        ((), (), "at least one"),
        ((0.0, 1.0), (1,), "2 times for 1 counts"),
        ((0.0, 0.0), (1, 2), r"times_s\[1\] = 0: expected times in ascending order"),
        ((0.0,), (-1,), r"counts\[0\]"),
        ((math.inf,), (1,), r"times_s\[0\]"),
        ((0.0,), (1.5,), r"counts\[0\]"),
    ],
)
def test_a_bad_schedule_says_where(times, counts, match):
    with pytest.raises(ScalingError, match=match):
        ReplicaSchedule(times, counts)


def _policy(**kw) -> AutoscalerPolicy:
    base = dict(
        metric=ScalingMetric.RUNNING_WAITING,
        target=4.0,
        min_replicas=2,
        max_replicas=10,
        scale_up_delay_s=68.0,
    )
    base.update(kw)
    return AutoscalerPolicy(**base)


def test_the_hpa_wants_ceil_current_times_metric_over_target():
    p = _policy()
    assert (p.tolerance, p.sync_period_s, p.scale_down_stabilization_s) == (0.1, 15.0, 300.0)
    assert p.desired(4, 6.0) == 6  # ceil(4 x 6 / 4)
    assert p.desired(3, 5.0) == 4  # ceil(3.75)
    assert p.desired(4, 4.3) == 4  # within 10% of the target: no change
    assert p.desired(4, 4.5) == 5  # 12.5% over: ceil(4.5)
    assert p.desired(4, 1.0) == 2  # ceil(1) = 1, held at min_replicas
    assert p.desired(8, 40.0) == 10  # ceil(80), held at max_replicas
    assert p.desired(0, 0.0) == 2 and p.desired(0, 3.0) == 2  # KEDA activates to the minimum
    assert _policy(min_replicas=0).desired(0, 0.0) == 0
    assert _policy(min_replicas=0).desired(0, 1.0) == 1


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"metric": "queue"}, "policy.metric"),
        ({"target": 0.0}, "policy.target"),
        ({"metric": ScalingMetric.KV_USAGE, "target": 80.0}, "a fraction"),
        ({"min_replicas": 3, "max_replicas": 2}, "policy.max_replicas"),
        ({"min_replicas": 0, "max_replicas": 0}, "policy.max_replicas"),
        ({"tolerance": 1.0}, "policy.tolerance"),
        ({"sync_period_s": 0.0}, "policy.sync_period_s"),
        ({"scale_up_delay_s": -1.0}, "policy.scale_up_delay_s"),
    ],
)
def test_a_bad_policy_names_its_field(kw, match):
    with pytest.raises(ScalingError, match=match):
        _policy(**kw)
