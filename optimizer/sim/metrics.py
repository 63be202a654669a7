"""What a simulation measured: per-request latencies, percentiles, SLO goodput.

Recording happens in compact logs filled by the hot loop: `RunLog` (per request,
typed columns indexed by request id, and the run's ITL histogram) and one
`StepStats` per instance (`optimizer.sim.step_stats`: the steps' aggregates, in
memory that does not grow with steps). `build_result` turns them into a
`SimulationResult` with numpy arrays after the loop.

TTFT, TPOT, E2E, queueing and SLO attainment are exact (per request). ITL is
kept in a `LogHistogram` without a gap per token: between steps of a busy
instance every decoding sequence's gap equals the step's duration, so a step
contributes its duration with weight = number of such sequences. Gaps that are
not one step long (the first decode token after a PD transfer, the first token
after a preemption) are added one by one; with speculation the extra tokens of a
step arrive together and count as gaps of 0 (DOMAIN.md §2), exactly. ITL
percentiles are then within the histogram's `RELATIVE_ERROR` (0.5%) of the exact
nearest-rank ones; its mean and max are exact. Percentiles are nearest-rank
throughout.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field, replace

import numpy as np

from optimizer.sim.histogram import LogHistogram
from optimizer.sim.step_stats import StepSummary

_SERIES_POINTS = 500


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency targets; a request meets the SLO when it meets all of them."""

    ttft_s: float
    tpot_s: float
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"SLO.{name} must be a positive number of seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class Percentiles:
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: np.ndarray, weights: np.ndarray | None = None) -> Percentiles:
        if weights is None:
            values = values[~np.isnan(values)]
            weights = np.ones(values.shape[0])
        keep = weights > 0
        values, weights = values[keep], weights[keep]
        if values.size == 0:
            nan = math.nan
            return cls(nan, nan, nan, nan, nan)
        # Sorted by value, then weight: every figure, the mean included, is then the
        # same whatever order the values were logged in (the fast and general
        # scheduler paths log ITL gaps in different orders).
        order = np.lexsort((weights, values))
        v, w = values[order], weights[order]
        cw = np.cumsum(w)
        total = cw[-1]

        def rank(q: float) -> float:
            return float(v[min(int(np.searchsorted(cw, q * total, side="left")), v.size - 1)])

        mean = float(np.dot(v, w) / total)
        return cls(mean, rank(0.50), rank(0.90), rank(0.99), float(v[-1]))


class RunLog:
    """Per-request outcomes, written by instances (typed columns indexed by request id),
    the run's ITL histogram and the output tokens emitted.

    ITL samples count from `from_s` on (a closed loop's warm-up is left out: the loop
    sets it with `measure_from`); -inf measures from the start."""

    __slots__ = ("arrival_s", "finish_s", "first_sched_s", "first_token_s", "from_s", "itl",
                 "num_preemptions", "tokens_emitted")  # fmt: skip

    def __init__(self, num_requests: int) -> None:
        if num_requests < 0:
            raise ValueError(f"RunLog: num_requests must be >= 0, got {num_requests}")
        nan = array("d", [math.nan])
        self.arrival_s = nan * num_requests
        self.first_token_s = nan * num_requests
        self.finish_s = nan * num_requests
        self.first_sched_s = nan * num_requests
        self.num_preemptions = array("q", [0]) * num_requests
        self.itl = LogHistogram()
        self.tokens_emitted = 0
        self.from_s = -math.inf

    def __len__(self) -> int:
        return len(self.arrival_s)

    def measure_from(self, t: float) -> None:
        """Count ITL gaps that end after `t` only."""
        self.from_s = t

    def column(self, name: str) -> np.ndarray:
        """One per-request column as a numpy array over the log's own memory (no copy:
        writing to it writes the log)."""
        col = getattr(self, name)
        return np.frombuffer(col, dtype=np.int64 if col.typecode == "q" else np.float64)

    def scatter(self, part: RunLog, rids: np.ndarray) -> None:
        """Place `part` (a run of some of the requests, its request i being this run's
        `rids[i]`) into this log: its columns at `rids`, its ITL histogram and emitted
        tokens added to this run's."""
        rids = np.asarray(rids, dtype=np.int64)
        if rids.shape != (len(part),):
            raise ValueError(f"RunLog.scatter: {rids.size} request ids for a part of "
                             f"{len(part)} requests")  # fmt: skip
        if rids.size and not (rids.min() >= 0 and rids.max() < len(self)):
            raise ValueError(f"RunLog.scatter: request ids must be in [0, {len(self)})")
        for name in ("arrival_s", "first_token_s", "finish_s", "first_sched_s", "num_preemptions"):
            self.column(name)[rids] = part.column(name)
        self.itl.merge(part.itl)
        self.tokens_emitted += part.tokens_emitted


@dataclass(frozen=True, slots=True)
class PhaseBreakdown:
    """Where GPU time went (GPU-seconds = instance busy seconds x TP degree)."""

    num_steps: int
    prefill_only_gpu_s: float
    decode_only_gpu_s: float
    mixed_gpu_s: float
    num_prefill_only_steps: int
    num_decode_only_steps: int
    num_mixed_steps: int
    decode_tokens_in_mixed_steps: int
    prefill_stall_token_s: float  # sum over mixed steps of (extra time vs decode-only) x decodes
    itl_spike_tokens: int  # decode tokens in mixed steps slower than 2x their decode-only price
    num_preemptions: int


@dataclass(frozen=True, slots=True)
class InstanceSummary:
    role: str
    index: int
    tp: int
    num_steps: int
    busy_s: float
    num_preemptions: int
    kv_blocks: int
    prefix_hit_ratio: float | None
    series_t_s: np.ndarray  # bin starts (downsampled, duration-weighted means)
    series_batch_size: np.ndarray
    series_kv_utilization: np.ndarray
    peak_kv_used_blocks: int = 0
    leaked_blocks: int = 0  # KV blocks still allocated after the run (always 0 unless a bug)


@dataclass(frozen=True, slots=True)
class SimulationResult:
    num_requests: int
    num_gpus: int
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray  # nan for 1-token outputs
    e2e_s: np.ndarray
    queueing_s: np.ndarray
    num_preemptions: np.ndarray
    ttft: Percentiles
    tpot: Percentiles
    itl: Percentiles
    e2e: Percentiles
    queueing: Percentiles
    makespan_s: float
    request_throughput: float
    output_token_throughput: float
    output_tokens_per_gpu_s: float
    total_output_tokens: int
    phases: PhaseBreakdown
    instances: tuple[InstanceSummary, ...]
    num_floor_clamped_steps: int
    slo: SLO | None = None
    slo_attainment: float | None = None
    goodput: float | None = None
    num_rejected: int = 0  # requests the deployment cannot hold (NaN latencies, SLO misses)
    num_kv_transfers: int = 0
    kv_transfer_s: float = 0.0  # total link time of PD KV transfers
    latency_is_estimate: bool = False  # some role was priced by a roofline, not measurements
    num_tokens_emitted: int = 0  # output tokens the instances produced (conservation check)
    # ITL gaps (s) and how many tokens waited each one, as the histogram's bucket values
    # (`itl_hist.representatives()`): `itl` is their weighted percentiles, within the
    # histogram's error (its mean and max exact)
    itl_gaps_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    itl_gap_weights: np.ndarray = field(default_factory=lambda: np.zeros(0))
    itl_hist: LogHistogram = field(default_factory=LogHistogram)

    @property
    def num_completed(self) -> int:
        return int(np.count_nonzero(~np.isnan(self.e2e_s)))

    @property
    def request_rate_per_gpu(self) -> float:
        return self.request_throughput / self.num_gpus

    def meets(self, slo: SLO) -> np.ndarray:
        """Per request: TTFT, TPOT (when defined) and E2E (when set) within the SLO."""
        ok = self.ttft_s <= slo.ttft_s
        ok &= np.isnan(self.tpot_s) | (self.tpot_s <= slo.tpot_s)
        if slo.e2e_s is not None:
            ok &= self.e2e_s <= slo.e2e_s
        return ok

    def attainment(self, slo: SLO) -> float:
        return float(self.meets(slo).mean())

    def request_goodput(self, slo: SLO) -> float:
        """Requests meeting the SLO per second of the run (first arrival to last finish;
        0 when no request finished)."""
        return _per_s(float(self.meets(slo).sum()), self.makespan_s)


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """What `build_result` needs from each instance after the loop (plain data)."""

    role: str
    index: int
    tp: int
    kv_blocks: int
    steps: StepSummary
    num_preemptions: int
    prefix_hit_ratio: float | None
    leaked_blocks: int = 0


def _per_s(count: float, makespan_s: float) -> float:
    """`count` per second of a run; 0 for a run in which no request finished (no step
    beats the decode floor, so a run with a finished request lasts some time)."""
    return count / makespan_s if makespan_s > 0 else 0.0


def build_result(
    log: RunLog,
    records: list[InstanceRecord],
    *,
    first_measured: int = 0,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    num_gpus: int,
    num_floor_clamped_steps: int,
    slo: SLO | None,
    num_rejected: int = 0,
    num_kv_transfers: int = 0,
    kv_transfer_s: float = 0.0,
    latency_is_estimate: bool = False,
) -> SimulationResult:
    # A benchmark's warm-up requests (the first `first_measured`) are left out; so are
    # the steps and ITL gaps that ended before the first measured request was sent (the
    # loop set `from_s` of the log and of each instance's `StepStats` then).
    w = first_measured
    arrival = log.column("arrival_s")[w:]
    first = log.column("first_token_s")[w:]
    finish = log.column("finish_s")[w:]
    ttft = first - arrival
    e2e = finish - arrival
    out = np.asarray(output_tokens, dtype=np.int64)[w:]
    input_tokens = np.asarray(input_tokens)[w:]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    queueing = log.column("first_sched_s")[w:] - arrival
    finished = finish == finish  # a rejected request never finishes (NaN)
    makespan = float(np.nanmax(finish) - np.nanmin(arrival)) if finished.any() else 0.0
    total_out = int(out.sum())
    # Throughput is what was delivered: the finished requests and their output tokens.
    num_done, done_out = int(finished.sum()), int(out[finished].sum())

    horizon = makespan + float(np.nanmin(arrival)) if np.any(arrival == arrival) else 0.0
    ph = dict.fromkeys(("pre", "dec", "mix", "stall"), 0.0)
    counts = dict.fromkeys(("pre", "dec", "mix", "mixtok", "spike"), 0)
    summaries = []
    for rec in records:
        s = rec.steps
        ph["pre"] += s.prefill_only_s * rec.tp
        ph["dec"] += s.decode_only_s * rec.tp
        ph["mix"] += s.mixed_s * rec.tp
        ph["stall"] += s.prefill_stall_token_s
        counts["pre"] += s.num_prefill_only_steps
        counts["dec"] += s.num_decode_only_steps
        counts["mix"] += s.num_mixed_steps
        counts["mixtok"] += s.decode_tokens_in_mixed_steps
        counts["spike"] += s.itl_spike_tokens
        t_s, batch, util = s.series(horizon, rec.kv_blocks, _SERIES_POINTS)
        summaries.append(
            InstanceSummary(
                rec.role,
                rec.index,
                rec.tp,
                s.num_steps,
                s.busy_s,
                rec.num_preemptions,
                rec.kv_blocks,
                rec.prefix_hit_ratio,
                t_s,
                batch,
                util,
                s.peak_kv_used_blocks,
                rec.leaked_blocks,
            )
        )
    itl_gaps, itl_weights = log.itl.representatives()
    itl = Percentiles(
        log.itl.mean,
        log.itl.percentile(0.50),
        log.itl.percentile(0.90),
        log.itl.percentile(0.99),
        log.itl.max if log.itl.total > 0 else math.nan,
    )
    phases = PhaseBreakdown(
        num_steps=counts["pre"] + counts["dec"] + counts["mix"],
        prefill_only_gpu_s=ph["pre"],
        decode_only_gpu_s=ph["dec"],
        mixed_gpu_s=ph["mix"],
        num_prefill_only_steps=counts["pre"],
        num_decode_only_steps=counts["dec"],
        num_mixed_steps=counts["mix"],
        decode_tokens_in_mixed_steps=counts["mixtok"],
        prefill_stall_token_s=ph["stall"],
        itl_spike_tokens=counts["spike"],
        num_preemptions=sum(r.num_preemptions for r in records),
    )
    result = SimulationResult(
        num_requests=int(arrival.size),
        num_gpus=num_gpus,
        arrival_s=arrival,
        input_tokens=np.asarray(input_tokens, dtype=np.int64),
        output_tokens=out,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        queueing_s=queueing,
        num_preemptions=log.column("num_preemptions")[w:],
        ttft=Percentiles.of(ttft),
        tpot=Percentiles.of(tpot),
        itl=itl,
        e2e=Percentiles.of(e2e),
        queueing=Percentiles.of(queueing),
        makespan_s=makespan,
        request_throughput=_per_s(num_done, makespan),
        output_token_throughput=_per_s(done_out, makespan),
        output_tokens_per_gpu_s=_per_s(done_out, makespan) / num_gpus,
        total_output_tokens=total_out,
        phases=phases,
        instances=tuple(summaries),
        num_floor_clamped_steps=num_floor_clamped_steps,
        num_rejected=num_rejected,
        num_kv_transfers=num_kv_transfers,
        kv_transfer_s=kv_transfer_s,
        latency_is_estimate=latency_is_estimate,
        num_tokens_emitted=log.tokens_emitted,
        itl_gaps_s=itl_gaps,
        itl_gap_weights=itl_weights,
        itl_hist=log.itl,
    )
    if slo is None:
        return result
    return replace(
        result, slo=slo, slo_attainment=result.attainment(slo), goodput=result.request_goodput(slo)
    )
