"""The batch-1 decode floor: no step can beat reading the weights once.

Every forward pass reads all of an instance's weights from HBM, so a step can
never take less than `weight_bytes / HBM bandwidth` per GPU (DOMAIN.md §1:
7B fp16 on 2 TB/s is about 7 ms). A latency model that predicts faster steps is
wrong. Policy: `simulate` probes each latency model once with batch-1 decode
loads and raises `DecodeFloorError` when one is below the floor; inside the run,
any step still priced below it (say a mixed load the probes missed) is clamped
up to the floor and counted in `SimulationResult.num_floor_clamped_steps`.

A mixture-of-experts decode step reads only the experts its tokens route to, so its
floor scales one GPU's weights by experts_per_token / num_experts: without expert
parallelism every GPU reads that share of its expert slices, with it the busiest GPU
holds at least ceil(k / ep) of the k active experts, at least that share of its own
num_experts / ep; either way the bound holds (it is loose: the dense part is read whole).
"""

from __future__ import annotations

from optimizer.hardware import Accelerator
from optimizer.latency.base import StepLatency, StepLoad
from optimizer.memory import weight_bytes_per_gpu
from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.shapes import ModelShape

PROBE_KV_LENGTHS = (1, 128, 1024, 8192)


class DecodeFloorError(ValueError):
    """A latency model predicts a decode step faster than the weight-bandwidth floor."""


def floor_bytes(shape: ModelShape, tp: int = 1, layout: ExpertLayout = DENSE_LAYOUT) -> float:
    """Bytes a batch-1 decode step must read on one GPU at least (module docstring)."""
    weights = weight_bytes_per_gpu(shape, tp, layout)
    if shape.moe is not None:
        return weights * shape.moe.experts_per_token / shape.moe.num_experts
    return float(weights)


def decode_floor_s(
    shape: ModelShape, accelerator: Accelerator, tp: int = 1, layout: ExpertLayout = DENSE_LAYOUT
) -> float:
    """Seconds to stream one GPU's share of the weights from HBM."""
    return floor_bytes(shape, tp, layout) / accelerator.hbm_bytes_per_s


def check_decode_floor(
    latency: StepLatency,
    shape: ModelShape,
    accelerator: Accelerator,
    tp: int = 1,
    *,
    kv_lengths: tuple[int, ...] = PROBE_KV_LENGTHS,
    layout: ExpertLayout = DENSE_LAYOUT,
) -> float:
    """Raise `DecodeFloorError` when a batch-1 decode step beats the floor; return the floor."""
    floor = decode_floor_s(shape, accelerator, tp, layout)
    for kv in kv_lengths:
        predicted = latency.step_time_s(StepLoad(1, 1, (), (), 1, kv, 1))
        if predicted < floor * (1 - 1e-9):
            raise DecodeFloorError(
                f"latency model predicts a batch-1 decode step of {predicted * 1e3:.3f} ms "
                f"(KV length {kv}) for {shape.name} at tp={tp} on {accelerator.name}, below "
                f"the weight-bandwidth floor {floor * 1e3:.3f} ms "
                f"({floor_bytes(shape, tp, layout) / 1e9:.2f} GB / {accelerator.hbm_tb_s} TB/s)"
            )
    return floor
