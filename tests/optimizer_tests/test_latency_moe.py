"""MoE pricing: the fused MoE operator's features and variants, a MoE step under each
expert layout, and one compiled table per layout (issue 27)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from optimizer.engines import EngineRelease
from optimizer.hardware import get_accelerator
from optimizer.latency import build_catalog, fit_latency_model
from optimizer.latency.compose import Pricing
from optimizer.latency.features import OpBatch, op_format, work
from optimizer.latency.model import FitOptions, LatencyModelError
from optimizer.latency.moe import expert_tokens, moe_block_ms
from optimizer.latency.persist import dump_model, load_model
from optimizer.latency.roofline import RooflinePricer
from optimizer.latency.table_bytes import table_from_bytes, table_to_bytes
from optimizer.parallel import ExpertLayout
from optimizer.records import KernelSample, OpKind
from optimizer.shape_parts import MoESpec
from optimizer.shapes import ModelShape, get_shape

# A Qwen3-30B-A3B-like MoE: 48 layers, 128 experts of 768, top-8, no shared experts.
MOE = ModelShape("test-moe", 48, 2048, 32, 4, 128, 6144, 151936,
                 moe=MoESpec(128, 8, 768))  # fmt: skip
# DeepSeek-like: the first layer dense, one shared expert.
SHARED_SPEC = MoESpec(64, 6, 512, shared_intermediate_size=1024, first_dense_layers=1)
SHARED = ModelShape("test-moe-shared", 8, 2048, 16, 16, 128, 4096, 32000, moe=SHARED_SPEC)
B300 = RooflinePricer(get_accelerator("b300"))


def _moe_samples(rng: np.random.Generator, dtype: str, n: int = 200) -> list[KernelSample]:
    """Synthetic fused-MoE timings: roofline-shaped with noise (enough to fit on)."""
    out = []
    for _ in range(n):
        tokens = int(2 ** rng.integers(0, 15))
        tp, ep = [(1, 1), (2, 1), (1, 2), (1, 8), (4, 1)][rng.integers(0, 5)]
        b = OpBatch.make(OpKind.MOE, num_tokens=tokens, n=768, k=2048, batch_size=8,
                         num_heads=128, tp=tp, num_gpus=ep)  # fmt: skip
        ms = float(B300.predict_ms(b)[0]) * float(rng.uniform(0.9, 1.1))
        out.append(KernelSample(OpKind.MOE, ms, ms, ms, dtype=dtype, num_tokens=tokens,
                                n=768, k=2048, batch_size=8, num_heads=128, tp=tp,
                                num_gpus=ep))  # fmt: skip
    return out


def test_moe_work_counts_the_routed_pairs_and_the_weights_they_touch() -> None:
    one = OpBatch.make(OpKind.MOE, num_tokens=1, n=768, k=2048, batch_size=8, num_heads=128,
                       tp=1, num_gpus=1)  # fmt: skip
    flops, moved = work(one)
    assert flops[0] == 2 * 8 * 2048 * 3 * 768  # 8 experts' gated GEMMs for one token
    assert moved[0] > 8 * 3 * 768 * 2048 * 2  # at least those 8 experts' bf16 weights
    many = OpBatch.make(OpKind.MOE, num_tokens=4096, n=768, k=2048, batch_size=8,
                        num_heads=128, tp=1, num_gpus=8)  # fmt: skip
    f8, m8 = work(many)
    # EP 8: an eighth of the pairs; weights of the 16 local experts only
    assert f8[0] == pytest.approx(2 * 4096 * 8 / 8 * 2048 * 3 * 768)
    weights, tokens, pairs = 16 * 3 * 768 * 2048 * 2, 2 * 4096 * 2048 * 2, 4096 * (2048 + 2304) * 2
    assert m8[0] == pytest.approx(weights + tokens + pairs)
    fp4 = OpBatch.make(OpKind.MOE, weight_dtype_bytes=0.5625, weight_format="fp4",
                       num_tokens=1, n=768, k=2048, batch_size=8, num_heads=128)  # fmt: skip
    assert op_format(fp4) == "fp4" and work(fp4)[1][0] < moved[0] / 3


def test_4bit_moe_variants_fit_apart_and_round_trip() -> None:
    rng = np.random.default_rng(0)
    samples = _moe_samples(rng, "bfloat16") + _moe_samples(rng, "fp4")
    model = fit_latency_model(samples, accelerator="b300", options=FitOptions(max_iter=20))
    assert set(model.op_names()) == {"moe", "moe:fp4"}
    bf16 = OpBatch.make(OpKind.MOE, num_tokens=64, n=768, k=2048, batch_size=8, num_heads=128)
    fp4 = dataclasses.replace(bf16, weight_dtype_bytes=0.5625, weight_format="fp4")
    assert model.predict_ms(fp4)[0] != model.predict_ms(bf16)[0]
    with pytest.raises(LatencyModelError, match="fitted and priced apart"):
        model.ops[OpKind.MOE].predict_ms(fp4)
    restored = load_model(dump_model(model))
    assert restored.op_names() == model.op_names()
    assert restored.predict_ms(fp4)[0] == model.predict_ms(fp4)[0]


def test_a_moe_step_runs_the_experts_over_every_dp_ranks_tokens() -> None:
    dense = Pricing(MOE, 2, B300)
    dp_ep = Pricing(MOE, 2, B300, layout=ExpertLayout(dp=4, expert_parallel=True))
    m = np.array([256.0])
    assert expert_tokens(dp_ep, m)[0] == 1024 and expert_tokens(dense, m)[0] == 256
    # Same per-rank tokens: DP x EP adds the other ranks' tokens and the all-gather.
    assert moe_block_ms(dp_ep, m)[0] != moe_block_ms(dense, m)[0]
    assert dp_ep.dense_ms(m)[0] > 0 and dense.dense_ms(m)[0] > 0
    assert "moe_allgather_reducescatter" in dp_ep.estimated_ops()  # roofline: no NCCL model
    deepep = Pricing(MOE, 1, B300, layout=ExpertLayout(8, True), all2all="deepep")
    assert {"moe_dispatch", "moe_combine"} <= set(deepep.estimated_ops())
    # Shared experts and the leading dense layer are priced too.
    no_shared = dataclasses.replace(
        SHARED, moe=dataclasses.replace(SHARED.moe, shared_intermediate_size=0)
    )
    assert Pricing(SHARED, 1, B300).dense_ms(m)[0] > Pricing(no_shared, 1, B300).dense_ms(m)[0]


def test_layouts_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError, match="is dense"):
        Pricing(get_shape("qwen3-32b"), 1, B300, layout=ExpertLayout(2, True))
    with pytest.raises(ValueError, match="EP size"):
        Pricing(MOE, 1, B300, layout=ExpertLayout(3, True))  # 128 experts over 3 GPUs
    with pytest.raises(ValueError, match="all2all"):
        Pricing(MOE, 1, B300, all2all="pplx")
    catalog = build_catalog(MOE, [])
    with pytest.raises(LookupError, match="EP size"):
        catalog.for_instance("b300", 1, layout=ExpertLayout(3, True))


def test_4bit_weights_fall_back_to_the_roofline_labelled() -> None:
    rng = np.random.default_rng(1)
    model = fit_latency_model(_moe_samples(rng, "bfloat16"), accelerator="b300",
                              options=FitOptions(max_iter=20))  # fmt: skip
    bf16 = Pricing(MOE, 1, B300, model)
    assert "moe" not in bf16.estimated_ops()
    fp4 = Pricing(dataclasses.replace(MOE, quantization="fp4"), 1, B300, model)
    assert {"moe:fp4", "qkv_proj:fp4"} <= set(fp4.estimated_ops())
    m = np.array([4096.0])
    assert fp4.dense_ms(m)[0] < bf16.dense_ms(m)[0]  # 4-bit experts and FP4 peak


def test_one_table_per_layout_and_store_keys_that_say_it() -> None:
    catalog = build_catalog(MOE, [])
    release = EngineRelease("vllm", "0.20.1")
    plain = catalog.for_instance("b300", 2, engine=release)
    ep = catalog.for_instance("b300", 2, engine=release, layout=ExpertLayout(1, True))
    dp_ep = catalog.for_instance("b300", 2, engine=release, layout=ExpertLayout(4, True))
    assert (plain.layout, ep.layout, dp_ep.layout) == ("", "dp1-ep", "dp4-ep")
    assert plain.dense_ms != dp_ep.dense_ms and plain.dense_ms != ep.dense_ms
    assert catalog.for_instance("b300", 2, engine=release, layout=ExpertLayout(4, True)) is dp_ep
    acc, grid = get_accelerator("b300"), plain.grid
    dense_key = catalog.store_key(None, acc, 2, grid, MOE, release)
    ep_key = catalog.store_key(None, acc, 2, grid, MOE, release, ExpertLayout(1, True))
    assert "layout" not in dense_key and ep_key == dense_key + "|layout-dp1-ep"
    assert table_from_bytes(table_to_bytes(dp_ep)).layout == "dp4-ep"
    assert table_from_bytes(table_to_bytes(plain)).layout == ""


def test_mla_attention_is_priced_by_the_roofline_at_its_latent_width_and_says_so() -> None:
    from optimizer.shape_parts import MLASpec

    mha = ModelShape("test-mla", 4, 2048, 16, 16, 128, 4096, 32000)
    mla = dataclasses.replace(mha, mla=MLASpec(512, 64, 128, 128, q_lora_rank=1536))
    rng = np.random.default_rng(2)
    model = fit_latency_model(_moe_samples(rng, "bfloat16"), accelerator="b300",
                              options=FitOptions(max_iter=20))  # fmt: skip
    ops = set(Pricing(mla, 2, B300, model).estimated_ops())
    assert {"prefill_attn:mla", "decode_attn:mla"} <= ops and "decode_attn" not in ops
    assert "decode_attn:mla" not in Pricing(mha, 2, B300, model).estimated_ops()
    seqs, kv = np.array([64.0]), np.array([32768.0])
    # decode reads one 576-wide latent row per token, not 8 heads x 2 x 128 per GPU
    latent = Pricing(mla, 2, B300).decode_attn_ms(seqs, kv)[0]
    assert latent < 0.5 * Pricing(mha, 2, B300).decode_attn_ms(seqs, kv)[0]


def test_an_all_moe_shape_needs_no_dense_mlp_split() -> None:
    odd = dataclasses.replace(MOE, intermediate_size=2881)  # odd: tp 2 cannot split it
    Pricing(odd, 2, B300)  # every layer is MoE: the unused dense width is not checked
    with pytest.raises(ValueError, match="intermediate_size"):
        Pricing(dataclasses.replace(SHARED, intermediate_size=4097), 2, B300)  # layer 0 dense


def test_experts_touched_by_random_routing_worked_by_hand() -> None:
    """Top-8 of 128 experts, all local: 1 token reaches exactly 8 (distinct by routing);
    16 tokens reach 128 x (1 - (120/128)^16) = 128 x (1 - 0.35607) = 82.42; 4,096 tokens
    reach all 128. EP 8 (16 local experts): 1 token reaches 16 x 8/128 = 1 expert of the
    rank on average (at least 1 counted), 16 tokens 16 x 0.64393 = 10.30."""
    from optimizer.latency.features import expected_experts_touched

    local = np.array([128.0, 128.0, 128.0, 16.0, 16.0])
    tokens = np.array([1.0, 16.0, 4096.0, 1.0, 16.0])
    got = expected_experts_touched(local, tokens, np.full(5, 8.0), np.full(5, 128.0))
    assert got == pytest.approx([8.0, 82.423, 128.0, 1.0, 10.303], abs=1e-3)


def _nccl_samples(op: OpKind, gpus: int, ms: float) -> list[KernelSample]:
    """A flat NCCL table: `ms` at every message size from 1 KiB to 64 MiB on `gpus` GPUs."""
    return [KernelSample(op, ms, ms, ms, dtype="float16", tp=gpus, num_gpus=gpus,
                         message_bytes=2**e) for e in range(10, 27)]  # fmt: skip


def test_the_dp_exchange_is_an_all_gather_plus_a_reduce_scatter_from_their_own_tables() -> None:
    """vLLM's AgRs dispatch / combine at dp 4: NCCL's all-gather (20 us flat) plus its
    reduce-scatter (30 us flat) of dp x m tokens' hidden states, 50 us in all whatever the
    all-reduce table says (1 ms here); a table measured at other GPU counts only leaves
    the roofline, listed as an estimate. The roofline moves (g-1)/g of the message for
    each, half an all-reduce's traffic."""
    from optimizer.latency import moe

    samples = _nccl_samples(OpKind.ALL_GATHER, 4, 0.020)
    samples += _nccl_samples(OpKind.REDUCE_SCATTER, 4, 0.030)
    samples += _nccl_samples(OpKind.ALL_REDUCE, 4, 1.0)
    model = fit_latency_model(samples, accelerator="b300", options=FitOptions(max_iter=20))
    layout = ExpertLayout(dp=4, expert_parallel=True)
    measured = Pricing(MOE, 1, B300, learned=model, layout=layout)
    m = np.array([1.0, 64.0])
    assert moe._gather_ms(measured, m) == pytest.approx([0.050, 0.050], rel=0.02)
    assert "moe_allgather_reducescatter" not in measured.estimated_ops()
    elsewhere = fit_latency_model(
        _nccl_samples(OpKind.ALL_GATHER, 2, 0.020) + _nccl_samples(OpKind.REDUCE_SCATTER, 2, 0.030),
        accelerator="b300",
        options=FitOptions(max_iter=20),
    )
    guessed = Pricing(MOE, 1, B300, learned=elsewhere, layout=layout)
    assert "moe_allgather_reducescatter" in guessed.estimated_ops()
    msg = 4 * 64 * MOE.hidden_size * 2
    gather = OpBatch.make(OpKind.ALL_GATHER, 2.0, num_gpus=4, message_bytes=msg)
    reduce = OpBatch.make(OpKind.ALL_REDUCE, 2.0, num_gpus=4, message_bytes=msg)
    assert work(gather)[1][0] == msg * 3 / 4 == work(reduce)[1][0] / 2
    roof = 2 * B300.predict_ms(gather)[0]
    assert moe._gather_ms(guessed, np.array([64.0]))[0] == pytest.approx(roof)


def test_sequence_parallel_moe_exchanges_over_the_ep_group_and_gathers_over_tp(
    monkeypatch,
) -> None:
    """tp 2 x dp 4 with EP is vLLM's sequence-parallel MoE: the all-gather/reduce-scatter
    spans all 8 GPUs (not the 4 dp ranks) and each MoE layer's output is all-gathered
    over tp. Against the same layout priced without it, a layer costs exactly the wider
    exchange's difference plus the tp all-gather; at tp 1 there is nothing to split."""
    from optimizer.latency import moe

    layout = ExpertLayout(dp=4, expert_parallel=True)
    sp = Pricing(MOE, 2, B300, layout=layout)
    assert moe.exchange_gpus(sp) == 8
    assert moe.exchange_gpus(Pricing(MOE, 1, B300, layout=layout)) == 4
    m = np.array([64.0])
    with_sp, wide = moe_block_ms(sp, m), moe._gather_ms(sp, m)
    kind = sp.all_reduce_kinds()[0]
    gather = sp.price_ms(kind, num_gpus=2, message_bytes=m * MOE.hidden_size * 2, num_tokens=m)
    monkeypatch.setattr(ExpertLayout, "sequence_parallel", lambda self, tp: False)
    without, narrow = moe_block_ms(sp, m), moe._gather_ms(sp, m)
    assert wide[0] != narrow[0] and gather[0] > 0
    assert with_sp[0] == pytest.approx(without[0] - narrow[0] + wide[0] + gather[0])
