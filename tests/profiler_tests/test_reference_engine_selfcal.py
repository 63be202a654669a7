"""Engine self-calibration and the disaggregated CPU clock (CPU, seconds; no timing assertions)."""

from __future__ import annotations

import numpy as np

from optimizer.config import InstanceConfig, Role, ServingConfig, SpecMethod, SpeculationConfig
from optimizer.validation.calibration import kv_tokens_read
from profiler.reference_engine import Clock, ReplayOptions, ReplayRequests, replay
from profiler.reference_engine.realtime import instance_spec
from profiler.reference_engine.selfcal import SyntheticPlan, measure_engine_steps, step_observations

INSTANCE = InstanceConfig(
    accelerator="cpu", max_num_batched_tokens=64, max_num_seqs=4, gpu_memory_utilization=0.05
)
PLAN = SyntheticPlan(
    decode_batches=(1, 3), kv_lengths=(20, 90), arriving_prompts=(100,), num_decode_steps=3,
    passes=2,
)  # fmt: skip


def test_synthetic_steps_cover_prefill_decode_and_mixed() -> None:
    spec = instance_spec(ServingConfig.colocated("tiny", INSTANCE), Role.REPLICA, ReplayOptions())
    records = measure_engine_steps(spec, PLAN)
    assert all(r.seconds > 0 and r.done_s >= r.end_s >= r.start_s for r in records)
    assert all(r.num_tokens <= 64 for r in records)
    assert all(sum(r.prefill_q) == r.num_prefill_tokens for r in records)
    mixed = [r for r in records if r.prefill_q and r.num_decode_seqs]
    assert mixed and any(r.num_decode_seqs == 0 for r in records)
    assert any(kv > q for r in mixed for q, kv in zip(r.prefill_q, r.prefill_kv, strict=True))
    obs = step_observations(records)
    assert len(obs) == len(records)
    for o, r in zip(obs, records, strict=True):
        assert o.load.num_tokens == r.num_tokens
        assert kv_tokens_read(o.load) == r.decode_kv_tokens + sum(r.prefill_kv)
    assert step_observations(records, draft=True) == []
    one = measure_engine_steps(spec, SyntheticPlan(**{**_plan_fields(), "passes": 1}))
    assert len(one) == len(records)  # passes run the same steps; one record kept per step


def _plan_fields() -> dict[str, object]:
    return {f: getattr(PLAN, f) for f in PLAN.__slots__}


def test_speculative_steps_time_the_draft_separately() -> None:
    spec_cfg = SpeculationConfig(
        method=SpecMethod.DRAFT, num_speculative_tokens=2, acceptance_rate=0.5,
        draft_model="tiny-draft",
    )  # fmt: skip
    cfg = ServingConfig.colocated("tiny", INSTANCE, speculation=spec_cfg)
    records = measure_engine_steps(instance_spec(cfg, Role.REPLICA, ReplayOptions()), PLAN)
    drafting = [r for r in records if r.num_draft_steps]
    assert drafting and all(0 < r.draft_s < r.seconds and r.decode_q == 3 for r in drafting)
    draft_obs = step_observations(records, draft=True)
    assert len(draft_obs) == len(drafting)
    assert all(o.load.decode_q == 1 and not o.load.prefill_q for o in draft_obs)


def test_disaggregated_replay_on_cpu_clocks() -> None:
    cfg = ServingConfig.disaggregated("tiny", INSTANCE, INSTANCE)
    reqs = ReplayRequests(
        np.array([0.0, 0.0, 0.5, 3.0]), np.array([30, 50, 20, 40]), np.array([4, 1, 6, 3])
    )
    result = replay(reqs, cfg, ReplayOptions(clock=Clock.CPU))
    assert result.output_tokens.tolist() == [4, 1, 6, 3]
    assert result.num_kv_transfers == 3 and result.kv_transfer_s >= 0
    assert np.all(result.ttft_s > 0) and np.all(result.e2e_s >= result.ttft_s)
    assert result.first_token_s[3] >= 3.0  # released at its arrival on the virtual clock
    assert np.all(result.itl_s >= 0)  # token times stay ordered across the two processes
    roles = dict(result.steps)
    assert sum(s.num_decode_seqs for s in roles["decode"]) == (4 - 1) + (6 - 1) + (3 - 1)
