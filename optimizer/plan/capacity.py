"""The unit's SLO-bounded capacity per window: the highest request rate at which one unit
still has `attainment` of its requests meeting the SLOs, for the window's length mix.

Capacity depends on the mix, and a capacity search per window (672 for a week of 15-min
windows) is too slow, so windows are grouped by their mix and the capacity is searched
once per group (`optimizer.sim.max_sustainable_rate`, tune's search and settings):

- a window's mix is its mean prompt and mean output tokens. Windows are taken busiest
  first; each joins the first bucket whose anchor (the busiest window in it) has both
  means within x`ratio` (1.25) of its own, else it anchors a new bucket, so a bucket's
  windows differ from its anchor by under 25% in each mean and the busy bulk of a trace
  shares one bucket whatever noise its quiet windows carry. When that makes more than
  `max_buckets` buckets the ratio widens (x1.25 each time) until it does not;
- a window with fewer than `min_window_requests` requests (its means are noise) joins
  the bucket whose mean mix is nearest on the log scale;
- each bucket's sample: the arrival times of the trace's busiest `screen_requests`
  consecutive requests (the stretch tune screens on; the search only rescales them) with
  the lengths of as many requests drawn, seeded, from the bucket's windows (with
  replacement only when the bucket holds fewer).

`capacity_groups` groups the windows and places the sample; `measure_bucket` searches one
bucket's capacity, independently of the others (a part of the plan,
`optimizer.plan.parts`); `measure_capacities` does both in this process.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.plan.windows import PlanWindow
from optimizer.search.evaluation import EvalSettings
from optimizer.search.windows import busiest_start
from optimizer.sim import SimulationResult, max_sustainable_rate
from optimizer.workload import Workload

BUCKET_RATIO = 1.25
MAX_BUCKETS = 12
MIN_WINDOW_REQUESTS = 30


@dataclass(frozen=True, slots=True)
class LengthBucket:
    """Windows of one length mix and the unit's capacity for it."""

    index: int
    windows: tuple[int, ...]
    num_requests: int
    mean_input_tokens: float  # over the bucket's requests
    mean_output_tokens: float
    capacity_rps: float  # one unit's SLO-bounded request rate (0: none is sustainable)
    attainment: float  # measured at `capacity_rps` (at the lowest rate probed when 0)
    # Requests running + waiting in one unit at capacity: capacity x mean E2E (Little's law)
    concurrency: float
    kv_usage: float  # the KV cache's mean used share at capacity
    bounded: bool  # False: the search ran out of probes before converging
    num_simulations: int


@dataclass(frozen=True, slots=True)
class Bucketing:
    """How windows were grouped by mix, and each group's capacity."""

    ratio: float  # the ratio used (>= BUCKET_RATIO)
    min_window_requests: int
    sample_requests: int  # requests in each bucket's sample
    sample_start_s: float  # where the sample's arrivals start in the trace
    buckets: tuple[LengthBucket, ...]
    bucket_of: tuple[int | None, ...]  # per window (None: no request)

    def capacity_of(self, window: int) -> float | None:
        b = self.bucket_of[window]
        return None if b is None else self.buckets[b].capacity_rps

    def describe(self) -> str:
        return (
            f"{len(self.buckets)} length-mix bucket(s): a window shares the capacity of the "
            f"first bucket whose busiest window has mean prompt and output tokens within "
            f"x{self.ratio:.3g} of its own (windows under {self.min_window_requests} requests "
            f"join the nearest); each capacity is "
            f"searched once on {self.sample_requests:,} requests: the arrivals of the trace's "
            f"busiest {self.sample_requests:,} consecutive requests (from "
            f"{self.sample_start_s:,.0f} s) with lengths drawn from the bucket's windows"
        )


def _anchored(logs: np.ndarray, ratio: float) -> tuple[np.ndarray, list[int]]:
    """Each row's bucket (rows in order, busiest first) and each bucket's anchor row."""
    limit = math.log(ratio) + 1e-12
    anchors: list[int] = []
    out = np.empty(logs.shape[0], dtype=np.int64)
    for i, row in enumerate(logs):
        near = [b for b, a in enumerate(anchors) if np.abs(logs[a] - row).max() <= limit]
        if near:
            out[i] = near[0]
        else:
            out[i] = len(anchors)
            anchors.append(i)
    return out, anchors


def group_windows(
    windows: tuple[PlanWindow, ...],
    *,
    ratio: float = BUCKET_RATIO,
    max_buckets: int = MAX_BUCKETS,
    min_window_requests: int = MIN_WINDOW_REQUESTS,
) -> tuple[float, tuple[int | None, ...]]:
    """(the ratio used, each window's bucket: None for a window without requests).
    Buckets are numbered in the order their anchors were found (the busiest first)."""
    busy = [w for w in windows if w.num_requests > 0]
    if not busy:
        return ratio, tuple(None for _ in windows)
    big = [w for w in busy if w.num_requests >= min_window_requests] or busy
    big.sort(key=lambda w: (-w.num_requests, w.index))
    logs = np.log([[w.mean_input_tokens, w.mean_output_tokens] for w in big])
    width = ratio
    while True:
        bucket, anchors = _anchored(logs, width)
        if len(anchors) <= max_buckets:
            break
        width *= BUCKET_RATIO
    assigned = {w.index: int(b) for w, b in zip(big, bucket, strict=True)}
    for w in busy:  # the quiet windows join the bucket with the nearest anchor
        if w.index not in assigned:
            here = np.log([w.mean_input_tokens, w.mean_output_tokens])
            distance = [float(np.abs(logs[a] - here).max()) for a in anchors]
            assigned[w.index] = int(np.argmin(distance))
    return width, tuple(assigned.get(w.index) for w in windows)


def bucket_sample(
    workload: Workload,
    windows: tuple[PlanWindow, ...],
    members: tuple[int, ...],
    arrival_s: np.ndarray,
    seed: int,
) -> Workload:
    """`len(arrival_s)` requests at `arrival_s` with the lengths (and prefix hashes,
    acceptance lengths) of requests drawn from the windows `members`."""
    pool = np.concatenate([np.arange(windows[i].first, windows[i].stop) for i in members])
    n = arrival_s.shape[0]
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(pool, size=n, replace=pool.shape[0] < n))
    hashes = None
    if workload.prefix_hashes is not None:
        hashes = tuple(workload.prefix_hashes[i] for i in idx)
    acc = None if workload.acceptance_length is None else workload.acceptance_length[idx]
    return Workload(
        arrival_s=arrival_s,
        input_tokens=workload.input_tokens[idx],
        output_tokens=workload.output_tokens[idx],
        prefix_hashes=hashes,
        prefix_block_tokens=workload.prefix_block_tokens,
        acceptance_length=acc,
        name=f"{workload.name}~bucket" if workload.name else "",
    )


@dataclass(frozen=True, slots=True)
class CapacityGroups:
    """The windows grouped by mix (`group_windows`) and the sample every bucket's capacity
    is searched on: the arrivals of requests `sample_first` to `sample_first +
    sample_requests` (the trace's busiest stretch), rescaled by the search."""

    ratio: float
    bucket_of: tuple[int | None, ...]
    sample_first: int
    sample_requests: int

    @property
    def num_buckets(self) -> int:
        return max((b for b in self.bucket_of if b is not None), default=-1) + 1

    def members(self, bucket: int) -> tuple[int, ...]:
        return tuple(i for i, x in enumerate(self.bucket_of) if x == bucket)

    def bucketing(self, workload: Workload, buckets: tuple[LengthBucket, ...]) -> Bucketing:
        """The `Bucketing` of these groups with each bucket's measured capacity."""
        if tuple(b.index for b in buckets) != tuple(range(self.num_buckets)):
            raise ValueError(
                f"expected the {self.num_buckets} buckets' capacities in order, got buckets "
                f"{[b.index for b in buckets]}"
            )
        arrival = workload.arrival_s
        return Bucketing(
            ratio=self.ratio,
            min_window_requests=MIN_WINDOW_REQUESTS,
            sample_requests=self.sample_requests,
            sample_start_s=float(arrival[self.sample_first] - arrival[0]),
            buckets=buckets,
            bucket_of=self.bucket_of,
        )


def capacity_groups(
    workload: Workload, windows: tuple[PlanWindow, ...], settings: EvalSettings
) -> CapacityGroups:
    """How `measure_capacities` groups the windows and where its sample lies."""
    width, bucket_of = group_windows(windows)
    n = min(settings.screen_requests or len(workload), len(workload))
    start = busiest_start(workload.arrival_s, n) or 0
    return CapacityGroups(width, bucket_of, start, n)


def measure_bucket(
    workload: Workload,
    windows: tuple[PlanWindow, ...],
    groups: CapacityGroups,
    bucket: int,
    unit: ServingConfig,
    latency: LatencySource,
    settings: EvalSettings,
) -> LengthBucket:
    """One bucket's capacity (see the module docstring); independent of the others."""
    arrival = workload.arrival_s
    first, n = groups.sample_first, groups.sample_requests
    times = arrival[first : first + n] - arrival[first]
    members = groups.members(bucket)
    sample = bucket_sample(workload, windows, members, times, settings.seed + bucket)
    cap = max_sustainable_rate(
        sample,
        unit,
        latency,
        settings.slo,
        attainment=settings.attainment,
        seed=settings.seed,
        rel_tol=settings.rel_tol,
        max_simulations=settings.max_simulations,
    )
    res = cap.result
    e2e = res.e2e_s[~np.isnan(res.e2e_s)]
    concurrency = cap.request_rate * float(e2e.mean()) if e2e.size and cap.rate_scale else 0.0
    count = sum(windows[i].num_requests for i in members)
    return LengthBucket(
        index=bucket,
        windows=members,
        num_requests=count,
        mean_input_tokens=_mean(workload.input_tokens, windows, members, count),
        mean_output_tokens=_mean(workload.output_tokens, windows, members, count),
        capacity_rps=cap.request_rate,
        attainment=cap.attainment,
        concurrency=concurrency,
        kv_usage=_kv_usage(res),
        bounded=cap.bounded,
        num_simulations=cap.num_simulations,
    )


def measure_capacities(
    workload: Workload,
    windows: tuple[PlanWindow, ...],
    unit: ServingConfig,
    latency: LatencySource,
    settings: EvalSettings,
    *,
    on_step: Callable[[str], None] = lambda _m: None,
) -> Bucketing:
    """The windows grouped by mix and the unit's capacity for each group (see the module
    docstring), in this process."""
    groups = capacity_groups(workload, windows, settings)
    buckets = []
    for b in range(groups.num_buckets):
        on_step(f"capacity of length-mix bucket {b + 1}/{groups.num_buckets}")
        buckets.append(measure_bucket(workload, windows, groups, b, unit, latency, settings))
    return groups.bucketing(workload, tuple(buckets))


def _mean(
    tokens: np.ndarray, windows: tuple[PlanWindow, ...], members: tuple[int, ...], count: int
) -> float:
    total = sum(int(tokens[windows[i].first : windows[i].stop].sum()) for i in members)
    return total / count if count else math.nan


def _kv_usage(res: SimulationResult) -> float:
    """The KV cache's used share over the run, averaged over instances and time."""
    shares = [float(np.mean(i.series_kv_utilization)) for i in res.instances if i.num_steps]
    return float(np.mean(shares)) if shares else 0.0
