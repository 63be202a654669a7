"""A MoE instance's dp ranks in the simulator: one scheduler and KV cache per rank,
arrivals to the least-loaded rank (vLLM's 4 x waiting + running), and lockstep steps
that last the slowest rank's price. Golden cases worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.config import InstanceConfig, RoutingPolicy, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.sim import simulate
from optimizer.sim.floor import decode_floor_s
from optimizer.workload import FixedLength, LognormalLength, Workload, synthetic_workload
from tests.optimizer_tests.moe_fixtures import MOE, fake_layout_weights, register_moe

C = 0.010
PER_TOKEN = 1e-5


@pytest.fixture(autouse=True)
def _moe(monkeypatch):
    register_moe(monkeypatch)
    fake_layout_weights(monkeypatch)


def lat(base: float = C, per_token: float = 0.0) -> SingleLatencySource:
    return SingleLatencySource(LinearLatency(base_s=base, per_token_s=per_token))


def workload(arrivals, prompts, outputs) -> Workload:
    return Workload(np.asarray(arrivals, float), np.asarray(prompts), np.asarray(outputs))


def moe(dp: int = 2, replicas: int = 1, engine_version: str | None = None, **kw) -> ServingConfig:
    inst = InstanceConfig(accelerator="h200", dp=dp, expert_parallel=True, **kw)
    return ServingConfig.colocated(
        "test-moe", inst, num_replicas=replicas, engine_version=engine_version
    )


def test_two_requests_land_on_two_ranks_and_a_step_lasts_the_slower_rank():
    # r0 (100-token prompt) -> rank 0; rank 0 then scores 4 (one waiting), so r1 (1000
    # tokens) -> rank 1. Step 1: rank 0 prices 0.01 + 100e-5 = 0.011 s, rank 1
    # 0.01 + 1000e-5 = 0.020 s: both first tokens at 0.020. Steps 2, 3: one decode token
    # on each rank, 0.01001 s.
    res = simulate(workload([0, 0], [100, 1000], [3, 3]), moe(), lat(C, PER_TOKEN))
    decode = C + PER_TOKEN
    np.testing.assert_allclose(res.ttft_s, [0.020, 0.020])
    np.testing.assert_allclose(res.e2e_s, [0.020 + 2 * decode] * 2)
    # every rank's requests and steps are counted; the instance has tp x dp = 2 GPUs
    assert res.num_gpus == 2 and len(res.instances) == 2
    assert [s.num_steps for s in res.instances] == [3, 3]
    assert res.phases.num_prefill_only_steps == 2  # one per rank
    # without dp (one rank) the short prompt would not wait for the long one
    single = simulate(workload([0, 0], [100, 1000], [3, 3]), moe(dp=1), lat(C, PER_TOKEN))
    assert single.ttft_s[0] == pytest.approx(C + PER_TOKEN * 1100)  # both in one step


def test_an_idle_rank_joins_at_the_next_lockstep_boundary():
    # vLLM 0.10 (no async scheduling). r0 at 0 on rank 0 (const C steps, 5 tokens: done at
    # 5C). r1 at 0.5C: rank 0 scores 1 (running), rank 1 scores 0 -> rank 1, which is in
    # the group's step (a dummy step) until C; its prefill then runs C..2C: TTFT 1.5C
    # (an independent engine would start it at once: TTFT C), done at 2C + 2C = 4C.
    wl = workload([0, 0.5 * C], [10, 10], [5, 3])
    res = simulate(wl, moe(engine_version="0.10.0"), lat())
    np.testing.assert_allclose(res.ttft_s, [C, 1.5 * C])
    np.testing.assert_allclose(res.e2e_s, [5 * C, 3.5 * C])
    # rank 1 logs only its own steps: prefill + 2 decodes
    assert [s.num_steps for s in res.instances] == [5, 3]
    # With async scheduling too: rank 1 had no step planned during 0..C (only a dummy
    # one), so it plans r1 when the group step ends (TTFT 1.5C); one engine (dp 1), busy
    # with r0, planned its C..2C step before r1 came: r1 runs 2C..3C (TTFT 2.5C).
    res = simulate(wl, moe(), lat())
    np.testing.assert_allclose(res.ttft_s, [C, 1.5 * C])
    res = simulate(wl, moe(dp=1), lat())
    np.testing.assert_allclose(res.ttft_s, [C, 2.5 * C])


def test_arrivals_go_to_the_least_loaded_rank_not_round_robin():
    # vLLM 0.10. r0 -> rank 0, r1 -> rank 1 (1 token: done at C). At 1.5C rank 0 runs r0
    # (score 1), rank 1 nothing (0): r2 -> rank 1 (round robin would pick rank 0), which
    # prefills it 2C..3C and decodes its second token 3C..4C.
    wl = workload([0, 0, 1.5 * C], [10] * 3, [10, 1, 2])
    res = simulate(wl, moe(engine_version="0.10.0"), lat())
    np.testing.assert_allclose(res.e2e_s, [10 * C, C, 2.5 * C])
    assert [s.num_steps for s in res.instances] == [10, 3]
    assert res.phases.num_mixed_steps == 0  # rank 0 only ever decodes r0 after step 1


def test_a_waiting_request_weighs_four_running_ones():
    # vLLM 0.10. At 0: r0 -> rank 0, r1 -> rank 1 (1 token: done at C), r2 -> rank 0
    # (scores 4 / 4: the lowest rank). At 1.5C rank 0 runs r0 and r2 (score 2), rank 1
    # nothing: r3 -> rank 1, now 4 x 1 waiting = 4 > 2, so r4 -> rank 0 (with waiting
    # weighing 1 it would go to rank 1). Rank 0's 2C..3C step decodes r0, r2 and prefills
    # r4: the one mixed step; rank 1's prefills r3 alone.
    wl = workload([0, 0, 0, 1.5 * C, 1.5 * C], [10] * 5, [10, 1, 10, 2, 2])
    res = simulate(wl, moe(engine_version="0.10.0"), lat())
    np.testing.assert_allclose(res.e2e_s, [10 * C, C, 10 * C, 2.5 * C, 2.5 * C])
    assert res.phases.num_mixed_steps == 1
    assert [s.num_steps for s in res.instances] == [10, 3]


@pytest.mark.parametrize("routing", list(RoutingPolicy))
def test_replicas_are_routed_first_then_ranks(routing):
    # 2 replicas x dp 2: four requests at once reach every rank once, whatever the policy
    cfg = ServingConfig.colocated(
        "test-moe",
        InstanceConfig(accelerator="h200", dp=2, expert_parallel=True),
        num_replicas=2,
        routing=routing,
    )
    res = simulate(workload([0] * 4, [10] * 4, [4] * 4), cfg, lat())
    assert res.num_gpus == 4 and [s.num_steps for s in res.instances] == [4, 4, 4, 4]
    np.testing.assert_allclose(res.e2e_s, [4 * C] * 4)


def test_each_rank_has_the_plans_kv_blocks():
    cfg = moe(dp=4)
    (plan,) = cfg.roles()
    res = simulate(workload([0], [10], [2]), cfg, lat())
    assert [s.kv_blocks for s in res.instances] == [plan.kv_blocks] * 4


def test_moe_decode_floor_scales_by_the_active_experts():
    from optimizer.hardware import get_accelerator
    from optimizer.parallel import ExpertLayout

    acc = get_accelerator("h200")
    layout = ExpertLayout(4, True)
    # by hand: (4 GiB + 64 GiB / 4) per GPU x 8 / 128 experts, over 4.8 TB/s
    want = 20 * 1024**3 * 8 / 128 / 4.8e12
    assert decode_floor_s(MOE, acc, 1, layout) == pytest.approx(want)


@pytest.mark.parametrize("force_general", [False, True])
def test_invariants_hold_and_every_request_finishes(force_general):
    wl = synthetic_workload(
        300, 40.0, input_lengths=LognormalLength(600, 0.6, max_tokens=3000),
        output_lengths=FixedLength(40), seed=3,
    )  # fmt: skip
    latency = SingleLatencySource(
        LinearLatency(base_s=0.008, per_token_s=2e-5, per_kv_token_s=3e-8)
    )
    for cfg in (
        moe(dp=4, replicas=2, max_num_seqs=16),
        ServingConfig.disaggregated(
            "test-moe",
            InstanceConfig(accelerator="h200", dp=2, expert_parallel=True),
            InstanceConfig(accelerator="h200", dp=4, expert_parallel=True, max_num_seqs=32),
        ),
    ):
        res = simulate(wl, cfg, latency, check_invariants=True, force_general=force_general)
        assert res.num_rejected == 0 and not np.isnan(res.e2e_s).any()
        assert (res.ttft_s <= res.e2e_s + 1e-12).all()
        assert all(s.leaked_blocks == 0 for s in res.instances)
        assert len(res.instances) == sum(p.count * p.instance.dp for p in cfg.roles())
