"""MoE test shapes, registered as presets for one test (`register_moe`), independent of the
shapes module's own MoE presets.

`fake_layout_weights` replaces `ModelShape.weight_bytes` with a known per-GPU figure
that depends on the layout, so memory tests pin what the config does with it.
"""

from __future__ import annotations

import pytest

from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.shape_parts import MoESpec
from optimizer.shapes import PRESETS, ModelShape

# Qwen3-30B-A3B's dimensions: 48 layers, 128 experts of width 768, top-8.
MOE = ModelShape(
    "test-moe", 48, 2048, 32, 4, 128, 6144, 151936,
    moe=MoESpec(num_experts=128, experts_per_token=8, expert_intermediate_size=768),
)  # fmt: skip
# Experts 100 wide (splits over 4 GPUs, not 8) and only 12 of them.
ODD_MOE = ModelShape(
    "test-odd-moe", 4, 512, 8, 8, 64, 1024, 1000,
    moe=MoESpec(num_experts=12, experts_per_token=2, expert_intermediate_size=100),
)  # fmt: skip

GIB = 1024**3


def register_moe(monkeypatch: pytest.MonkeyPatch) -> None:
    for shape in (MOE, ODD_MOE):
        monkeypatch.setitem(PRESETS, shape.name, shape)


def fake_weight_bytes(tp: int, layout: ExpertLayout) -> int:
    """4 GiB of non-expert weights split by tp plus 64 GiB of experts over tp x dp GPUs."""
    return (4 * GIB) // tp + (64 * GIB) // layout.num_gpus(tp)


def fake_layout_weights(monkeypatch: pytest.MonkeyPatch) -> list[ExpertLayout]:
    """Patch `ModelShape.weight_bytes` of MoE shapes with `fake_weight_bytes` (dense shapes
    keep theirs); returns the layouts it saw."""
    seen: list[ExpertLayout] = []
    real = ModelShape.weight_bytes

    def weight_bytes(self: ModelShape, tp: int = 1, layout: ExpertLayout = DENSE_LAYOUT) -> int:
        if self.moe is None:
            return real(self, tp)
        seen.append(layout)
        return fake_weight_bytes(tp, layout)

    monkeypatch.setattr(ModelShape, "weight_bytes", weight_bytes)
    return seen
