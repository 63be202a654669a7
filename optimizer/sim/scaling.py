"""Fleets that change size, as the simulator takes them (DOMAIN.md §11): what a joining
replica costs before it serves (`ColdStart`), a fleet's desired size over time
(`ReplicaSchedule`), the reactive fleet an autoscaler runs (`AutoscalerPolicy`), and what
a replay of such a fleet gives back (`FleetRun`).

Pure data with validation; `optimizer.sim.dynamic.simulate_fleet` replays them. A replica
counts as one unit (one replica, or one group of prefill and decode instances).

Cold start defaults, part by part (DOMAIN.md §11 asks which part comes from where):
- the pod and its image: 0 s, the image is taken to be cached on the node;
- the weights: the checkpoint's bytes (`ModelShape.weight_bytes` at tp 1: every rank's
  shard together, the whole checkpoint read from the node's storage) at
  `DEFAULT_STORAGE_GB_S` = 2 GB/s, a local NVMe SSD. A PCIe 4.0 x4 drive's datasheet
  says ~7 GB/s sequential; vLLM's safetensors loading through the page cache gets a
  fraction of it, so 2 GB/s is an assumed figure, not a measurement. Network volumes
  often read far less: a vLLM log in vllm-project/vllm#38820 shows 12.66 GiB loaded in
  31.7 s (~0.4 GB/s);
- the engine's start: `DEFAULT_ENGINE_START_S` = 60 s for process start, the profile
  run, torch.compile and CUDA-graph capture, not scaled by model size (compilation and
  capture grow with the captured batch sizes and the layer code, not with parameter
  bytes; the weights' part already scales with size). An assumption: vLLM logs show
  3.5-8.5 s of Dynamo transform alone, and Baseten's compile-cache notes report 5-20 s
  of compilation with a warm cache and more without.
`--cold-start-s` (`ColdStart.override_s`) replaces the whole figure with the user's own.

HPA and KEDA figures (the Kubernetes and KEDA defaults, DOMAIN.md §11): the HPA syncs
every 15 s, ignores a metric within 10% of its target, scales up at once and scales down
to the highest recommendation of the last 300 s. KEDA's `pollingInterval` (30 s by
default) only decides 0 <-> 1 replica; from 1 to N the HPA decides, every sync period, so
`AutoscalerPolicy.sync_period_s` is the HPA's 15 s.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from enum import StrEnum

from optimizer.config import ServingConfig
from optimizer.shapes import ShapeError, get_shape
from optimizer.sim.metrics import SimulationResult

DEFAULT_STORAGE_GB_S = 2.0  # local NVMe through vLLM's safetensors loader (assumed)
DEFAULT_ENGINE_START_S = 60.0  # process, profile run, torch.compile, CUDA graphs (assumed)
HPA_SYNC_PERIOD_S = 15.0  # kube-controller-manager --horizontal-pod-autoscaler-sync-period
HPA_TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance
HPA_SCALE_DOWN_STABILIZATION_S = 300.0  # behavior.scaleDown.stabilizationWindowSeconds


class ScalingError(ValueError):
    """A cold start, replica schedule or autoscaler policy is invalid (the message names
    the field and what was expected)."""


def _finite(name: str, value: object, *, low: float = 0.0, strict: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or (strict and value == low):
        sign = ">" if strict else ">="
        raise ScalingError(f"{name}: expected a finite number {sign} {low:g}, got {value!r}")
    return float(value)


def _count(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ScalingError(f"{name}: expected a whole number >= 0, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ColdStart:
    """Seconds from a replica's start until it serves: its weights read at the storage's
    bandwidth, plus the engine's start-up and graph capture (see the module docstring for
    the defaults' sources); `override_s` replaces the whole figure."""

    weights_bytes: int  # the checkpoint a joining replica reads
    storage_gb_s: float = DEFAULT_STORAGE_GB_S
    engine_start_s: float = DEFAULT_ENGINE_START_S
    override_s: float | None = None  # the user's own figure (--cold-start-s)

    def __post_init__(self) -> None:
        _count("cold_start.weights_bytes", self.weights_bytes)
        _finite("cold_start.storage_gb_s", self.storage_gb_s, strict=True)
        _finite("cold_start.engine_start_s", self.engine_start_s)
        if self.override_s is not None:
            _finite("cold_start.override_s", self.override_s)

    @classmethod
    def for_model(
        cls,
        model: str,
        *,
        override_s: float | None = None,
        storage_gb_s: float = DEFAULT_STORAGE_GB_S,
        engine_start_s: float = DEFAULT_ENGINE_START_S,
    ) -> ColdStart:
        """The cold start of a replica of `model`: its whole checkpoint read (every TP
        rank's shard from one node's storage; the instances of a P:D group start in
        parallel, each reading the same checkpoint)."""
        try:
            weights = get_shape(model).weight_bytes(1)
        except ShapeError as exc:
            raise ScalingError(f"cold_start: {exc}") from None
        return cls(weights, storage_gb_s, engine_start_s, override_s)

    @classmethod
    def for_unit(cls, unit: ServingConfig, *, override_s: float | None = None) -> ColdStart:
        """The cold start of one unit of `unit` with the default bandwidth and start-up."""
        return cls.for_model(unit.model, override_s=override_s)

    @property
    def weights_s(self) -> float:
        return self.weights_bytes / (self.storage_gb_s * 1e9)

    @property
    def total_s(self) -> float:
        """Seconds until a joining replica serves."""
        if self.override_s is not None:
            return self.override_s
        return self.weights_s + self.engine_start_s

    def describe(self) -> str:
        if self.override_s is not None:
            return f"cold start {self.override_s:g} s (given)"
        return (
            f"cold start {self.total_s:.0f} s = {self.weights_bytes / 1e9:.1f} GB of weights at "
            f"{self.storage_gb_s:g} GB/s ({self.weights_s:.0f} s, local NVMe, assumed) + "
            f"{self.engine_start_s:g} s engine start-up and graph capture (assumed); the pod's "
            "image taken as cached; --cold-start-s sets your own"
        )


@dataclass(frozen=True, slots=True)
class ReplicaSchedule:
    """The desired number of replicas from each time on: `counts[i]` from `times_s[i]`
    (seconds from the trace's first arrival) until the next time; none before the first.
    Times may be negative (a replica started before the trace so that it serves at 0)."""

    times_s: tuple[float, ...]
    counts: tuple[int, ...]

    def __post_init__(self) -> None:
        times, counts = tuple(self.times_s), tuple(self.counts)
        if not times:
            raise ScalingError("schedule: expected at least one (time, count) step")
        if len(times) != len(counts):
            raise ScalingError(f"schedule: {len(times)} times for {len(counts)} counts")
        for i, (t, c) in enumerate(zip(times, counts, strict=True)):
            _finite(f"schedule.times_s[{i}]", t, low=-math.inf)
            _count(f"schedule.counts[{i}]", c)
            if i and not t > times[i - 1]:
                raise ScalingError(
                    f"schedule.times_s[{i}] = {t:g}: expected times in ascending order "
                    f"(after {times[i - 1]:g})"
                )
        object.__setattr__(self, "times_s", tuple(float(t) for t in times))
        object.__setattr__(self, "counts", counts)

    @classmethod
    def constant(cls, count: int, start_s: float = 0.0) -> ReplicaSchedule:
        return cls((start_s,), (count,))

    def count_at(self, t_s: float) -> int:
        """Replicas wanted at `t_s` (0 before the first step)."""
        i = bisect_right(self.times_s, t_s) - 1
        return self.counts[i] if i >= 0 else 0

    def replica_seconds(self, start_s: float, end_s: float) -> float:
        """The integral of the count over [start_s, end_s)."""
        if end_s <= start_s:
            return 0.0
        total = 0.0
        bounds = (*self.times_s[1:], math.inf)
        for t, nxt, c in zip(self.times_s, bounds, self.counts, strict=True):
            lo, hi = max(t, start_s), min(nxt, end_s)
            if hi > lo:
                total += c * (hi - lo)
        return total

    def num_started(self, start_s: float, end_s: float) -> int:
        """Replicas added by the steps in (start_s, end_s]: the cold starts a fleet that
        is warm at `start_s` makes."""
        added = 0
        for i in range(1, len(self.times_s)):
            if start_s < self.times_s[i] <= end_s:
                added += max(0, self.counts[i] - self.counts[i - 1])
        return added

    @property
    def peak(self) -> int:
        return max(self.counts)


class ScalingMetric(StrEnum):
    """The vLLM gauge an autoscaler reads, per replica."""

    RUNNING_WAITING = "running_waiting"  # vllm:num_requests_running + vllm:num_requests_waiting
    KV_USAGE = "kv_usage"  # vllm:kv_cache_usage_perc (a fraction, 0-1)


@dataclass(frozen=True, slots=True)
class AutoscalerPolicy:
    """A reactive fleet as an HPA reading Prometheus (directly or through KEDA) runs it:
    every `sync_period_s` it sums `metric` over the replicas that report it and divides
    by the `current` replicas its Deployment counts (an external metric with an
    `AverageValue` target; `optimizer.sim.dynamic` says which replicas), and wants
    desired = ceil(current x metric / target) replicas (no change within `tolerance` of
    the target), between `min_replicas` and `max_replicas`. A replica it adds serves
    after `scale_up_delay_s` (its cold start); a scale-down takes the highest
    recommendation of the last `scale_down_stabilization_s`, and a leaving replica
    drains (finishes its running requests, takes no new ones)."""

    metric: ScalingMetric
    target: float  # per replica: requests running + waiting, or the KV cache's used share
    min_replicas: int
    max_replicas: int
    scale_up_delay_s: float  # the cold start
    tolerance: float = HPA_TOLERANCE
    sync_period_s: float = HPA_SYNC_PERIOD_S
    scale_down_stabilization_s: float = HPA_SCALE_DOWN_STABILIZATION_S

    def __post_init__(self) -> None:
        if not isinstance(self.metric, ScalingMetric):
            names = [m.value for m in ScalingMetric]
            raise ScalingError(f"policy.metric: expected one of {names}, got {self.metric!r}")
        _finite("policy.target", self.target, strict=True)
        if self.metric is ScalingMetric.KV_USAGE and self.target > 1:
            raise ScalingError(
                f"policy.target: vllm:kv_cache_usage_perc is a fraction; expected a target "
                f"in (0, 1], got {self.target:g}"
            )
        _count("policy.min_replicas", self.min_replicas)
        _count("policy.max_replicas", self.max_replicas)
        if self.max_replicas < max(1, self.min_replicas):
            raise ScalingError(
                f"policy.max_replicas: expected at least max(1, min_replicas = "
                f"{self.min_replicas}), got {self.max_replicas}"
            )
        _finite("policy.scale_up_delay_s", self.scale_up_delay_s)
        tol = _finite("policy.tolerance", self.tolerance)
        if tol >= 1:
            raise ScalingError(f"policy.tolerance: expected a share in [0, 1), got {tol:g}")
        _finite("policy.sync_period_s", self.sync_period_s, strict=True)
        _finite("policy.scale_down_stabilization_s", self.scale_down_stabilization_s)

    def desired(self, current: int, metric: float) -> int:
        """The HPA's recommendation for `current` replicas whose mean gauge is `metric`,
        before the scale-down stabilisation (which needs the loop's history)."""
        _count("current", current)
        value = _finite("metric", metric)
        if current == 0:  # KEDA activates a scaled-to-zero target at any load
            want = self.min_replicas if value <= 0 else max(1, self.min_replicas)
        elif abs(value / self.target - 1.0) <= self.tolerance:
            want = current
        else:
            want = math.ceil(current * value / self.target - 1e-9)
        return min(self.max_replicas, max(self.min_replicas, want))


@dataclass(frozen=True, slots=True)
class FleetRun:
    """A replay of a fleet that changes size: the requests' results, the units held
    (started, serving or draining: what is paid for) and the units ready to serve, over
    time, and how many units started cold during the replay."""

    result: SimulationResult
    provisioned: ReplicaSchedule
    ready: ReplicaSchedule
    num_cold_starts: int

    def __post_init__(self) -> None:
        _count("run.num_cold_starts", self.num_cold_starts)
