"""Gated DeltaNet layers priced as vLLM runs them (`optimizer.latency.gdn`): the conv and
copies by their bytes, FLA's delta rule at its published rates, a chunk independent of its
cached prefix, a decoding sequence independent of its context, and the rest of the layer
through the GEMM tables."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.hardware import get_accelerator
from optimizer.latency import gdn, moe
from optimizer.latency.compose import Pricing
from optimizer.latency.roofline import RooflinePricer
from optimizer.model_shape import ModelShape
from optimizer.records import OpKind
from optimizer.shape_parts import GatedDeltaNetSpec
from optimizer.shapes import get_shape

# 4 layers, 3 of them GDN: 2 key heads and 4 value heads of 64, a conv of 4
TOY = ModelShape("toy-hybrid", 4, 512, 8, 2, 64, 1024, 1000,
                 gdn=GatedDeltaNetSpec(3, 2, 4, 64, 64), attn_output_gate=True)  # fmt: skip


def _roofline(shape: ModelShape, tp: int = 1) -> Pricing:
    return Pricing(shape, tp, RooflinePricer(get_accelerator("h100")))


def test_a_chunk_of_the_delta_rule_costs_its_bytes_and_flas_rates_worked_by_hand() -> None:
    """tp 1, bf16, a 128-token chunk. key dim 2 x 64 = 128, value dim 4 x 64 = 256, conv
    dim 2 x 128 + 256 = 512. State: 4 x 64 x 64 x 4 B (fp32) + 512 x 3 x 2 B = 68,608 B.
    Bytes: conv read + written 128 x 512 x 2 x 2 = 262,144; state gathered and scattered
    137,216; q/k/v copies 262,144: 661,504 B, at 80% of 3.35 TB/s; a 4 us launch for each
    of the core's 20 kernels; FLA's delta rule: 2 chunks x 1.17 us + 128 tokens x 4 value
    heads x 1.22 ns. 0.08 + 661,504 / 2.68e9 + 0.00234 + 0.00062464 = 0.083211 ms."""
    ms = gdn.chunk_ms(_roofline(TOY), np.array([128.0]))
    assert ms[0] == pytest.approx(20 * 0.004 + 661_504 / 2.68e9 + 2 * 1.17e-3 + 512 * 1.22e-6,
                                  rel=1e-9)  # fmt: skip


def test_the_delta_rule_runs_at_flas_published_rates() -> None:
    """Qwen3.6-35B-A3B (32 value heads), one 8,192-token chunk: at tp 2, 128 chunks x 1.17
    us + 8,192 x 16 heads x 1.22 ns = 0.30966 ms a layer on H100, the same on B300 (FLA
    times within 5% of H100 there), and 3.35 / 2.0 TB/s slower on A100. Chunks are priced
    one by one, so two 4,096-token chunks cost what one 8,192-token chunk does (vLLM's one
    call overlaps their serial passes: `delta_rule_ms`'s caveat). At tp 4 the heads halve."""
    shape = get_shape("qwen3.6-35b-a3b")

    def rule(gpu: str, tp: int, q: list[float]) -> float:
        pricing = Pricing(shape, tp, RooflinePricer(get_accelerator(gpu)))
        return float(gdn.delta_rule_ms(pricing, np.array(q)).sum())

    assert rule("h100", 2, [8192.0]) == pytest.approx(128 * 1.17e-3 + 8192 * 16 * 1.22e-6)
    assert rule("b300", 2, [8192.0]) == pytest.approx(rule("h100", 2, [8192.0]))
    assert rule("a100", 2, [8192.0]) == pytest.approx(rule("h100", 2, [8192.0]) * 3.35 / 2.0)
    two = rule("h100", 2, [4096.0, 4096.0])
    assert two == pytest.approx(rule("h100", 2, [8192.0]))
    assert rule("h100", 4, [8192.0]) == pytest.approx(128 * 1.17e-3 + 8192 * 8 * 1.22e-6)


def test_gdn_layers_read_their_state_not_the_prefix_or_the_context() -> None:
    """A longer cached prefix or decode context costs more only in the one full-attention
    layer; the three GDN layers' chunk and decode prices do not move."""
    p = _roofline(TOY)
    q = np.array([256.0, 256.0])
    prefill = p.prefill_attn_ms(q, np.array([256.0, 256.0 + 8192]))
    full = p._prefill_layer_ms(q, np.array([256.0, 256.0 + 8192]))
    assert prefill[1] - prefill[0] == pytest.approx(full[1] - full[0])  # one full layer
    assert prefill[0] == pytest.approx(full[0] + 3 * gdn.chunk_ms(p, q)[0])
    b = np.array([8.0, 8.0])
    decode = p.decode_attn_ms(b, np.array([100.0, 100_000.0]))
    per = p._decode_layer_ms(b, np.array([100.0, 100_000.0]), 1)
    assert decode[1] - decode[0] == pytest.approx(per[1] - per[0])
    assert decode[0] == pytest.approx(per[0] + 3 * gdn.decode_ms(p, b)[0])


def test_a_hybrid_step_prices_gdn_projections_and_names_the_roofline_parts() -> None:
    """Qwen3.6-35B-A3B at tp 2: a GDN layer's token-parallel work is its in_proj_qkvz
    (2048 -> 12,288 / 2), in_proj_ba (-> 32), out_proj (2,048 -> 2048) and its block ends;
    the step adds 10 attention layers, 30 GDN layers and 40 MoE MLPs, and the conv and
    recurrence are listed as roofline estimates."""
    shape = get_shape("qwen3.6-35b-a3b")
    p = _roofline(shape, 2)
    m = np.array([256.0])
    block = gdn.block_ms(p, m)
    qkvz = p.price_ms(OpKind.QKV_PROJ, num_tokens=m, n=6144, k=2048)
    assert block > qkvz > 0
    attention = p.layer_ms(m, mlp=False)
    expected = 10 * attention + 30 * block + 40 * moe.moe_block_ms(p, m)
    assert gdn.layers_ms(p, m) == pytest.approx(expected)
    assert {"gdn_prefill", "gdn_decode"} <= set(p.estimated_ops())
