"""The reactive policy as a KEDA ScaledObject: the fields KEDA's specification names, the
PromQL over vLLM's gauges, the target as the threshold per replica."""

from __future__ import annotations

import yaml

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.plan.keda import PROMETHEUS_PLACEHOLDER, deployment_name, keda_yaml
from optimizer.sim.scaling import AutoscalerPolicy, ScalingMetric

UNIT = ServingConfig.colocated("llama-3.1-8b", InstanceConfig())


def _policy(metric=ScalingMetric.RUNNING_WAITING, target=12.5) -> AutoscalerPolicy:
    return AutoscalerPolicy(metric, target, 2, 9, scale_up_delay_s=68.0)


def test_the_scaled_object_has_keda_s_fields():
    text = keda_yaml(_policy(), UNIT, namespace="serving")
    assert "serverAddress (a placeholder" in text  # the header says what to set
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "keda.sh/v1alpha1" and doc["kind"] == "ScaledObject"
    assert doc["metadata"] == {"name": "vllm-llama-3-1-8b-scaler", "namespace": "serving"}
    spec = doc["spec"]
    assert spec["scaleTargetRef"] == {"name": "vllm-llama-3-1-8b"}
    assert spec["pollingInterval"] == 15 and spec["cooldownPeriod"] == 300
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 9)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["serverAddress"] == PROMETHEUS_PLACEHOLDER
    assert meta["threshold"] == "12.5"  # KEDA takes the threshold as a string
    sel = '{namespace="serving", pod=~"vllm-llama-3-1-8b-.*"}'
    assert meta["query"] == (
        f"sum(vllm:num_requests_running{sel}) + sum(vllm:num_requests_waiting{sel})"
    )


def test_the_kv_usage_policy_queries_the_kv_gauge():
    doc = yaml.safe_load(keda_yaml(_policy(ScalingMetric.KV_USAGE, 0.7), UNIT))
    meta = doc["spec"]["triggers"][0]["metadata"]
    assert meta["query"].startswith("sum(vllm:kv_cache_usage_perc{") and meta["threshold"] == "0.7"


def test_a_pd_unit_gets_no_scaled_object_and_says_why():
    pd = ServingConfig.disaggregated("llama-3.1-8b", InstanceConfig(), InstanceConfig())
    text = keda_yaml(_policy(), pd)
    assert yaml.safe_load(text) is None and "P:D group" in text


def test_deployment_names_are_kubernetes_names():
    assert deployment_name("meta-llama/Llama-3.1-8B-Instruct") == "vllm-llama-3-1-8b-instruct"
    assert len(deployment_name("x" * 200)) <= 63
