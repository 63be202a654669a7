"""The KV pool as the only owner of the simulator's block counts (vLLM's `KVCacheManager`):
its named operations, worked by hand, and the scheduler's `add_request`, through which the
event loop hands it requests."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.sim import simulate
from optimizer.sim.kv_blocks import KVBlockPool
from optimizer.sim.kv_cache import PrefixCache
from optimizer.sim.scheduler import BaseScheduler
from optimizer.workload import Workload
from tests.factories import make_sim_request, make_sim_scheduler

SIM = Path(__file__).resolve().parents[2] / "optimizer" / "sim"


def test_can_allocate_keeps_the_reserve_free():
    pool = KVBlockPool(num_blocks=10, block_size=16)
    assert pool.can_allocate(10) and not pool.can_allocate(11)
    assert pool.can_allocate(8, reserve=2) and not pool.can_allocate(9, reserve=2)


def test_aggregate_blocks_are_settled_on_the_request_that_leaves_the_decode_set():
    pool = KVBlockPool(num_blocks=10, block_size=16, state_blocks=1)
    r = make_sim_request(prompt=20)
    pool.grow(r, pool.extra_blocks(r, 20))  # 2 KV blocks + its state block
    assert (r.num_blocks, pool.num_free) == (3, 7)
    pool.allocate(1)  # its 33rd token, taken for the decode set: not charged to it yet
    assert (r.num_blocks, pool.num_free) == (3, 6)
    pool.settle(r, 33)
    assert r.num_blocks == pool.num_used == 4
    pool.release(r)
    assert (r.num_blocks, pool.num_free) == (0, 10)


def test_prefix_blocks_are_shared_revived_and_evicted_through_the_pool():
    cache = PrefixCache(block_tokens=32, kv_block_size=16)  # a hash block is 2 KV blocks
    pool = KVBlockPool(num_blocks=10, block_size=16, cache=cache)
    r0 = make_sim_request(0, prompt=70)
    pool.grow(r0, pool.extra_blocks(r0, 70))
    r0.num_computed = 70
    pool.register_prefix(r0, [11, 12, 13])  # 2 whole hash blocks: 4 KV blocks now shared
    assert (r0.refs, r0.num_blocks, r0.num_ref_blocks, pool.num_free) == ([11, 12], 1, 4, 5)

    r1 = make_sim_request(1, prompt=70)
    assert cache.lookup([11, 12, 13], 70, 70) == (2, 0)  # held by r0: nothing to revive
    pool.acquire_prefix(r1, [11, 12])
    assert (r1.num_ref_blocks, pool.num_free) == (4, 5)
    for r in (r0, r1):
        pool.release(r)
        pool.release_refs(r)
    assert (r0.refs, r1.num_ref_blocks) == (None, 0)
    assert (pool.num_free, cache.evictable_blocks) == (10, 4)  # cached blocks count as free

    r2 = make_sim_request(2, prompt=70)
    assert cache.lookup([11, 12, 13], 70, 70) == (2, 4)
    pool.acquire_prefix(r2, [11, 12])  # revived from the free blocks
    assert (pool.num_free, cache.evictable_blocks) == (6, 0)
    pool.release_refs(r2)  # released last block first: 12 is evicted before 11
    pool.allocate(7)
    assert pool.num_free == 3 and 11 in cache and 12 not in cache


def test_a_prefix_computed_twice_at_once_is_kept_once():
    pool = KVBlockPool(num_blocks=10, block_size=16, cache=PrefixCache(32, 16))
    r0, r1 = make_sim_request(0, prompt=40), make_sim_request(1, prompt=40)
    for r in (r0, r1):
        pool.grow(r, pool.extra_blocks(r, 40))
        r.num_computed = 40
    assert pool.num_free == 4
    pool.register_prefix(r0, [5])
    pool.register_prefix(r1, [5])  # r1 gives up its copy for r0's
    assert (r1.num_blocks, r1.num_ref_blocks, pool.num_free) == (1, 2, 6)


def test_a_handed_off_prompt_keeps_its_blocks_until_pulled():
    cache = PrefixCache(block_tokens=32, kv_block_size=16)
    pool = KVBlockPool(num_blocks=10, block_size=16, cache=cache)
    r = make_sim_request(prompt=40, output=5, stop_at=1)
    pool.grow(r, pool.extra_blocks(r, 40))
    r.num_computed = 40
    pool.register_prefix(r, [5])
    pool.hold_for_pull(r)
    assert (r.num_blocks, r.num_ref_blocks, r.refs) == (0, 0, None)  # the decode side's now
    assert (pool.num_used, pool.handoff_blocks) == (3, 1)
    pool.release_pulled(r.rid)
    assert (pool.num_free, pool.handoff_blocks, pool.handoff) == (10, 0, {})
    assert 5 in cache and cache.evictable_blocks == 2


def test_only_the_pool_writes_block_counts():
    """No simulator module but the pool and the prefix cache it owns assigns a block count
    (the pool's free count and hand-offs, a request's blocks and references)."""
    owned = {"num_free", "num_blocks", "num_ref_blocks", "refs", "handoff", "handoff_blocks"}
    writers = []
    for path in sorted(SIM.glob("*.py")):
        if path.name in ("kv_blocks.py", "kv_cache.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr in owned:
                    writers.append(f"{path.name}:{node.lineno} .{t.attr}")
    assert writers == []


@pytest.mark.parametrize("general", [False, True])
def test_add_request_queues_in_order_and_counts_outstanding_tokens(general):
    s = make_sim_scheduler(general=general)
    a, b = make_sim_request(0, prompt=20, output=4), make_sim_request(1, prompt=30, output=2)
    s.add_request(a)
    s.add_request(b)
    assert list(s.waiting) == [a, b] and s.outstanding == 24 + 32 and s.has_work()
    t = 0.0
    while s.has_work():  # one 10 ms step at a time: both prompts fit the first
        assert s.schedule(t) is not None
        t += 0.010
        s.complete(t)
    np.testing.assert_allclose(s.log.first_token_s[:2], [0.010, 0.010])
    np.testing.assert_allclose(s.log.finish_s[:2], [0.040, 0.020])
    assert s.outstanding == 0 and s.pool.num_free == 10


@pytest.mark.parametrize("disaggregated", [False, True])
def test_the_event_loop_hands_requests_over_through_add_request(monkeypatch, disaggregated):
    added: list[tuple[str, int]] = []
    add = BaseScheduler.add_request

    def recording(self, r):
        added.append((self.role, r.rid))
        add(self, r)

    monkeypatch.setattr(BaseScheduler, "add_request", recording)
    inst = InstanceConfig(accelerator="h100")
    if disaggregated:
        cfg = ServingConfig.disaggregated("llama-3.1-8b", inst, inst)
    else:
        cfg = ServingConfig.colocated("llama-3.1-8b", inst)
    wl = Workload(np.array([0.0, 0.0, 0.5]), np.array([100, 200, 300]), np.array([3, 4, 5]))
    res = simulate(wl, cfg, SingleLatencySource(LinearLatency(base_s=0.01)))
    assert res.num_completed == 3
    roles = ("prefill", "decode") if disaggregated else ("replica",)  # each once, in order
    assert [a for a in added if a[0] == roles[0]] == [(roles[0], rid) for rid in range(3)]
    assert sorted(added) == sorted((role, rid) for role in roles for rid in range(3))
