"""Did it help prefill or decode? A phase breakdown of one fleet, and a plain account of
why the recommendation needs fewer GPUs than the engine's defaults.

Both fleets are the verified ones, each sized for the trace, on the whole trace at its
own rate (the runs whose figures the outcome reports), described by the simulator's
counters: the share of GPU time in
prefill-only, decode-only and mixed steps; the arithmetic intensity of a typical
decode step and a full prefill chunk against the GPU's ridge point; KV-cache
utilisation and preemptions; the queueing share of TTFT; decode tokens whose
step was stretched by a co-scheduled prefill chunk (ITL spikes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimizer.config import ServingConfig, ServingMode
from optimizer.search.evaluation import Evaluation
from optimizer.search.recommend import TrialOutcome
from optimizer.search.windows import EvaluatedTrace
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

    @property
    def decode_bound(self) -> str:
        return "compute-bound" if self.decode_intensity >= self.ridge else "bandwidth-bound"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    baseline: PhaseDiagnosis | None  # None: the defaults are not a valid deployment here
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
    )


def _knob_changes(base: ServingConfig, rec: ServingConfig) -> list[str]:
    out = []
    if base.mode is not rec.mode:
        out.append(f"mode {base.mode.value} -> {rec.mode.value}")
    b, r = _first_instance(base), _first_instance(rec)
    front = rec.roles()[0].instance
    for name, bv, rv in (
        ("tp", b.tp, r.tp),
        ("dp", b.dp, r.dp),
        ("expert parallel", b.expert_parallel, r.expert_parallel),
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


def _fleet(ev: Evaluation, per_dollar: bool) -> str:
    gpus = f"{ev.num_gpus} GPU{'s' if ev.num_gpus != 1 else ''}"
    if per_dollar and ev.price_per_hour is not None:
        return f"{gpus} (${ev.price_per_hour:,.2f}/h)"
    return gpus


def explain(
    base: PhaseDiagnosis | None,
    rec: PhaseDiagnosis | None,
    base_ev: Evaluation,
    base_config: ServingConfig | None,
    best: TrialOutcome | None,
    *,
    rec_name: str,
    kept_defaults: bool,
    evaluated: EvaluatedTrace,
    per_dollar: bool = False,
) -> tuple[str, ...]:
    """The plain-language account: what the defaults need (`base_ev`; `base_config` their
    fleet, None when they cannot be built at all), which knobs the recommendation (`best`,
    named `rec_name`) moves, and through which phase it saves GPUs."""
    lines = []
    if base is None:
        lines.append(f"vLLM's defaults are not a valid deployment here: {base_ev.error}")
    else:
        att = base_ev.attainment
        assert att is not None
        need = (
            f"meet the SLOs with {_fleet(base_ev, per_dollar)}"
            if base_ev.feasible
            else f"miss the SLOs even with {_fleet(base_ev, per_dollar)}: "
            f"{evaluated.attainment_text(att)}"
        )
        lines.append(
            f"vLLM's defaults {need}. At {base.rate:.2f} req/s: {base.prefill_share:.0%} of GPU "
            f"time in prefill-only steps, {base.decode_share:.0%} decode-only, "
            f"{base.mixed_share:.0%} mixed; decode steps average {base.mean_batch:.0f} sequences "
            f"at {base.decode_intensity:.0f} FLOP/B ({base.decode_bound}, ridge "
            f"{base.ridge:.0f}); KV {base.kv_utilization:.0%} used, {base.num_preemptions} "
            f"preemptions; queueing is {base.queueing_share_of_ttft:.0%} of TTFT; "
            f"{base.itl_spike_share:.1%} of decode tokens hit an ITL spike."
        )
    if best is None:
        lines.append("No config met the SLOs within the budget, so there is nothing to compare.")
        return tuple(lines)
    if kept_defaults:
        lines.append(
            f"No config found needs fewer {'dollars' if per_dollar else 'GPUs'} than the "
            f"defaults' {_fleet(base_ev, per_dollar)} or is more than 3% more interactive "
            "on as many, so the recommendation keeps them; other Pareto points trade cost "
            "for tokens/s per user."
        )
        return tuple(lines)
    rec_ev = best.evaluation
    if base_config is None:
        lines.append(
            f"Recommendation ({rec_name}) meets the SLOs with {_fleet(rec_ev, per_dollar)}."
        )
        return tuple(lines)
    changes = _knob_changes(base_config, best.config)
    saving = ""
    if base_ev.feasible and base_ev.num_gpus == rec_ev.num_gpus and not per_dollar:
        saving = (
            f", as many as the defaults, at {rec_ev.interactivity_tok_s:.0f} instead of "
            f"{base_ev.interactivity_tok_s:.0f} tokens/s per user"
        )
    elif base_ev.feasible:
        saving = f" instead of the defaults' {_fleet(base_ev, per_dollar)}"
    lines.append(
        f"Recommendation ({rec_name}) meets the SLOs with {_fleet(rec_ev, per_dollar)}"
        f"{saving}; it changes {', '.join(changes) or 'nothing'}."
    )
    if rec is None or base is None:
        return tuple(lines)
    why = []
    if rec.itl_spike_share < base.itl_spike_share * 0.7 and base.itl_spike_share > 0.01:
        why.append(
            "decode: fewer decode tokens stall behind prefill chunks "
            f"({base.itl_spike_share:.1%} -> {rec.itl_spike_share:.1%}, "
            f"ITL p99 {base.itl_p99_ms:.0f} -> {rec.itl_p99_ms:.0f} ms)"
            ", so TPOT stays within its SLO at a higher load per GPU"
        )
    if rec.num_preemptions < base.num_preemptions:
        why.append(
            f"KV: preemptions fall {base.num_preemptions} -> {rec.num_preemptions}, "
            "so less prefill is recomputed"
        )
    rec_cfg, base_cfg = best.config, base_config
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
            f"prefill: TTFT p90 {base.ttft_p90_ms:.0f} -> {rec.ttft_p90_ms:.0f} ms under the same "
            f"traffic (queueing {base.queueing_share_of_ttft:.0%} -> "
            f"{rec.queueing_share_of_ttft:.0%} of TTFT)"
        )
    if rec.tpot_p90_ms < base.tpot_p90_ms * 0.85:
        why.append(
            f"decode: TPOT p90 {base.tpot_p90_ms:.1f} -> {rec.tpot_p90_ms:.1f} ms under the "
            "same traffic"
        )
    if not why:
        why.append("the phase mix barely changes; the gain comes from how the same work is batched")
    lines.append("Why: " + "; ".join(why) + ".")
    return tuple(lines)
