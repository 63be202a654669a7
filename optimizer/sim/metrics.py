"""What a simulation measured: per-request latencies, percentiles, SLO goodput.

Recording happens in two cheap logs filled by the hot loop: `RunLog` (per
request, indexed by request id) and one `StepLog` per instance (per step:
end time, duration, decode count, ...). `build_result` turns them into a
`SimulationResult` with numpy arrays after the loop.

ITL is exact without storing a gap per token: between steps of a busy
instance every decoding sequence's gap equals the step's duration, so a step
contributes its duration with weight = number of such sequences. Gaps that are
not one step long (the first decode token after a PD transfer, the first token
after a preemption) are stored individually; with speculation the extra tokens
of a step arrive together and count as gaps of 0 (DOMAIN.md §2).
Percentiles are nearest-rank throughout.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

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
    """Per-request outcomes, written by instances (lists indexed by request id)."""

    __slots__ = ("arrival_s", "finish_s", "first_sched_s", "first_token_s", "itl_gaps",
                 "num_preemptions", "num_zero_gaps", "tokens_emitted")  # fmt: skip

    def __init__(self, num_requests: int) -> None:
        nan = math.nan
        self.arrival_s = [nan] * num_requests
        self.first_token_s = [nan] * num_requests
        self.finish_s = [nan] * num_requests
        self.first_sched_s = [nan] * num_requests
        self.num_preemptions = [0] * num_requests
        self.itl_gaps: list[float] = []
        self.num_zero_gaps = 0  # speculative tokens that arrived with another (ITL gaps of 0)
        self.tokens_emitted = 0


class StepLog:
    """One row per step of one instance (compact typed arrays, one per column).

    The scheduler appends to the columns directly after each step (a method call
    per step is measurable in the hot loop)."""

    __slots__ = ("dur", "end", "kv_q1", "kv_used", "n_dec", "n_seqs")

    def __init__(self) -> None:
        self.end = array("d")
        self.dur = array("d")
        self.n_dec = array("q")
        self.n_seqs = array("q")
        self.kv_used = array("q")
        self.kv_q1 = array("q")

    def __len__(self) -> int:
        return len(self.end)

    def add_run(
        self,
        ends: np.ndarray,
        durs: np.ndarray,
        n_dec: int,
        kv_used: np.ndarray,
        kv_q1: np.ndarray,
    ) -> None:
        """Rows of k decode-only steps of `n_dec` sequences at once (a decode stretch):
        their end times and durations (s), KV blocks used and KV tokens attended, each
        an array of k."""
        k = len(ends)
        self.end.frombytes(np.ascontiguousarray(ends, dtype=np.float64).tobytes())
        self.dur.frombytes(np.ascontiguousarray(durs, dtype=np.float64).tobytes())
        counts = array("q", [n_dec]) * k
        self.n_dec.extend(counts)
        self.n_seqs.extend(counts)
        self.kv_used.frombytes(np.ascontiguousarray(kv_used, dtype=np.int64).tobytes())
        self.kv_q1.frombytes(np.ascontiguousarray(kv_q1, dtype=np.int64).tobytes())


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
    # ITL gaps (s) and how many tokens waited each one: `itl` is their weighted percentiles
    itl_gaps_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    itl_gap_weights: np.ndarray = field(default_factory=lambda: np.zeros(0))

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
    """What `build_result` needs from each instance after the loop."""

    role: str
    index: int
    tp: int
    kv_blocks: int
    steps: StepLog
    num_preemptions: int
    prefix_hit_ratio: float | None
    decode_only_time: Callable[[int, int], float]
    leaked_blocks: int = 0


def _per_s(count: float, makespan_s: float) -> float:
    """`count` per second of a run; 0 for a run in which no request finished (no step
    beats the decode floor, so a run with a finished request lasts some time)."""
    return count / makespan_s if makespan_s > 0 else 0.0


def _series(steps: StepLog, kv_blocks: int, horizon: float) -> tuple[np.ndarray, ...]:
    end = np.frombuffer(steps.end, dtype=np.float64)
    dur = np.frombuffer(steps.dur, dtype=np.float64)
    edges = np.linspace(0.0, horizon, _SERIES_POINTS + 1)
    if end.size == 0:
        zeros = np.zeros(_SERIES_POINTS)
        return edges[:-1], zeros, zeros
    b = np.clip(np.searchsorted(edges, end - dur, side="right") - 1, 0, _SERIES_POINTS - 1)
    w = np.bincount(b, weights=dur, minlength=_SERIES_POINTS)
    seqs = np.bincount(
        b, weights=dur * np.frombuffer(steps.n_seqs, dtype=np.int64), minlength=_SERIES_POINTS
    )
    kv = np.bincount(
        b, weights=dur * np.frombuffer(steps.kv_used, dtype=np.int64), minlength=_SERIES_POINTS
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        batch = np.where(w > 0, seqs / w, 0.0)
        util = np.where(w > 0, kv / w / max(kv_blocks, 1), 0.0)
    return edges[:-1], batch, util


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
    # A benchmark's warm-up requests (the first `first_measured`) are left out, and so are
    # the steps that ended before the first measured request was sent.
    w = first_measured
    arrival = np.asarray(log.arrival_s)[w:]
    first = np.asarray(log.first_token_s)[w:]
    finish = np.asarray(log.finish_s)[w:]
    ttft = first - arrival
    e2e = finish - arrival
    out = np.asarray(output_tokens, dtype=np.int64)[w:]
    input_tokens = np.asarray(input_tokens)[w:]
    window_start = float(np.nanmin(arrival)) if w and np.any(arrival == arrival) else -math.inf
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    queueing = np.asarray(log.first_sched_s)[w:] - arrival
    finished = finish == finish  # a rejected request never finishes (NaN)
    makespan = float(np.nanmax(finish) - np.nanmin(arrival)) if finished.any() else 0.0
    total_out = int(out.sum())
    # Throughput is what was delivered: the finished requests and their output tokens.
    num_done, done_out = int(finished.sum()), int(out[finished].sum())

    itl_vals = [np.asarray(log.itl_gaps, dtype=np.float64), np.zeros(1)]
    itl_w = [np.ones(len(log.itl_gaps)), np.full(1, float(log.num_zero_gaps))]
    ph = dict.fromkeys(("pre", "dec", "mix"), 0.0)
    counts = dict.fromkeys(("pre", "dec", "mix", "mixtok", "spike"), 0)
    stall = 0.0
    summaries = []
    for rec in records:
        s = rec.steps
        measured = np.frombuffer(s.end, dtype=np.float64) > window_start
        dur = np.frombuffer(s.dur, dtype=np.float64)[measured]
        n_dec = np.frombuffer(s.n_dec, dtype=np.int64)[measured]
        n_seqs = np.frombuffer(s.n_seqs, dtype=np.int64)[measured]
        itl_vals.append(dur)
        itl_w.append(n_dec.astype(np.float64))  # each decoding sequence waited the step
        pre, dec = n_dec == 0, n_seqs == n_dec
        mix = ~pre & ~dec
        ph["pre"] += float(dur[pre].sum()) * rec.tp
        ph["dec"] += float(dur[dec].sum()) * rec.tp
        ph["mix"] += float(dur[mix].sum()) * rec.tp
        counts["pre"] += int(pre.sum())
        counts["dec"] += int(dec.sum())
        counts["mix"] += int(mix.sum())
        kv_q1 = np.frombuffer(s.kv_q1, dtype=np.int64)[measured]
        for i in np.flatnonzero(mix):
            base = rec.decode_only_time(int(n_dec[i]), int(kv_q1[i]))
            stall += max(float(dur[i]) - base, 0.0) * int(n_dec[i])
            counts["mixtok"] += int(n_dec[i])
            if dur[i] > 2.0 * base:
                counts["spike"] += int(n_dec[i])
        t_s, batch, util = _series(s, rec.kv_blocks, makespan + float(np.nanmin(arrival)))
        summaries.append(
            InstanceSummary(
                rec.role,
                rec.index,
                rec.tp,
                len(s),
                float(dur.sum()),
                rec.num_preemptions,
                rec.kv_blocks,
                rec.prefix_hit_ratio,
                t_s,
                batch,
                util,
                int(np.frombuffer(s.kv_used, dtype=np.int64).max(initial=0)),
                rec.leaked_blocks,
            )
        )
    itl_gaps, itl_weights = np.concatenate(itl_vals), np.concatenate(itl_w)
    phases = PhaseBreakdown(
        num_steps=counts["pre"] + counts["dec"] + counts["mix"],
        prefill_only_gpu_s=ph["pre"],
        decode_only_gpu_s=ph["dec"],
        mixed_gpu_s=ph["mix"],
        num_prefill_only_steps=counts["pre"],
        num_decode_only_steps=counts["dec"],
        num_mixed_steps=counts["mix"],
        decode_tokens_in_mixed_steps=counts["mixtok"],
        prefill_stall_token_s=stall,
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
        num_preemptions=np.asarray(log.num_preemptions, dtype=np.int64)[w:],
        ttft=Percentiles.of(ttft),
        tpot=Percentiles.of(tpot),
        itl=Percentiles.of(itl_gaps, itl_weights),
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
    )
    if slo is None:
        return result
    return replace(
        result, slo=slo, slo_attainment=result.attainment(slo), goodput=result.request_goodput(slo)
    )
