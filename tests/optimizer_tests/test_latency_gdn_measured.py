"""Gated DeltaNet cores priced by a fitted `gdn_prefill` / `gdn_decode` model inside its
measured grid and by the published-rate estimate outside it (`optimizer.latency.gdn`),
labelled per op; the grid's bookkeeping (`gdn_module.measured_grid`) and its round trip
through a stored payload."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from optimizer.hardware import get_accelerator
from optimizer.latency import fit_latency_model, gdn
from optimizer.latency.compose import Pricing
from optimizer.latency.features import OpBatch
from optimizer.latency.gdn_module import grid_range, measured_grid
from optimizer.latency.model import FitOptions
from optimizer.latency.persist import dump_model, load_model
from optimizer.latency.roofline import RooflinePricer
from optimizer.model_shape import ModelShape
from optimizer.records import KernelSample, OpKind
from optimizer.shape_parts import GatedDeltaNetSpec

H100 = RooflinePricer(get_accelerator("h100"))
# 4 layers, 3 of them GDN: 2 key heads and 4 value heads of 64, a conv of 4, float32 state
TOY = ModelShape(
    "toy-hybrid",
    4,
    512,
    8,
    2,
    64,
    1024,
    1000,
    gdn=GatedDeltaNetSpec(3, 2, 4, 64, 64),
    attn_output_gate=True,
)
HEADS = {"num_kv_heads": 2, "num_heads": 4, "head_dim": 64, "n": 64, "k": 512}


def _prefill_us(q: float) -> float:
    return 10.0 + 0.01 * q  # the synthetic table's law, us


def _decode_us(b: float) -> float:
    return 5.0 + 0.1 * b


def _samples() -> list[KernelSample]:
    """A synthetic table at TOY's tp-1 heads: chunks of 1 to 4,096 tokens (b = 1, 2),
    decodes of 1 to 256 sequences."""
    out = []
    for b in (1, 2):
        for q in 2.0 ** np.arange(13):
            ms = b * _prefill_us(q) / 1e3
            out.append(
                KernelSample(
                    OpKind.GDN_PREFILL,
                    ms,
                    ms,
                    ms,
                    num_tokens=int(b * q),
                    batch_size=b,
                    q_len=int(q),
                    **HEADS,
                )
            )
    for b in 2.0 ** np.arange(9):
        ms = _decode_us(b) / 1e3
        out.append(
            KernelSample(
                OpKind.GDN_DECODE,
                ms,
                ms,
                ms,
                num_tokens=int(b),
                batch_size=int(b),
                q_len=1,
                **HEADS,
            )
        )
    return out


@pytest.fixture(scope="module")
def learned():
    return fit_latency_model(_samples(), accelerator="h100", options=FitOptions(max_iter=50))


def test_the_grid_holds_each_head_counts_range_of_the_size_axis() -> None:
    """Prefill rows span q 1..4,096 at (2, 4, 64, 64); decode rows b 1..256. A head count
    not measured has no range."""
    samples = _samples()
    prefill = OpBatch.from_samples(OpKind.GDN_PREFILL, samples)
    decode = OpBatch.from_samples(OpKind.GDN_DECODE, samples)
    assert measured_grid(prefill) == ((2.0, 4.0, 64.0, 64.0, 1.0, 4096.0),)
    assert measured_grid(decode) == ((2.0, 4.0, 64.0, 64.0, 1.0, 256.0),)
    assert grid_range(measured_grid(decode), (2, 4, 64, 64)) == (1.0, 256.0)
    assert grid_range(measured_grid(decode), (1, 2, 64, 64)) is None


def test_inside_the_grid_the_table_prices_the_core_and_beyond_it_the_estimate(learned) -> None:
    """TOY at tp 1 on H100. A 1,024-token chunk: the fitted core (10 + 10.24 us, within 5%)
    plus what the table lacks: the q/k/v copies (1,024 x 512 channels x 2 B x 2), the
    state gathered and scattered (2 x 68,608 B) and TOY's float32 state's 2 bytes an
    element over the tables' bf16 one, read and written (2 x 4 x 64 x 64 x 2 B), at 80% of
    3.35 TB/s, and the 11 unmeasured kernels' 4 us launches. An 8,192-token chunk lies
    beyond the grid's 4,096: the estimate exactly, as a model without the table prices it.
    Decodes: 64 sequences measured (11.4 us, plus 64 states' extra 65,536 B), 512 beyond
    256: the estimate."""
    measured, estimate = Pricing(TOY, 1, H100, learned), Pricing(TOY, 1, H100)
    q = np.array([1024.0, 8192.0])
    chunk = gdn.chunk_ms(measured, q)
    excess = 2 * 4 * 64 * 64 * 2
    rest = (1024 * 512 * 2 * 2 + 2 * 68_608 + excess) / 2.68e9 + 11 * 0.004
    assert chunk[0] - rest == pytest.approx(_prefill_us(1024) / 1e3, rel=0.05)
    assert chunk[1] == gdn.chunk_ms(estimate, q)[1]
    assert chunk[0] != pytest.approx(gdn.chunk_ms(estimate, q)[0], rel=0.05)
    b = np.array([64.0, 512.0])
    decode = gdn.decode_ms(measured, b)
    assert decode[0] - 64 * excess / 2.68e9 == pytest.approx(_decode_us(64) / 1e3, rel=0.05)
    assert decode[1] == gdn.decode_ms(estimate, b)[1]
    assert {"gdn_prefill:beyond_4096", "gdn_decode:beyond_256"} <= set(measured.estimated_ops())
    assert not {"gdn_prefill", "gdn_decode"} & set(measured.estimated_ops())


def test_a_bf16_state_is_the_tables_and_a_float32_one_adds_its_extra_bytes(learned) -> None:
    """The tables hold a bf16 state: a bf16-state shape (Qwen3-Next's) is priced by them
    alone; TOY's float32 state adds exactly 2 x 4 heads x 64 x 64 x 2 B a sequence at 80%
    of 3.35 TB/s to each decoding sequence, and twice that to a chunk (in the measured
    kernels, and in the state's gather and scatter around them, which the estimate's
    bytes price at the shape's own width)."""
    bf16 = dataclasses.replace(TOY, gdn=dataclasses.replace(TOY.gdn, ssm_dtype="bfloat16"))
    wide, narrow = Pricing(TOY, 1, H100, learned), Pricing(bf16, 1, H100, learned)
    excess = 2 * 4 * 64 * 64 * 2 / 2.68e9
    q, b = np.array([64.0, 2048.0]), np.array([1.0, 100.0])
    assert gdn.chunk_ms(wide, q) - gdn.chunk_ms(narrow, q) == pytest.approx([2 * excess] * 2)
    assert gdn.decode_ms(wide, b) - gdn.decode_ms(narrow, b) == pytest.approx(b * excess)
    beyond = ("gdn_prefill:beyond_4096", "gdn_decode:beyond_256")
    assert gdn.estimated(narrow) == beyond
    assert gdn.estimated(wide) == (*beyond, "gdn_state:float32")


def test_heads_or_a_conv_the_table_did_not_measure_keep_the_estimate(learned) -> None:
    """At tp 2 the rank has 1 key / 2 value heads, not measured; a conv of 3 is not the
    measured 4: both price every chunk and decode by the estimate and list both ops whole,
    as a model without the table does."""
    conv3 = dataclasses.replace(TOY, gdn=dataclasses.replace(TOY.gdn, conv_kernel=3))
    for shape, tp in ((TOY, 2), (conv3, 1)):
        measured, estimate = Pricing(shape, tp, H100, learned), Pricing(shape, tp, H100)
        q = np.array([16.0, 1024.0])
        assert np.array_equal(gdn.chunk_ms(measured, q), gdn.chunk_ms(estimate, q))
        assert np.array_equal(gdn.decode_ms(measured, q), gdn.decode_ms(estimate, q))
        assert gdn.estimated(measured) == ("gdn_prefill", "gdn_decode") == gdn.estimated(estimate)


def test_a_stored_model_keeps_its_grid(learned) -> None:
    again = load_model(dump_model(learned))
    for op in (OpKind.GDN_PREFILL, OpKind.GDN_DECODE):
        assert again.op_model(op).grid == learned.op_model(op).grid != ()
    pricing = Pricing(TOY, 1, H100, again)
    q = np.array([1.0, 100.0, 5000.0])
    assert np.array_equal(gdn.chunk_ms(pricing, q), gdn.chunk_ms(Pricing(TOY, 1, H100, learned), q))
