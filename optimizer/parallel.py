"""How one serving instance of a mixture-of-experts model splits its work over GPUs.

vLLM spells it with three flags: `--tensor-parallel-size` (tp: attention and the dense
layers are split over tp GPUs), `--data-parallel-size` (dp: that many attention ranks
inside one instance, each with its own scheduler and KV cache, sharing the MoE layers)
and `--enable-expert-parallel`. The MoE layers run on all tp x dp GPUs of the instance:

- expert parallel: each GPU holds num_experts / (tp x dp) whole experts (EP size tp x dp,
  MoE TP 1), and tokens travel to their experts by all-to-all dispatch and combine;
- otherwise every expert is tensor-split over the tp x dp GPUs (MoE TP tp x dp, EP 1),
  as vLLM's FusedMoEParallelConfig flattens the two.

A dense model has no MoE layers: its layout is `DENSE_LAYOUT` (dp 1, no EP); data
parallelism of a dense model is replicas (`num_replicas`). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ExpertLayout:
    """The MoE split of one instance beyond its TP degree: `dp` attention ranks (vLLM's
    --data-parallel-size) and whether experts are sharded whole (--enable-expert-parallel)."""

    dp: int = 1
    expert_parallel: bool = False

    def num_gpus(self, tp: int) -> int:
        """GPUs of one instance: tp x dp."""
        return tp * self.dp

    def ep_size(self, tp: int) -> int:
        """GPUs the experts are sharded over whole (1 without expert parallelism)."""
        return tp * self.dp if self.expert_parallel else 1

    def moe_tp_size(self, tp: int) -> int:
        """GPUs each expert is tensor-split over (1 with expert parallelism)."""
        return 1 if self.expert_parallel else tp * self.dp

    def sequence_parallel(self, tp: int) -> bool:
        """vLLM's sequence-parallel MoE (`ParallelConfig.use_sequence_parallel_moe`, for its
        all-gather and DeepEP all2all backends): with expert parallelism, dp > 1 and
        tp > 1, each TP rank sends only its 1/tp of the tokens to the experts, the tokens
        travel over the whole EP group (tp x dp GPUs), and a MoE layer's output is
        all-gathered over the tp GPUs."""
        return self.expert_parallel and self.dp > 1 and tp > 1

    @property
    def key(self) -> str:
        """A short stable name for table keys and labels ("" for the dense layout)."""
        if self == DENSE_LAYOUT:
            return ""
        return f"dp{self.dp}{'-ep' if self.expert_parallel else ''}"


DENSE_LAYOUT = ExpertLayout()
