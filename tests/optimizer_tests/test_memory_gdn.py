"""A Gated DeltaNet model's fixed per-sequence state in the KV pool: the blocks it takes,
worked by hand, and what it does to how many sequences an instance runs."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.config import ConfigError, InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.memory import kv_capacity_blocks, state_blocks_per_sequence
from optimizer.shapes import get_shape
from optimizer.sim import simulate
from optimizer.sim.kv_blocks import KVBlockPool
from optimizer.sim.request import SimRequest
from optimizer.workload import Workload
from tests.factories import instance_with_blocks

MODEL = "qwen3.6-35b-a3b"
C = 0.010  # constant step time (s)


def test_state_blocks_by_hand():
    """Qwen3.6-35B-A3B, 16-token blocks: a block holds 16 x 20,480 B = 327,680 B of the 10
    full layers' KV; the 64,389,120 B state (30 GDN layers) takes ceil(196.5) = 197 of
    them. tp 4: 16 x 10,240 = 163,840 B blocks, 16,097,280 B of state: ceil(98.25) = 99.
    Blocks of 64 tokens: ceil(64,389,120 / 1,310,720 = 49.1) = 50. A model without GDN
    layers: none."""
    shape = get_shape(MODEL)
    assert state_blocks_per_sequence(shape, InstanceConfig()) == 197
    assert state_blocks_per_sequence(shape, InstanceConfig(tp=4)) == 99
    assert state_blocks_per_sequence(shape, InstanceConfig(block_size=64)) == 50
    assert state_blocks_per_sequence(get_shape("qwen3-30b-a3b"), InstanceConfig()) == 0


def test_the_pool_gives_a_sequence_its_state_with_its_first_block():
    pool = KVBlockPool(num_blocks=10, block_size=16, state_blocks=3)
    r = SimRequest(0, 0.0, num_prompt=20, num_output=4, stop_at=4)
    assert pool.extra_blocks(r, 20) == 2 + 3
    pool.grow(r, 5)
    assert pool.extra_blocks(r, 32) == 0 and pool.extra_blocks(r, 33) == 1
    pool.release(r)
    assert (r.num_blocks, pool.num_free) == (0, 10)
    with pytest.raises(ValueError, match="state_blocks >= 0"):
        KVBlockPool(num_blocks=10, block_size=16, state_blocks=-1)


def test_the_roles_carry_the_state_blocks():
    cfg = ServingConfig.colocated(MODEL, InstanceConfig(accelerator="h200"))
    (plan,) = cfg.roles()
    assert plan.state_blocks == 197
    assert plan.kv_blocks == kv_capacity_blocks(get_shape(MODEL), plan.instance)
    (dense,) = ServingConfig.colocated("qwen3-30b-a3b", InstanceConfig()).roles()
    assert dense.state_blocks == 0


def test_short_contexts_run_as_many_sequences_as_the_state_allows():
    """1,000 blocks and 12 requests of 16 + 8 tokens, all at t = 0, max_num_seqs 64: each
    sequence takes 1 KV block and its 197 state blocks when admitted, so 5 run (990
    blocks; a 6th needs 198 of the 10 left) and take their second KV block at their 17th
    token (995); then the next 5, then 2. Without the state all 12 would run at once.
    Every request finishes; none is preempted."""
    inst = instance_with_blocks(1000, model=MODEL, max_num_seqs=64, max_num_batched_tokens=2048)
    cfg = ServingConfig.colocated(MODEL, inst)
    wl = Workload(np.zeros(12), np.full(12, 16), np.full(12, 8))
    res = simulate(wl, cfg, SingleLatencySource(LinearLatency(base_s=C)), check_invariants=True)
    (stats,) = res.instances
    assert stats.series_batch_size.max() == pytest.approx(5, rel=1e-12)  # a mean of 5s
    assert stats.peak_kv_used_blocks == 5 * (2 + 197)
    assert res.num_completed == 12 and res.num_preemptions.sum() == 0
    # Waves of 5, 5 and 2: each wave's first token comes one step after the last wave ends
    # (8 tokens: a prefill step and 7 decode steps).
    np.testing.assert_allclose(res.ttft_s, [C] * 5 + [9 * C] * 5 + [17 * C] * 2)


def test_a_request_longer_than_the_pool_less_one_state_is_refused():
    """vLLM sizes max_model_len against the KV the pool holds beside one sequence's
    state: (1,000 - 197) x 16 = 12,848 tokens."""
    inst = instance_with_blocks(1000, model=MODEL, max_num_seqs=64, max_num_batched_tokens=2048)
    ServingConfig.colocated(MODEL, inst, max_model_len=12_848)
    with pytest.raises(ConfigError, match="exceeds the KV cache capacity of 12848 tokens"):
        ServingConfig.colocated(MODEL, inst, max_model_len=12_849)
