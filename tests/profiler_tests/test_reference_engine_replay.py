"""The reference engine end to end on the tiny shape (CPU, seconds; no timing assertions)."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.config import InstanceConfig, ServingConfig, SpecMethod, SpeculationConfig
from profiler.reference_engine import Clock, EngineError, ReplayOptions, ReplayRequests, replay

INSTANCE = InstanceConfig(
    accelerator="cpu", max_num_batched_tokens=64, max_num_seqs=4, gpu_memory_utilization=0.05
)


def requests(prompts: list[int], outputs: list[int]) -> ReplayRequests:
    return ReplayRequests(
        np.zeros(len(prompts)), np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64)
    )


@pytest.mark.parametrize("clock", [Clock.WALL, Clock.CPU])
def test_colocated_replay_records_every_token(clock: Clock) -> None:
    reqs = ReplayRequests(np.array([0.0, 0.0, 5.0]), np.array([40, 100, 8]), np.array([5, 3, 1]))
    cfg = ServingConfig.colocated("tiny", INSTANCE)
    result = replay(reqs, cfg, ReplayOptions(clock=clock))
    assert result.output_tokens.tolist() == [5, 3, 1]
    assert np.all(result.ttft_s > 0) and np.all(result.e2e_s >= result.ttft_s)
    assert np.isnan(result.tpot_s[2]) and np.all(result.tpot_s[:2] > 0)
    assert result.itl_s.size == (5 - 1) + (3 - 1)
    steps = result.steps[0][1]
    assert max(s.num_tokens for s in steps) <= 64  # the token budget holds
    assert result.first_token_s[2] >= 5.0  # released at its arrival (the cpu clock jumps)


def _speculative(alpha: float) -> ServingConfig:
    spec = SpeculationConfig(
        method=SpecMethod.DRAFT, num_speculative_tokens=3, acceptance_rate=alpha,
        draft_model="tiny-draft",
    )  # fmt: skip
    return ServingConfig.colocated("tiny", INSTANCE, speculation=spec)


@pytest.mark.parametrize(("alpha", "decode_steps"), [(1.0, 2), (0.0, 8)])
def test_speculation_tokens_per_step(alpha: float, decode_steps: int) -> None:
    # 9 output tokens: the prefill emits 1, then K+1 = 4 per step at alpha 1, 1 at alpha 0
    result = replay(requests([16], [9]), _speculative(alpha))
    steps = result.steps[0][1]
    decodes = [s for s in steps if s.num_decode_seqs]
    assert len(decodes) == decode_steps
    assert all(s.num_tokens == 4 and s.num_draft_steps == 3 for s in decodes)
    zero_gaps = int(np.sum(result.itl_s == 0))
    assert zero_gaps == (6 if alpha == 1.0 else 0)  # tokens arriving together


def test_disaggregated_transfers_kv_between_processes() -> None:
    cfg = ServingConfig.disaggregated("tiny", INSTANCE, INSTANCE)
    result = replay(requests([30, 50, 20], [4, 1, 6]), cfg)
    assert result.num_kv_transfers == 2  # the 1-token output finishes on the prefill side
    assert result.kv_transfer_bytes == (30 + 20) * cfg.shape.kv_bytes_per_token()
    assert result.output_tokens.tolist() == [4, 1, 6]
    roles = dict(result.steps)
    assert all(s.num_decode_seqs == 0 for s in roles["prefill"])
    assert sum(s.num_decode_seqs for s in roles["decode"]) == (4 - 1) + (6 - 1)


def test_requests_beyond_capacity_are_refused() -> None:
    with pytest.raises(EngineError, match="needs"):
        replay(
            requests([10**6], [2]),
            ServingConfig.colocated("tiny", INSTANCE),
        )
