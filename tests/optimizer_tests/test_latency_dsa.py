"""DeepSeek sparse attention's pricing (`optimizer.latency.dsa`): golden key counts worked
by hand, and what the sparse layers cost against V3's dense MLA on the roofline."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.engines import EngineRelease
from optimizer.latency import build_catalog, dsa
from optimizer.latency.base import StepLoad
from optimizer.parallel import ExpertLayout
from optimizer.shapes import get_shape


def test_sparse_keys_worked_by_hand():
    # A fresh chunk of 4 queries, top-2: they read 1, 2, 2 and 2 keys of the causal 1-4.
    assert dsa.sparse_keys(np.array([4.0]), np.array([4.0]), 2)[0] == 7
    assert dsa.causal_keys(np.array([4.0]), np.array([4.0]))[0] == 10
    # 3 queries after 7 cached tokens, top-8: min(8, 8) + min(9, 8) + min(10, 8) = 24 of 27.
    assert dsa.sparse_keys(np.array([3.0]), np.array([10.0]), 8)[0] == 24
    assert dsa.sparse_share(np.array([3.0]), np.array([10.0]), 8)[0] == pytest.approx(24 / 27)
    # Under topk every query reads all its keys.
    assert dsa.sparse_share(np.array([100.0]), np.array([1000.0]), 2048)[0] == 1.0


def _step_ms(name: str, load: StepLoad) -> float:
    table = build_catalog(get_shape(name), []).for_instance(
        "b200", 8, engine=EngineRelease("vllm", "0.20.1"), layout=ExpertLayout(1, True)
    )
    return table.step_time_s(load) * 1e3


def _decode(kv: int, b: int = 32) -> StepLoad:
    return StepLoad(num_tokens=b, num_logits=b, num_decode_seqs=b, decode_kv_tokens=b * kv)


def test_a_sparse_decode_grows_with_context_only_by_its_indexer():
    """Past index_topk keys a V3.2 decode step reads no more of the latent cache: from 16k
    to 32k tokens of context it grows by the indexer's reads alone, a fraction of what
    V3's dense MLA adds; under topk the two differ by the indexer and its projections."""
    v3 = _step_ms("deepseek-v3", _decode(32768)) - _step_ms("deepseek-v3", _decode(16384))
    v32 = _step_ms("deepseek-v3.2", _decode(32768)) - _step_ms("deepseek-v3.2", _decode(16384))
    assert 0 < v32 < 0.5 * v3
    short = _step_ms("deepseek-v3.2", _decode(1024)) - _step_ms("deepseek-v3", _decode(1024))
    assert 0 < short < 0.1 * _step_ms("deepseek-v3", _decode(1024))


def test_a_long_prefill_chunk_reads_topk_keys_a_query():
    """A 4,096-token chunk after 60k cached tokens: V3's attention reads ~62k keys a
    query, V3.2's 2,048 plus the indexer's scores, so the chunk costs less."""
    chunk = StepLoad(num_tokens=4096, num_logits=1, prefill_q=(4096,), prefill_kv=(65536,))
    assert _step_ms("deepseek-v3.2", chunk) < _step_ms("deepseek-v3", chunk)


def test_the_indexer_adds_its_launches_to_each_sparse_layer():
    """12 more launches a layer in an eager forward, 5 of them (sparse_attn_indexer's)
    outside the piecewise graphs: 61 layers of V3.2."""
    from optimizer.latency.launches import count_launches

    layout = ExpertLayout(1, True)
    v3 = count_launches(get_shape("deepseek-v3"), 8, layout)
    v32 = count_launches(get_shape("deepseek-v3.2"), 8, layout)
    assert (v32.eager - v3.eager, v32.piecewise - v3.piecewise) == (61 * 12, 61 * 5)
