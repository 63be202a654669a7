"""Physical floors under a tuning request's SLOs (optimizer.search.floors): hand-worked
values, MoE active bytes, speculation's K + 1, the shares percentiles prove, and that the
floors stay under servetune's own step prices (a floor never refuses what a run meets)."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.hardware import get_accelerator
from optimizer.latency.base import StepLoad
from optimizer.latency.catalog import LatencyCatalog
from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.records import TokenStats
from optimizer.search.floors import (
    FloorDeployment,
    FloorError,
    WorkloadLengths,
    check_floors,
    floor_deployments,
    floor_violations,
)
from optimizer.search.request import TuneRequest
from optimizer.shapes import get_shape

MIB = 2**20


def _stats(p50: int, p90: int, p99: int, top: int) -> TokenStats:
    return TokenStats(mean=float(p50), p50=p50, p90=p90, p99=p99, max=top, total=0)


# 1,000 requests: prompts of 1,500 / 5,000 / 7,400 / 7,437 tokens at p50 / p90 / p99 / max
LENGTHS = WorkloadLengths(1000, _stats(1500, 5000, 7400, 7437), _stats(13, 55, 252, 1899))


def _request(**kw) -> TuneRequest:
    base = dict(
        model="llama-3.1-8b",
        gpu_types=("h100",),
        gpu_budget=1,
        slo_ttft_ms=2000,
        slo_tpot_ms=50,
        trace_id=1,
    )
    return TuneRequest(**{**base, **kw})


def test_llama_8b_decode_floor_by_hand():
    # One token reads every layer's attention (q, k, v, o) and gated MLP, the norms and the
    # LM head, in bf16; the input embedding is a row lookup.
    layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
    params = 32 * layer + (2 * 32 * 4096 + 4096) + 128256 * 4096
    shape = get_shape("llama-3.1-8b")
    assert shape.active_weight_bytes == 2 * params == 15_009_849_344
    (d,) = floor_deployments(_request(), prefix_hashes=False)
    assert d.num_gpus == 1 and d.max_tokens_per_step == 1
    # (15.01 GB - 256 MiB an on-chip cache may hold) / 3.35 TB/s = 4.40 ms
    assert d.tpot_floor_s == pytest.approx((2 * params - 256 * MIB) / 3.35e12)
    assert d.tpot_floor_s == pytest.approx(4.4004e-3, abs=1e-7)
    # a lone prefill of 1,500 tokens: 2 x (active params less the LM head) x 1,500 + the LM
    # head once, at 989 TFLOP/s (bf16)
    flops = 2 * (params - (2 * 32 * 4096 + 4096) - 128256 * 4096) * 1500 + 2 * 128256 * 4096
    assert d.prefill_floor_s(1500) == pytest.approx(flops / 989e12)
    assert d.prefill_floor_s(1) == d.step_floor_s  # one token: reading the weights decides


def test_a_request_just_above_the_floor_passes_just_below_is_refused():
    assert floor_violations(_request(slo_tpot_ms=4.5), LENGTHS) == []
    with pytest.raises(FloorError) as err:
        check_floors(_request(slo_tpot_ms=4.3), LENGTHS)
    (v,) = err.value.violations
    assert v.field == "slo_tpot_ms"
    assert v.message.startswith(
        "slo_tpot_ms: TPOT SLO 4.3 ms is below the decode floor of llama-3.1-8b on h100: "
        "4.40 ms per token at the most parallel deployment allowed (1 x h100: 15.0 GB of "
        "active weights read per step"
    )
    # The most parallel deployment allowed: tp 8 of an 8-GPU budget splits the weights.
    (d,) = floor_deployments(_request(gpu_budget=8), prefix_hashes=False)
    assert d.num_gpus == 8
    assert floor_violations(_request(gpu_budget=8, slo_tpot_ms=4.3), LENGTHS) == []


def test_moe_floor_reads_the_active_experts_only():
    # Mixtral-8x7B: per layer attention, 2 of 8 experts (3 x 4096 x 14336 each) and the
    # router; norms; LM head (32,000 x 4,096); bf16.
    layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 2 * 3 * 4096 * 14336 + 4096 * 8
    params = 32 * layer + (2 * 32 * 4096 + 4096) + 32000 * 4096
    shape = get_shape("mixtral-8x7b")
    assert shape.active_weight_bytes == 2 * params
    assert shape.weight_bytes() > 3.5 * shape.active_weight_bytes  # all 8 experts
    # 8 H100: tp x dp up to 8 splits the active weights over 8 GPUs.
    (d,) = floor_deployments(_request(model="mixtral-8x7b", gpu_budget=8), prefix_hashes=False)
    assert d.num_gpus == 8
    assert d.step_floor_s == pytest.approx((2 * params / 8 - 256 * MIB) / 3.35e12)
    # Qwen3-235B-A22B-FP8 on 16 H200 (tp 8 x dp 2 or tp 4 x dp 4): 22.2 GB active, FP8
    req = _request(model="Qwen/Qwen3-235B-A22B-FP8", gpu_types=("h200",), gpu_budget=16)
    (q,) = floor_deployments(req, prefix_hashes=False)
    assert q.num_gpus == 16 and q.peak_flops == (1979e12, "FP8")
    assert q.shape.active_weight_bytes == pytest.approx(22.24e9, rel=1e-3)
    assert q.step_floor_s == pytest.approx(0.2337e-3, rel=1e-3)


def test_speculation_divides_the_decode_floor_by_k_plus_1():
    slo = 1.0  # ms: above 4.40 / 6, below 4.40
    (v,) = floor_violations(_request(slo_tpot_ms=slo), LENGTHS)
    assert "speculating" not in v.message
    spec = _request(slo_tpot_ms=slo, draft_model="llama-3.2-1b")  # depths 0-5 searched
    (d,) = floor_deployments(spec, prefix_hashes=False)
    assert d.max_tokens_per_step == 6 and d.tpot_floor_s == pytest.approx(d.step_floor_s / 6)
    assert floor_violations(spec, LENGTHS) == []
    (v,) = floor_violations(_request(slo_tpot_ms=0.5, draft_model="llama-3.2-1b"), LENGTHS)
    assert "0.733 ms per token" in v.message
    assert "speculating up to 5 tokens (a step emits at most 6: 4.40 ms per step / 6)" in (
        v.message
    )


def test_ttft_floor_names_the_share_and_prompt_percentile_the_attainment_allows():
    # 16 H200 of Qwen3-235B-A22B-FP8: the median prompt's floor is 1.98 ms, the 90th
    # percentile's 6.6 ms; a 2 ms TTFT SLO fails more than 10% of the requests.
    req = _request(
        model="Qwen/Qwen3-235B-A22B-FP8", gpu_types=("h200",), gpu_budget=16, slo_ttft_ms=2
    )
    (v,) = floor_violations(req, LENGTHS)
    assert v.field == "slo_ttft_ms"
    assert (
        "TTFT SLO 2 ms is below the lone-prefill floor of Qwen/Qwen3-235B-A22B-FP8 for more "
        "than 10% of the requests, where 90% attainment lets at most 10% miss: the "
        "90th-percentile prompt (5,000 tokens) alone takes at least 6.6" in v.message
    )
    assert "x 5,000 tokens at 16 x 1,979 TFLOP/s, the FP8 peak" in v.message
    # 85% attainment may miss the longest 15%: the percentiles prove no more than 10%.
    assert floor_violations(TuneRequest(**{**_fields(req), "attainment": 0.85}), LENGTHS) == []
    # Below the median's floor, more than half of the requests miss.
    (v,) = floor_violations(TuneRequest(**{**_fields(req), "slo_ttft_ms": 1}), LENGTHS)
    assert "more than 50% of the requests" in v.message and "the median prompt" in v.message


def _fields(req: TuneRequest) -> dict:
    return {k: v for k, v in req.to_dict().items() if k != "schema_version"}


def test_tpot_floor_binds_only_requests_with_a_tpot():
    one_token = WorkloadLengths(1000, LENGTHS.input_tokens, _stats(1, 1, 1, 1))
    assert floor_violations(_request(slo_tpot_ms=0.05), one_token) == []
    # at least half have 2+ output tokens: a 60% attainment is still out of reach
    half = WorkloadLengths(1000, LENGTHS.input_tokens, _stats(2, 5, 9, 9))
    (v,) = floor_violations(_request(slo_tpot_ms=0.05, attainment=0.6), half)
    assert "more than 50% of the requests have a TPOT" in v.message
    assert floor_violations(_request(slo_tpot_ms=0.05, attainment=0.4), half) == []


def test_prefix_caching_leaves_one_token_to_prefill():
    req = _request(slo_ttft_ms=10)  # the median prompt's floor on one H100 is 22 ms
    assert [v.field for v in floor_violations(req, LENGTHS)] == ["slo_ttft_ms"]
    hashed = WorkloadLengths(1000, LENGTHS.input_tokens, LENGTHS.output_tokens, True)
    assert floor_violations(req, hashed) == []  # 10 ms > 4.4 ms, one token's floor
    (v,) = floor_violations(_request(slo_ttft_ms=4), hashed)
    assert "every request (prefix caching is searched" in v.message


def test_quantised_space_and_lengths_from_arrays():
    fp8 = _request(search_space={"quantization": "fp8"})
    (d,) = floor_deployments(fp8, prefix_hashes=False)
    assert d.peak_flops == (1979e12, "FP8")
    assert d.shape.active_weight_bytes < 0.55 * get_shape("llama-3.1-8b").active_weight_bytes
    inp = np.array([100, 200, 300, 400], dtype=np.int64)
    lengths = WorkloadLengths.of_arrays(inp, np.array([1, 1, 2, 3]), prefix_hashes=False)
    got = (lengths.num_requests, lengths.input_tokens.p50, lengths.output_tokens.p90)
    assert got == (4, 200, 3)


@pytest.mark.parametrize(
    ("model", "acc", "tp", "layout"),
    [
        ("llama-3.1-8b", "h100", 1, DENSE_LAYOUT),
        ("llama-3.1-8b", "h100", 8, DENSE_LAYOUT),
        ("llama-3.1-70b", "h200", 8, DENSE_LAYOUT),
        ("qwen3-0.6b", "a100", 1, DENSE_LAYOUT),
        ("Qwen/Qwen3-235B-A22B-FP8", "h200", 8, ExpertLayout(2, True)),
        ("Qwen/Qwen3-235B-A22B-FP8", "h200", 4, ExpertLayout(4, False)),
    ],
)
def test_floors_stay_under_servetunes_own_step_prices(model, acc, tp, layout):
    """The roofline estimate of a batch-1 decode step and of a lone prefill is never below
    the floors at the same deployment: a request they refuse, servetune could not meet."""
    shape = get_shape(model)
    lat = LatencyCatalog(shape).for_instance(acc, tp, precision=shape.precision, layout=layout)
    d = FloorDeployment(shape, get_accelerator(acc), layout.num_gpus(tp))
    assert lat.step_time_s(StepLoad(1, 1, (), (), 1, 1024, 1)) >= d.step_floor_s
    for prompt in (1, 16, 1000, 8000):
        load = StepLoad(prompt, 1, (prompt,), (prompt,), 0, 0, 1)
        assert lat.step_time_s(load) >= d.prefill_floor_s(prompt)
