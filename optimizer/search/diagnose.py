"""Did it help prefill or decode? A phase breakdown of one config, and a plain account of
why the recommendation beats the baseline (issue item 7).

Both configs are simulated at the same load (the baseline's capacity, or the trace's
rate) and described by the simulator's counters: the share of GPU time in
prefill-only, decode-only and mixed steps; the arithmetic intensity of a typical
decode step and a full prefill chunk against the GPU's ridge point; KV-cache
utilisation and preemptions; the queueing share of TTFT; decode tokens whose
step was stretched by a co-scheduled prefill chunk (ITL spikes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from optimizer.config import ServingConfig, ServingMode
from optimizer.search.objective import Evaluation, TraceEvaluator
from optimizer.sim import SimulationResult


@dataclass(frozen=True, slots=True)
class PhaseDiagnosis:
    label: str
    rate: float  # fleet requests/s the breakdown was taken at
    prefill_share: float  # of busy GPU time: prefill-only steps
    decode_share: float
    mixed_share: float
    mean_batch: float  # sequences per step, duration-weighted
    decode_intensity: float  # FLOP/byte of a typical decode step
    prefill_intensity: float  # FLOP/byte of a full prefill chunk
    ridge: float  # the GPU's ridge point, FLOP/byte
    kv_utilization: float  # mean share of KV blocks in use
    num_preemptions: int
    queueing_share_of_ttft: float
    itl_spike_share: float  # decode tokens delayed > 2x by co-scheduled prefill
    itl_p99_ms: float
    ttft_p90_ms: float
    tpot_p90_ms: float
    attainment: float

    @property
    def decode_bound(self) -> str:
        return "compute-bound" if self.decode_intensity >= self.ridge else "bandwidth-bound"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    baseline: PhaseDiagnosis
    recommendation: PhaseDiagnosis | None
    account: tuple[str, ...]  # plain-language paragraphs


def _first_instance(config: ServingConfig):
    return config.roles()[-1].instance  # replica, or the decode role


def breakdown(
    label: str, config: ServingConfig, result: SimulationResult, rate: float
) -> PhaseDiagnosis:
    ph = result.phases
    busy = ph.prefill_only_gpu_s + ph.decode_only_gpu_s + ph.mixed_gpu_s
    share = (lambda x: x / busy) if busy > 0 else (lambda _x: 0.0)
    w = np.concatenate([np.full(i.series_batch_size.shape, i.busy_s) for i in result.instances])
    batch = np.concatenate([i.series_batch_size for i in result.instances])
    kv = np.concatenate([i.series_kv_utilization for i in result.instances])
    active = batch > 0
    mean_batch = float(np.average(batch[active], weights=w[active])) if active.any() else 0.0
    kv_util = float(np.average(kv[active], weights=w[active])) if active.any() else 0.0
    shape = config.shape
    inst = _first_instance(config)
    acc = inst.resolve_accelerator()
    params = shape.num_params
    weights = shape.weight_bytes(1)
    ctx = float(np.mean(result.input_tokens) + np.mean(result.output_tokens) / 2)
    b = max(mean_batch, 1.0)
    dec_bytes = weights + b * ctx * shape.kv_bytes_per_token(1)
    decode_ai = 2.0 * params * b / dec_bytes
    chunk = config.roles()[0].instance.max_num_batched_tokens
    prefill_ai = 2.0 * params * chunk / (weights + chunk * shape.kv_bytes_per_token(1))
    ttft_mean = float(np.nanmean(result.ttft_s))
    queue_mean = float(np.nanmean(result.queueing_s))
    return PhaseDiagnosis(
        label=label,
        rate=rate,
        prefill_share=share(ph.prefill_only_gpu_s),
        decode_share=share(ph.decode_only_gpu_s),
        mixed_share=share(ph.mixed_gpu_s),
        mean_batch=mean_batch,
        decode_intensity=decode_ai,
        prefill_intensity=prefill_ai,
        ridge=acc.ridge_flops_per_byte,
        kv_utilization=kv_util,
        num_preemptions=ph.num_preemptions,
        queueing_share_of_ttft=queue_mean / ttft_mean if ttft_mean > 0 else 0.0,
        itl_spike_share=ph.itl_spike_tokens / max(result.total_output_tokens, 1),
        itl_p99_ms=result.itl.p99 * 1e3,
        ttft_p90_ms=result.ttft.p90 * 1e3,
        tpot_p90_ms=result.tpot.p90 * 1e3,
        attainment=float(result.slo_attainment or 0.0),
    )


def diagnose_config(
    evaluator: TraceEvaluator, label: str, config: ServingConfig, rate: float
) -> PhaseDiagnosis:
    """Breakdown of `config` on the evaluation window at fleet rate `rate` (requests/s)."""
    scale = rate / evaluator.trace_rate if rate > 0 else 1.0
    return breakdown(label, config, evaluator.simulate(config, max(scale, 1e-3)), rate)


def _knob_changes(base: ServingConfig, rec: ServingConfig) -> list[str]:
    out = []
    if base.mode is not rec.mode:
        out.append(f"mode {base.mode.value} -> {rec.mode.value}")
    b, r = _first_instance(base), _first_instance(rec)
    front = rec.roles()[0].instance
    for name, bv, rv in (
        ("tp", b.tp, r.tp),
        ("max_num_batched_tokens", b.max_num_batched_tokens, front.max_num_batched_tokens),
        ("max_num_seqs", b.max_num_seqs, r.max_num_seqs),
        ("chunked prefill", b.enable_chunked_prefill, front.enable_chunked_prefill),
        (
            "speculation K",
            base.speculation.num_speculative_tokens,
            rec.speculation.num_speculative_tokens,
        ),
    ):
        if bv != rv:
            out.append(f"{name} {bv} -> {rv}")
    return out


NEAR_DEFAULTS = 1.03  # a gain below this is within the capacity search's resolution


def explain(
    base: PhaseDiagnosis,
    rec: PhaseDiagnosis | None,
    base_cfg: ServingConfig,
    rec_cfg: ServingConfig | None,
    base_eval: Evaluation,
    rec_eval: Evaluation | None,
) -> tuple[str, ...]:
    """The plain-language account: which knobs moved goodput, and through which phase."""
    lines = [
        f"Baseline at {base.rate:.2f} req/s: {base.prefill_share:.0%} of GPU time in prefill-only "
        f"steps, {base.decode_share:.0%} decode-only, {base.mixed_share:.0%} mixed; decode steps "
        f"average {base.mean_batch:.0f} sequences at {base.decode_intensity:.0f} FLOP/B "
        f"({base.decode_bound}, ridge {base.ridge:.0f}); KV {base.kv_utilization:.0%} used, "
        f"{base.num_preemptions} preemptions; queueing is {base.queueing_share_of_ttft:.0%} of "
        f"TTFT; {base.itl_spike_share:.1%} of decode tokens hit an ITL spike."
    ]
    if rec is None or rec_cfg is None or rec_eval is None:
        lines.append("No config met the SLOs at the trace's rate, so there is nothing to compare.")
        return tuple(lines)
    changes = _knob_changes(base_cfg, rec_cfg)
    gain = (
        rec_eval.goodput_per_gpu / base_eval.goodput_per_gpu
        if base_eval.goodput_per_gpu
        else math.inf
    )
    near = gain < NEAR_DEFAULTS
    lines.append(
        f"{'The best config found' if near else 'Recommendation'} changes "
        f"{', '.join(changes) or 'nothing'}; per-GPU goodput "
        f"{base_eval.goodput_per_gpu:.2f} -> {rec_eval.goodput_per_gpu:.2f} req/s ({gain:.2f}x)."
    )
    if near:
        lines.append(
            f"The engine's defaults are already within {NEAR_DEFAULTS - 1:.0%} of the best config "
            "found (the capacity search resolves rates to a few percent): for this trace and "
            "these SLOs no knob moves per-GPU goodput much, so the recommendation keeps the "
            "defaults; other Pareto points trade goodput for tokens/s per user."
        )
        return tuple(lines)
    why = []
    if rec.itl_spike_share < base.itl_spike_share * 0.7 and base.itl_spike_share > 0.01:
        why.append(
            "decode: fewer decode tokens stall behind prefill chunks "
            f"({base.itl_spike_share:.1%} -> {rec.itl_spike_share:.1%}, "
            f"ITL p99 {base.itl_p99_ms:.0f} -> {rec.itl_p99_ms:.0f} ms)"
            ", so TPOT stays within its SLO at a higher rate"
        )
    if rec.num_preemptions < base.num_preemptions:
        why.append(
            f"KV: preemptions fall {base.num_preemptions} -> {rec.num_preemptions}, "
            "so less prefill is recomputed"
        )
    if rec_cfg.mode is ServingMode.DISAGGREGATED and base_cfg.mode is ServingMode.COLOCATED:
        why.append(
            "interference: prefill and decode run on separate GPUs, so neither waits for the other"
        )
    if rec_cfg.speculation.enabled and base.decode_intensity < base.ridge:
        why.append(
            "speculation: decode steps are bandwidth-bound, so verifying K+1 tokens per read of "
            "the weights yields more tokens per step for little extra time"
        )
    if rec.ttft_p90_ms < base.ttft_p90_ms * 0.7:
        why.append(
            f"prefill: TTFT p90 {base.ttft_p90_ms:.0f} -> {rec.ttft_p90_ms:.0f} ms at the same "
            f"load (queueing {base.queueing_share_of_ttft:.0%} -> "
            f"{rec.queueing_share_of_ttft:.0%} of TTFT)"
        )
    if rec.tpot_p90_ms < base.tpot_p90_ms * 0.85:
        why.append(
            f"decode: TPOT p90 {base.tpot_p90_ms:.1f} -> {rec.tpot_p90_ms:.1f} ms at the same load"
        )
    if not why:
        why.append("the phase mix barely changes; the gain comes from how the same work is batched")
    lines.append("Why: " + "; ".join(why) + ".")
    return tuple(lines)
