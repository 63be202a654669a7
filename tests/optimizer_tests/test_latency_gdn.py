"""Gated DeltaNet layers priced as vLLM runs them (`optimizer.latency.gdn`): the chunked
recurrence by its bytes, a chunk independent of its cached prefix, a decoding sequence
independent of its context, and the rest of the layer through the GEMM tables."""

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


def test_a_chunk_of_the_delta_rule_costs_its_bytes_worked_by_hand() -> None:
    """tp 1, bf16, a 128-token chunk. key dim 2 x 64 = 128, value dim 4 x 64 = 256, conv
    dim 2 x 128 + 256 = 512. State: 4 x 64 x 64 x 4 B (fp32) + 512 x 3 x 2 B = 68,608 B.
    Bytes: conv read + written 128 x 512 x 2 x 2 = 262,144; output 128 x 256 x 2 = 65,536;
    state read and written 137,216; two 64-token snapshots written and read back
    2 x 68,608 x 2 = 274,432; q/k/v copies 262,144: 1,001,472 B. At 80% of 3.35 TB/s,
    plus a 4 us launch for each of the core's 20 kernels: 0.08 + 1,001,472 / 2.68e9 ms
    = 0.080374 ms (at this size the launches are nearly all of it)."""
    ms = gdn.chunk_ms(_roofline(TOY), np.array([128.0]))
    assert ms[0] == pytest.approx(20 * 0.004 + 1_001_472 / 2.68e9, rel=1e-9)


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
