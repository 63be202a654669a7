"""Golden cases worked by hand with a constant or linear latency model (issue 4)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.config import (
    InstanceConfig,
    KVLinkConfig,
    ServingConfig,
    SpecMethod,
    SpeculationConfig,
)
from optimizer.hardware import get_accelerator
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.shapes import get_shape
from optimizer.sim import DecodeFloorError, simulate
from optimizer.workload import Workload
from tests.factories import instance_with_blocks

C = 0.010  # constant step time (s); the Llama-3.1-8B/H100 floor is ~4.8 ms
MODEL = "llama-3.1-8b"


def const(c: float = C) -> SingleLatencySource:
    return SingleLatencySource(LinearLatency(base_s=c))


def make_workload(arrivals, prompts, outputs, **kw) -> Workload:
    return Workload(np.asarray(arrivals, float), np.asarray(prompts), np.asarray(outputs), **kw)


def colocated(**kw) -> ServingConfig:
    keys = ("speculation", "enable_prefix_caching", "engine_version")
    extra = {k: kw.pop(k) for k in keys if k in kw}
    return ServingConfig.colocated(MODEL, InstanceConfig(**kw), **extra)


def test_single_request_ttft_is_prefill_and_tpot_is_a_decode_step():
    res = simulate(make_workload([0.0], [100], [5]), colocated(), const())
    assert res.ttft_s[0] == pytest.approx(C)
    assert res.tpot_s[0] == pytest.approx(C)
    assert res.e2e_s[0] == pytest.approx(5 * C)
    assert res.phases.num_prefill_only_steps == 1 and res.phases.num_decode_only_steps == 4


def test_linear_model_prices_prefill_tokens_and_decode_kv():
    lat = LinearLatency(base_s=0.007, per_token_s=1e-5, per_kv_token_s=1e-7)
    res = simulate(make_workload([0.0], [1000], [3]), colocated(), SingleLatencySource(lat))
    ttft = 0.007 + 1e-5 * 1000  # one prefill step of 1000 tokens (no decode KV)
    d1 = 0.007 + 1e-5 + 1e-7 * 1001  # decode step: 1 token attending to 1001 KV tokens
    d2 = 0.007 + 1e-5 + 1e-7 * 1002
    assert res.ttft_s[0] == pytest.approx(ttft)
    assert res.e2e_s[0] == pytest.approx(ttft + d1 + d2)
    assert res.tpot_s[0] == pytest.approx((d1 + d2) / 2)


@pytest.mark.parametrize("prompt,budget", [(1000, 256), (1024, 256), (300, 512)])
def test_chunked_prefill_takes_ceil_prompt_over_budget_steps(prompt, budget):
    cfg = colocated(max_num_batched_tokens=budget, max_num_seqs=budget)
    res = simulate(make_workload([0.0], [prompt], [2]), cfg, const())
    steps = math.ceil(prompt / budget)
    assert res.ttft_s[0] == pytest.approx(steps * C)
    assert res.e2e_s[0] == pytest.approx((steps + 1) * C)


def test_max_num_seqs_is_respected():
    # 4 requests at t=0, 2 seats: r0, r1 prefill at step 1 and decode 4 steps (done at 5C);
    # r2, r3 enter at 5C: first token at 6C, done at 10C.
    cfg = colocated(max_num_seqs=2, max_num_batched_tokens=2048)
    res = simulate(make_workload([0, 0, 0, 0], [10] * 4, [5] * 4), cfg, const())
    np.testing.assert_allclose(res.ttft_s, [C, C, 6 * C, 6 * C])
    np.testing.assert_allclose(res.e2e_s, [5 * C, 5 * C, 10 * C, 10 * C])
    np.testing.assert_allclose(res.queueing_s, [0, 0, 5 * C, 5 * C])
    assert max(s.series_batch_size.max() for s in res.instances) <= 2


def test_kv_exhaustion_preempts_and_every_request_still_finishes():
    # 8 blocks of 16 tokens = 128 slots; two requests of 48 + 40 tokens each need 11 blocks.
    inst = instance_with_blocks(8, max_num_batched_tokens=512, max_num_seqs=8)
    cfg = ServingConfig.colocated(MODEL, inst)
    res = simulate(make_workload([0, 0], [48, 48], [40, 40]), cfg, const())
    assert res.num_preemptions.sum() >= 1
    assert res.num_preemptions[1] >= 1  # the newest request is the victim
    assert res.num_completed == 2
    assert res.num_tokens_emitted == 80
    assert all(s.leaked_blocks == 0 and s.peak_kv_used_blocks <= 8 for s in res.instances)


@pytest.mark.parametrize("alpha,steps", [(1.0, 2), (0.0, 8)])
def test_speculation_alpha_one_emits_k_plus_one_and_alpha_zero_one(alpha, steps):
    spec = SpeculationConfig(
        method=SpecMethod.EAGLE, num_speculative_tokens=3, acceptance_rate=alpha,
        draft_relative_cost=0.0,
    )  # fmt: skip
    res = simulate(make_workload([0.0], [100], [9]), colocated(speculation=spec), const())
    # first token from prefill; the other 8 arrive 4 (alpha=1) or 1 (alpha=0) per step
    assert res.e2e_s[0] == pytest.approx((1 + steps) * C)


def test_speculation_draft_cost_is_k_times_relative_cost_of_a_decode_step():
    spec = SpeculationConfig(
        method=SpecMethod.DRAFT, num_speculative_tokens=3, acceptance_rate=1.0,
        draft_relative_cost=0.1,
    )  # fmt: skip
    res = simulate(make_workload([0.0], [100], [9]), colocated(speculation=spec), const())
    # The prefill step: the target's, plus the drafter prefilling the same prompt (0.1 C);
    # then two verify steps of K=3 drafts each (8 tokens at 4 per step).
    assert res.e2e_s[0] == pytest.approx(C + 0.1 * C + 2 * (C + 3 * 0.1 * C))


def test_disaggregated_single_request_pays_prefill_then_transfer_then_decode():
    """As vLLM's PD proxy: the first token comes from the decode instance, after the
    prefill step, the KV pull and one decode step (recomputing the last prompt token)."""
    link = KVLinkConfig(bandwidth_gb_s=50.0, latency_ms=0.5)
    cfg = ServingConfig.disaggregated(MODEL, kv_link=link)
    res = simulate(make_workload([0.0], [1000], [5]), cfg, const())
    transfer = 1000 * 131072 / 50e9 + 0.5e-3  # Llama-3.1-8B bf16: 128 KiB per token
    assert res.ttft_s[0] == pytest.approx(C + transfer + C)
    assert res.e2e_s[0] == pytest.approx(C + transfer + C + 4 * C)
    assert res.num_kv_transfers == 1 and res.kv_transfer_s == pytest.approx(transfer)
    assert res.num_gpus == 2


def test_disaggregated_transfers_on_one_link_are_serialised():
    link = KVLinkConfig(bandwidth_gb_s=1.0, latency_ms=0.0)  # 131 ms per 1000-token KV
    cfg = ServingConfig.disaggregated(MODEL, kv_link=link, num_decode=2)
    res = simulate(make_workload([0.0, 0.0], [1000, 1000], [2, 2]), cfg, const())
    xfer = 1000 * 131072 / 1e9
    # both prefilled in one step; the second transfer waits for the first; each decode
    # instance then delivers token 1 (a step) and token 2 (a step)
    np.testing.assert_allclose(res.e2e_s, [C + xfer + 2 * C, C + 2 * xfer + 2 * C])
    np.testing.assert_allclose(res.ttft_s, [C + xfer + C, C + 2 * xfer + C])


def test_prefix_hit_skips_prefill_of_shared_blocks():
    lat = SingleLatencySource(LinearLatency(base_s=0.007, per_token_s=1e-5))
    hashes = (np.arange(64), np.arange(64))  # 64 blocks of 16 tokens: the same 1024-token prompt
    wl = make_workload([0.0, 10.0], [1024, 1024], [2, 2], prefix_hashes=hashes,
                       prefix_block_tokens=16)  # fmt: skip
    on = simulate(wl, colocated(enable_prefix_caching=True), lat)
    off = simulate(wl, colocated(), lat)
    assert on.ttft_s[0] == pytest.approx(0.007 + 1e-5 * 1024)
    # 1008 tokens reused (the last block recomputed so one token is left to sample)
    assert on.ttft_s[1] == pytest.approx(0.007 + 1e-5 * 16)
    assert off.ttft_s[1] == pytest.approx(0.007 + 1e-5 * 1024)
    assert on.instances[0].prefix_hit_ratio == pytest.approx(1008 / 2048)


def test_blocks_are_cached_as_they_are_computed_not_at_admission():
    """A 1024-token prompt with a 768-token budget: 768 tokens in the first step (0-10 ms),
    the other 256 in the second. Its twin arrives at 5 ms and is admitted in the second
    step beside it: it reuses the 768 tokens computed by then, not the 1008 its twin was
    going to compute (caching at admission would have promised those)."""
    hashes = (np.arange(64), np.arange(64))
    wl = make_workload([0.0, 0.005], [1024, 1024], [2, 2], prefix_hashes=hashes,
                       prefix_block_tokens=16)  # fmt: skip
    # Synchronous scheduling (vLLM 0.12): a request is admitted at the next step boundary.
    cfg = colocated(max_num_batched_tokens=768, max_num_seqs=8, enable_prefix_caching=True,
                    engine_version="0.12.0")  # fmt: skip
    res = simulate(wl, cfg, const(), check_invariants=True)
    assert res.instances[0].prefix_hit_ratio == pytest.approx(768 / 2048)
    # The twin computes its other 256 tokens in step 2 (10-20 ms), which samples its first
    # token.
    assert res.ttft_s[1] == pytest.approx(0.020 - 0.005)


def test_cached_blocks_only_live_in_free_blocks_and_the_lru_one_goes_first():
    """64 KV blocks of 16 tokens. A (hashes 0-31, 512 tokens) finishes; B (hashes 100-147,
    768 tokens) then needs 48 + 1 blocks: the 31 free blocks nobody cached are not enough,
    so A's tail is evicted first (A's head survives). C repeats A's prompt: only the
    blocks of A's head that survived are reused."""
    wl = make_workload(
        [0.0, 1.0, 2.0], [512, 768, 512], [1, 1, 1],
        prefix_hashes=(np.arange(32), np.arange(100, 148), np.arange(32)),
        prefix_block_tokens=16,
    )  # fmt: skip
    inst = instance_with_blocks(64, max_num_batched_tokens=1024, max_num_seqs=4)
    cfg = ServingConfig.colocated(MODEL, inst, enable_prefix_caching=True)
    res = simulate(wl, cfg, const(), check_invariants=True)
    # B took 48 blocks (for 768 tokens; its one output token is sampled without a new
    # block): 32 never used + 16 of A's 32 cached, tail first. A's first 16 stay cached.
    hit_c = 16 * 16
    assert res.instances[0].prefix_hit_ratio == pytest.approx(hit_c / (512 + 768 + 512))


def test_a_shared_prefix_is_held_once_while_both_requests_run():
    """Two requests with the same 512-token prompt run together: the second references the
    first's 32 cached blocks, so the pool holds 32 + 1 + 1 blocks, not 66: with 40 blocks
    both run at once instead of one after the other."""
    hashes = (np.arange(32), np.arange(32))
    wl = make_workload([0.0, 0.001], [512, 512], [20, 20], prefix_hashes=hashes,
                       prefix_block_tokens=16)  # fmt: skip
    inst = instance_with_blocks(40, max_num_batched_tokens=1024, max_num_seqs=4)
    on = simulate(wl, ServingConfig.colocated(MODEL, inst, enable_prefix_caching=True),
                  const(), check_invariants=True)  # fmt: skip
    off = simulate(wl, ServingConfig.colocated(MODEL, inst), const(), check_invariants=True)
    assert on.phases.num_preemptions == 0
    # Without sharing 2 x 33+ blocks do not fit in 40: the second waits or is preempted.
    assert off.e2e_s[1] > on.e2e_s[1] + 10 * C


def test_latency_faster_than_weight_bandwidth_floor_is_rejected():
    with pytest.raises(DecodeFloorError, match="floor"):
        simulate(make_workload([0.0], [10], [2]), colocated(), const(0.001))


def test_requests_the_deployment_cannot_hold_are_rejected_not_simulated():
    cfg = ServingConfig.colocated(MODEL, InstanceConfig(), max_model_len=4096)
    res = simulate(make_workload([0.0, 0.1], [4000, 100], [200, 10]), cfg, const())
    assert res.num_rejected == 1 and res.num_completed == 1
    assert math.isnan(res.ttft_s[0]) and res.ttft_s[1] == pytest.approx(C)


class _CheapPrefill:
    """Prices decode steps honestly but prefill-only steps impossibly fast."""

    is_estimate = True

    def step_time_s(self, load) -> float:
        return C if load.num_decode_seqs else 0.001

    def for_instance(
        self, accelerator: str, tp: int, reach=None, precision=None, engine=None, layout=None
    ):
        return self


def test_steps_below_the_floor_that_the_probe_misses_are_clamped_and_counted():
    floor = get_shape(MODEL).weight_bytes(1) / get_accelerator("h100").hbm_bytes_per_s
    res = simulate(make_workload([0.0], [100], [3]), colocated(), _CheapPrefill())
    assert res.num_floor_clamped_steps == 1
    assert res.ttft_s[0] == pytest.approx(floor)
    assert res.e2e_s[0] == pytest.approx(floor + 2 * C)


def test_kv_block_pool_by_hand() -> None:
    from optimizer.sim.kv_blocks import KVBlockPool, blocks_for
    from optimizer.sim.request import SimRequest

    assert [blocks_for(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]
    pool = KVBlockPool(num_blocks=5, block_size=16)
    r = SimRequest(0, 0.0, num_prompt=20, num_output=4, stop_at=4)
    assert pool.extra_blocks(r, 20) == 2
    pool.grow(r, 2)
    assert (r.num_blocks, pool.num_free, pool.num_used) == (2, 3, 2)
    assert pool.extra_blocks(r, 32) == 0 and pool.extra_blocks(r, 33) == 1
    pool.release(r)
    assert (r.num_blocks, pool.num_free) == (0, 5)


@pytest.mark.parametrize("force_general", [False, True])
def test_debug_invariants_hold_on_every_mode(force_general) -> None:
    """Colocated with preemption, speculation, PD and prefix caching, all checked step by step."""
    from optimizer.config import SpecMethod, SpeculationConfig

    lat = SingleLatencySource(LinearLatency(base_s=7e-3, per_token_s=27e-6))
    rng = np.random.default_rng(0)
    n = 300
    prompts = rng.integers(10, 3000, n)
    wl = Workload(
        np.sort(rng.uniform(0, 20, n)),
        prompts,
        rng.integers(1, 300, n),
        prefix_hashes=tuple(np.arange(-(-int(p) // 16)) % 7 for p in prompts),
        prefix_block_tokens=16,
    )
    tight = InstanceConfig(max_num_batched_tokens=1024, max_num_seqs=64,
                           gpu_memory_utilization=0.24)  # fmt: skip
    eagle = SpeculationConfig(method=SpecMethod.EAGLE, num_speculative_tokens=3)
    configs = [
        ServingConfig.colocated("llama-3.1-8b", tight, num_replicas=2),
        ServingConfig.colocated("llama-3.1-8b", tight, speculation=eagle),
        ServingConfig.disaggregated("llama-3.1-8b", tight, tight, num_prefill=1, num_decode=2),
        ServingConfig.colocated("llama-3.1-8b", tight, enable_prefix_caching=True),
    ]
    for cfg in configs:
        res = simulate(wl, cfg, lat, check_invariants=True, force_general=force_general)
        assert res.num_completed > 0


def test_a_full_decode_instance_backpressures_prefill():
    """Decode admission pulls the KV: while the decode instance has no room, the request
    waits there and its KV stays on the prefill instance, whose own pool then fills."""

    # Decode holds one 1000-token request at a time (70 blocks of 16); prefill holds two.
    prefill = instance_with_blocks(130, max_num_batched_tokens=4096, max_num_seqs=8)
    decode = instance_with_blocks(70, max_num_batched_tokens=4096, max_num_seqs=8)
    cfg = ServingConfig.disaggregated(MODEL, prefill, decode, kv_link=KVLinkConfig(1e6, 0.0))
    res = simulate(make_workload([0.0, 0.0, 0.0], [1000, 1000, 1000], [3, 3, 3]), cfg, const(),
                   check_invariants=True)  # fmt: skip
    # Requests 0 and 1 prefill together (C); request 2's prompt finds no prefill blocks.
    # Request 0 is pulled at once and delivers its tokens at 2C, 3C, 4C; request 1 waits
    # for its decode blocks, its KV held on the prefill instance, and is pulled at 4C
    # (tokens 5C..7C). Request 2 prefills once request 0's KV leaves (C..2C), then waits
    # for the decode instance until 7C (first token 8C).
    np.testing.assert_allclose(res.ttft_s, [2 * C, 5 * C, 8 * C], rtol=1e-3)
    np.testing.assert_allclose(res.e2e_s, [4 * C, 7 * C, 10 * C], rtol=1e-3)


def test_vllm_v0_prefills_before_it_decodes():
    """Three 600-token prompts, a 1,024-token budget, constant 10 ms steps. v0
    (prefill_first): [A], then [B] (A's decode waits: prompts first), then [C], then the
    three decode together. v1 (mixed): [A], [A decodes + B], [A, B decode + C]."""
    wl = make_workload([0.0, 0.0, 0.0], [600, 600, 600], [3, 3, 3])
    v0 = colocated(max_num_batched_tokens=1024, max_num_seqs=8, enable_chunked_prefill=False,
                   scheduling="prefill_first")  # fmt: skip
    res = simulate(wl, v0, const(), check_invariants=True)
    np.testing.assert_allclose(res.ttft_s, [C, 2 * C, 3 * C])
    # then 2 decode steps for everyone: all finish at 5 C
    np.testing.assert_allclose(res.e2e_s, [5 * C, 5 * C, 5 * C])
    v1 = colocated(max_num_batched_tokens=1024, max_num_seqs=8, enable_chunked_prefill=False)
    res = simulate(wl, v1, const(), check_invariants=True)
    np.testing.assert_allclose(res.ttft_s, [C, 2 * C, 3 * C])
    np.testing.assert_allclose(res.e2e_s, [3 * C, 4 * C, 5 * C])


class _IdleStartCostsMore(LinearLatency):
    """A constant step, and 4 ms more for one that starts on an idle engine."""

    def idle_step_time_s(self, load) -> float:
        return self.step_time_s(load) + 0.004


def test_a_step_that_starts_on_an_idle_engine_is_priced_as_such():
    """Request 0 arrives at an idle engine: its prefill step is the idle price (0-14 ms),
    its two decode steps steady (14-24, 24-34). Request 1 arrives at 15 ms, during the
    second step, so async scheduling first plans it two steps later: its prefill runs
    right after request 0's last step (34-44, steady: the engine never idled) and its
    decode at 44-54. At 100 ms the engine has been idle since 54 ms: request 2's prefill
    is an idle start again."""
    lat = SingleLatencySource(_IdleStartCostsMore(base_s=C))
    res = simulate(make_workload([0.0, 0.015, 0.1], [100] * 3, [3, 2, 1]), colocated(), lat)
    assert res.ttft_s[0] == pytest.approx(C + 0.004)
    assert res.e2e_s[0] == pytest.approx(3 * C + 0.004)
    assert res.ttft_s[1] == pytest.approx(0.044 - 0.015)
    assert res.e2e_s[1] == pytest.approx(0.054 - 0.015)
    assert res.ttft_s[2] == pytest.approx(C + 0.004)
