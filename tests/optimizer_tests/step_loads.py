"""Pricing a list of `StepLoad`s through a compiled table's vectorised path."""

from __future__ import annotations

import numpy as np

from optimizer.latency import StepLoad
from optimizer.latency.table import CompiledStepLatency


def batch_step_times(table: CompiledStepLatency, loads: list[StepLoad]) -> np.ndarray:
    """`table.step_times_s` of `loads` (each with at most one prefill chunk)."""
    return table.step_times_s(
        np.array([ld.num_tokens for ld in loads]),
        np.array([ld.num_logits for ld in loads]),
        np.array([ld.num_decode_seqs for ld in loads]),
        np.array([ld.decode_kv_tokens for ld in loads]),
        np.array([ld.prefill_q[0] if ld.prefill_q else 0 for ld in loads]),
        np.array([ld.prefill_kv[0] if ld.prefill_kv else 0 for ld in loads]),
    )
