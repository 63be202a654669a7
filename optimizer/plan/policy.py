"""The reactive fleet's policy, derived from the unit's capacity (no constant fitted):

- target: what one unit holds at its SLO-bounded capacity on the busiest window's mix,
  requests running + waiting = capacity x mean E2E (Little's law; or the KV cache's used
  share), divided by 1 + the HPA's tolerance, so the HPA adds a unit before one passes
  its capacity rather than 10% after;
- min 1 unit (a fleet scaled to zero puts a cold start on the first request after every
  quiet spell), max the larger of the static fleet and the lower bound's peak;
- scale-up delay: the cold start; sync period, tolerance and scale-down stabilisation:
  the HPA's defaults (`optimizer.sim.scaling`).
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.plan.capacity import Bucketing
from optimizer.plan.errors import PlanError
from optimizer.plan.fleets import busiest_window
from optimizer.plan.lower_bound import LowerBound
from optimizer.plan.windows import PlanWindow
from optimizer.sim.scaling import HPA_TOLERANCE, AutoscalerPolicy, ColdStart, ScalingMetric


@dataclass(frozen=True, slots=True)
class PolicyBasis:
    """Where the policy's target comes from, for people."""

    window: int  # the busiest window
    bucket: int  # its length-mix bucket
    at_capacity: float  # the gauge per unit at the bucket's capacity

    def describe(self, policy: AutoscalerPolicy) -> str:
        gauge = (
            "requests running + waiting"
            if policy.metric is ScalingMetric.RUNNING_WAITING
            else "KV cache used share"
        )
        return (
            f"target {policy.target:g} = {gauge} per unit at capacity on the busiest window's "
            f"mix ({self.at_capacity:.3g}, bucket {self.bucket}) / (1 + tolerance "
            f"{policy.tolerance:g}); scale-up delay {policy.scale_up_delay_s:.0f} s (the cold "
            f"start); sync every {policy.sync_period_s:g} s; scale-down to the highest "
            f"recommendation of the last {policy.scale_down_stabilization_s:g} s"
        )


def reactive_policy(
    windows: tuple[PlanWindow, ...],
    bucketing: Bucketing,
    lower: LowerBound,
    static_units: int,
    cold_start: ColdStart,
    metric: ScalingMetric = ScalingMetric.RUNNING_WAITING,
) -> tuple[AutoscalerPolicy, PolicyBasis]:
    """The policy (see the module docstring) and where its target comes from."""
    peak = busiest_window(windows, lower)
    b = bucketing.bucket_of[peak.index]
    if b is None:
        raise PlanError("the trace has no request: no autoscaler target can be derived")
    bucket = bucketing.buckets[b]
    gauge = bucket.concurrency if metric is ScalingMetric.RUNNING_WAITING else bucket.kv_usage
    target = gauge / (1 + HPA_TOLERANCE)
    if metric is ScalingMetric.RUNNING_WAITING:
        target = max(0.1, round(target, 1))
    else:
        target = min(1.0, max(0.01, round(target, 2)))
    policy = AutoscalerPolicy(
        metric=metric,
        target=target,
        min_replicas=1,
        max_replicas=max(static_units, max(lower.units), 1),
        scale_up_delay_s=cold_start.total_s,
    )
    return policy, PolicyBasis(peak.index, b, gauge)
