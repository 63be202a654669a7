"""A Gated DeltaNet hybrid with prefix caching on vLLM >= 0.14: its attention block is
enlarged until a page holds a GDN layer's state, and its prompt chunks end on those
blocks' boundaries (vLLM's mamba_cache_mode "align", `BaseScheduler.aligned_chunk`).
Cases worked by hand; the block sizes are the ones the measured Qwen3.6-35B-A3B steps on
B300 show (observations/aic-fpm-b300: 4,096-token prompts run as 3,168 + 928 tokens at
TP 2 and 3,696 + 400 at TP 4, 1,024-token prompts as 528 + 496 at TP 4)."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.shapes import get_shape
from optimizer.sim import simulate
from optimizer.workload import Workload

MODEL = "qwen3.6-35b-a3b"
C = 0.010  # constant step time (s)


def test_the_hybrid_block_by_hand():
    """Qwen3.6-35B-A3B at TP 1: a GDN layer's state is 32 heads x 128 x 128 x 4 B (float32)
    + 8,192 conv channels x 3 x 2 B = 2,146,304 B; a full-attention layer's KV is 2 x 2
    heads x 256 x 2 B = 2,048 B a token: 16 x ceil(2,146,304 / (16 x 2,048) = 65.5) =
    1,056 tokens. TP 2 halves both (1,056); TP 4 halves the state again while the 2 KV
    heads stay 1 a GPU: 16 x ceil(536,576 / 16,384 = 32.75) = 528. Qwen3.5-27B: 784, as
    vLLM logs for that shape. A model without GDN layers: 0."""
    shape = get_shape(MODEL)
    assert shape.gdn.state_bytes(1, shape.dtype_bytes) == 2_146_304
    assert [shape.hybrid_block_tokens(tp) for tp in (1, 2, 4)] == [1056, 1056, 528]
    assert get_shape("qwen3.5-27b").hybrid_block_tokens(2) == 784
    assert get_shape("qwen3-32b").hybrid_block_tokens(2) == 0


def _ttft(prompt: int, **config) -> float:
    version = config.pop("engine_version", "0.20.1")
    cfg = ServingConfig.colocated(
        MODEL, InstanceConfig(accelerator="h200", tp=2), engine_version=version, **config
    )
    wl = Workload(np.zeros(1), np.array([prompt]), np.array([2]))
    res = simulate(wl, cfg, SingleLatencySource(LinearLatency(base_s=C)))
    return float(res.ttft_s[0])


@pytest.mark.parametrize(
    ("prompt", "steps"),
    [
        (1024, 1),  # under one block (1,056): no boundary to stop at
        (4096, 2),  # to the last boundary, 3 x 1,056 = 3,168, then the 928 past it
        (3168, 1),  # a whole number of blocks: one chunk
        # 8,192 of budget ends before the last boundary (9 x 1,056 = 9,504): rounded down
        # to 7 blocks, 7,392; then 2,112 to the boundary; then the last 496
        (10_000, 3),
    ],
)
def test_prompt_chunks_end_on_block_boundaries(prompt, steps):
    assert _ttft(prompt, enable_prefix_caching=True) == pytest.approx(steps * C)


def test_no_prefix_caching_or_an_older_engine_chunks_by_the_budget_alone():
    """vLLM sets the "align" mode only with prefix caching on; the synchronous generation
    (vLLM 0.12) is priced without it: 10,000 tokens are 8,192 + 1,808."""
    assert _ttft(10_000, enable_prefix_caching=False) == pytest.approx(2 * C)
    assert _ttft(10_000, enable_prefix_caching=True, engine_version="0.12.0") == pytest.approx(
        2 * C
    )


def test_several_prompts_cut_in_one_step_all_finish_with_the_books_balanced():
    """Six 4,096-token prompts at once: each first step holds two prompts' 3,168 tokens
    and a third's 1,056 (8,192 - 6,336 = 1,856, rounded down to a block), so several
    prompts are unfinished at once; the block accounting holds every step (the
    per-request scheduler runs them) and every request finishes."""
    cfg = ServingConfig.colocated(MODEL, InstanceConfig(accelerator="h200", tp=2),
                                  engine_version="0.20.1", enable_prefix_caching=True)  # fmt: skip
    wl = Workload(np.zeros(6), np.full(6, 4096), np.full(6, 8))
    lat = SingleLatencySource(LinearLatency(base_s=C))
    res = simulate(wl, cfg, lat, check_invariants=True)
    assert res.num_completed == 6
    # the first two finish their prompts in the second step (928 tokens each, beside the
    # third's 2,112 to its boundary and the next two's first 3,168 and 1,056): 2 C
    assert res.ttft_s[0] == pytest.approx(2 * C) and res.ttft_s[1] == pytest.approx(2 * C)
