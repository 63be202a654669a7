"""Whole steps priced operator by operator (the slow, exact path for validation and
calibration; the simulator reads compiled tables instead), and vLLM's CUDA-graph padding
of a step's tokens. Works on any `StepPricer`, such as `compose.Pricing`. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from optimizer.latency.base import StepLoad


class StepPricer(Protocol):
    """The per-step components of `compose.Pricing` (ms, vectorised)."""

    def dense_ms(self, num_tokens: np.ndarray) -> np.ndarray: ...

    def lm_head_ms(self, num_logits: np.ndarray) -> np.ndarray: ...

    def prefill_attn_ms(self, q_len: np.ndarray, kv_len: np.ndarray) -> np.ndarray: ...

    def decode_attn_ms(
        self, num_seqs: np.ndarray, kv_mean: np.ndarray, decode_q: int = 1
    ) -> np.ndarray: ...


def cuda_graph_padded(num_tokens: np.ndarray, limit: int) -> np.ndarray:
    """Token counts padded as vLLM pads a step to its CUDA-graph capture sizes (1, 2, 4,
    then every 8 up to 256, every 16 up to 512); beyond `limit` a step runs eagerly."""
    m = np.asarray(num_tokens, dtype=np.float64)
    small = np.where(m <= 2, np.maximum(m, 1.0), np.where(m <= 4, 4.0, np.ceil(m / 8) * 8))
    padded = np.where(m <= 256, small, np.ceil(m / 16) * 16)
    return np.where(m <= limit, np.minimum(padded, max(limit, 1)), m)


def iteration_ms(pricing: StepPricer, load: StepLoad, overhead_s: float) -> float:
    """Exact (unquantised) step time in ms; slow path for validation and calibration."""
    total = float(pricing.dense_ms(np.array([load.num_tokens]))[0])
    if load.num_logits > 0:
        total += float(pricing.lm_head_ms(np.array([load.num_logits]))[0])
    if load.prefill_q:
        total += float(
            pricing.prefill_attn_ms(np.array(load.prefill_q), np.array(load.prefill_kv)).sum()
        )
    if load.num_decode_seqs > 0:
        mean_kv = load.decode_kv_tokens / load.num_decode_seqs
        total += float(
            pricing.decode_attn_ms(
                np.array([load.num_decode_seqs]), np.array([mean_kv]), load.decode_q
            )[0]
        )
    return total + 1e3 * overhead_s


def iterations_ms(pricing: StepPricer, loads: Sequence[StepLoad], overhead_s: float) -> np.ndarray:
    """`iteration_ms` of many loads at once: one prediction call per operator, not per load."""
    n = len(loads)
    total = pricing.dense_ms(np.array([ld.num_tokens for ld in loads], dtype=np.float64))
    logits = np.array([ld.num_logits for ld in loads], dtype=np.float64)
    if (logits > 0).any():
        total[logits > 0] += pricing.lm_head_ms(logits[logits > 0])
    owner = np.array([i for i, ld in enumerate(loads) for _ in ld.prefill_q], dtype=np.int64)
    if owner.size:
        q = np.array([v for ld in loads for v in ld.prefill_q], dtype=np.float64)
        kv = np.array([v for ld in loads for v in ld.prefill_kv], dtype=np.float64)
        total += np.bincount(owner, pricing.prefill_attn_ms(q, kv), minlength=n)
    for dq in sorted({ld.decode_q for ld in loads if ld.num_decode_seqs > 0}):
        rows = [i for i, ld in enumerate(loads) if ld.num_decode_seqs > 0 and ld.decode_q == dq]
        seqs = np.array([loads[i].num_decode_seqs for i in rows], dtype=np.float64)
        kv_sum = np.array([loads[i].decode_kv_tokens for i in rows], dtype=np.float64)
        total[rows] += pricing.decode_attn_ms(seqs, kv_sum / seqs, dq)
    return total + 1e3 * overhead_s
