"""The reactive fleet's policy as a KEDA `ScaledObject` users can apply (field names as
KEDA's ScaledObject specification and Prometheus scaler spell them, keda.sh/v1alpha1).

KEDA runs an HPA on an external metric: the `prometheus` trigger's `query` sums vLLM's
gauge over the Deployment's pods, and with `metricType: AverageValue` the HPA divides it
by the replicas and compares it with `threshold`, the target per replica: desired =
ceil(sum / threshold) = ceil(current x mean / target). `pollingInterval` decides 0 <-> 1
replica and `cooldownPeriod` the scale to zero (unused with `minReplicaCount` >= 1); from
1 to N the HPA decides, so the scale-down stabilisation goes in
`advanced.horizontalPodAutoscalerConfig.behavior`. The HPA's 10% tolerance and 15 s sync
period are the cluster's kube-controller-manager defaults; the object does not set them.

`serverAddress`, the Deployment's name and its namespace are placeholders the user sets
(the output says so).
"""

from __future__ import annotations

import re

import yaml

from optimizer.config import ServingConfig, ServingMode
from optimizer.sim.scaling import AutoscalerPolicy, ScalingMetric

PROMETHEUS_PLACEHOLDER = "http://PROMETHEUS-HOST:9090"  # set to your Prometheus
DEFAULT_NAMESPACE = "default"


def deployment_name(model: str) -> str:
    """A Kubernetes name for the model's Deployment: "vllm-" and the model's name in
    lower-case letters, digits and dashes (at most 63 characters)."""
    base = re.sub(r"[^a-z0-9]+", "-", model.rsplit("/", 1)[-1].lower()).strip("-")
    return f"vllm-{base}"[:63].rstrip("-")


def promql(policy: AutoscalerPolicy, deployment: str, namespace: str) -> str:
    """The gauge summed over the Deployment's pods."""
    sel = f'{{namespace="{namespace}", pod=~"{deployment}-.*"}}'
    if policy.metric is ScalingMetric.RUNNING_WAITING:
        return f"sum(vllm:num_requests_running{sel}) + sum(vllm:num_requests_waiting{sel})"
    return f"sum(vllm:kv_cache_usage_perc{sel})"


def scaled_object(
    policy: AutoscalerPolicy,
    deployment: str,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    server_address: str = PROMETHEUS_PLACEHOLDER,
) -> dict:
    """The ScaledObject as plain data (see the module docstring)."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": f"{deployment}-scaler", "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"name": deployment},
            "pollingInterval": round(policy.sync_period_s),
            "cooldownPeriod": round(policy.scale_down_stabilization_s),
            "minReplicaCount": policy.min_replicas,
            "maxReplicaCount": policy.max_replicas,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {"stabilizationWindowSeconds": 0},
                        "scaleDown": {
                            "stabilizationWindowSeconds": round(policy.scale_down_stabilization_s)
                        },
                    }
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": server_address,
                        "query": promql(policy, deployment, namespace),
                        "threshold": f"{policy.target:g}",
                    },
                }
            ],
        },
    }


def keda_yaml(
    policy: AutoscalerPolicy,
    unit: ServingConfig,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    server_address: str = PROMETHEUS_PLACEHOLDER,
) -> str:
    """The ScaledObject as YAML with a header saying what to set; for a P:D unit, only a
    comment saying why no single ScaledObject reproduces the fleet."""
    if unit.mode is ServingMode.DISAGGREGATED:
        return (
            "# No ScaledObject: the plan's unit is a P:D group (prefill and decode instances),\n"
            "# two Deployments that must scale together in the unit's ratio, which one KEDA\n"
            "# ScaledObject (one target) cannot do. Scale them with a planner that knows both\n"
            "# roles, or plan with a colocated --unit.\n"
        )
    deployment = deployment_name(unit.model)
    doc = scaled_object(policy, deployment, namespace=namespace, server_address=server_address)
    header = (
        f"# The reactive fleet of `servetune plan`: an HPA on {policy.metric.value} per replica\n"
        f"# (target {policy.target:g}), {policy.min_replicas}-{policy.max_replicas} replicas.\n"
        f"# Set: spec.triggers[0].metadata.serverAddress (a placeholder: your Prometheus),\n"
        f"# scaleTargetRef.name ({deployment}: your vLLM Deployment) and the namespace.\n"
        f"# The HPA's tolerance ({policy.tolerance:g}) and sync period "
        f"({policy.sync_period_s:g} s) are the cluster's defaults.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, width=1000)
