"""A mixture-of-experts layer's share of a step, as vLLM runs it (`compose.Pricing`).

One MoE layer on one GPU of an instance of tp x dp GPUs (`ExpertLayout`), for the `m`
tokens of its data-parallel rank's step:

- the router: a 16-bit GEMM m x num_experts x hidden (vLLM's ReplicatedLinear gate);
- the shared experts, when the model has them: a gated MLP of `shared_intermediate_size`
  split over the tp GPUs of the attention group (gate+up, SiLU-and-mul, down), in the
  projections' weight format;
- the fused MoE operator (`OpKind.MOE`, vLLM's FusedMoE with the kernel it picks for the
  weight format, as measured by AIConfigurator) over the tokens of the whole expert
  group: with dp > 1 every rank's MoE runs over all dp ranks' tokens, dp x m, assuming
  the DP ranks are equally loaded (vLLM pads them to one token count; the fleet
  simulator simulates the ranks themselves). Its experts are tensor-split over tp x dp
  GPUs (MoE TP) or, with expert parallelism, held whole by tp x dp GPUs (EP), vLLM's
  FusedMoEParallelConfig flattening;
- the communication the layout adds: with dp > 1, vLLM's default all2all backend
  (`allgather_reducescatter`) all-gathers the dp ranks' hidden states before the MoE and
  reduce-scatters its output after (`AgRsAll2AllManager`; with the ranks padded to one
  token count, as this module assumes, PyNccl takes its equal-size path: one NCCL
  all-gather and one NCCL reduce-scatter of dp x m tokens' hidden states over the dp
  GPUs), each priced from its measured NCCL table at that GPU count, else the roofline
  (listed by `estimated_parts`). The top-k weights and ids gathered with the hidden
  states (2 x top-k values per token) are left out: at these message sizes the
  collectives cost their latency, not their bytes. With `Pricing.all2all == "deepep"`
  (--all2all-backend deepep_high_throughput / deepep_low_latency) the tokens travel by
  DeepEP dispatch and combine (`OpKind.MOE_DISPATCH` / `MOE_COMBINE`, measured at EP 8 on
  one node; other EP sizes by the roofline). The TP all-reduce after the MoE (tp > 1)
  stays as in a dense layer (`Pricing.layer_ms`).

The attention, norms and the TP all-reduces of a MoE layer are a dense layer's without
its MLP. Torch-free.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from optimizer.engines import StepRules
from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.records import OpKind
from optimizer.shapes import ModelShape


class Pricing(Protocol):
    """What this module reads of `compose.Pricing` (which calls it)."""

    shape: ModelShape
    tp: int
    layout: ExpertLayout
    all2all: str
    rules: StepRules

    def price_ms(self, op: OpKind, **params: object) -> np.ndarray: ...

    def measured(self, op: OpKind) -> bool: ...

    def all_reduce_kinds(self) -> tuple[OpKind, OpKind]: ...

    def unfused_reduce_ms(self, m: np.ndarray) -> np.ndarray: ...


ALL2ALL_BACKENDS = ("allgather_reducescatter", "deepep")
DEFAULT_ALL2ALL = "allgather_reducescatter"  # vLLM's default --all2all-backend


def check_layout(shape: ModelShape, tp: int, layout: ExpertLayout) -> None:
    """The layout must fit the shape: a dense shape has only `DENSE_LAYOUT`; a MoE's
    experts must split evenly (ValueError naming what does not)."""
    if not isinstance(layout, ExpertLayout):
        raise ValueError(f"layout must be an ExpertLayout, got {layout!r}")
    if not isinstance(layout.dp, int) or layout.dp < 1:
        raise ValueError(f"{shape.name}: layout dp must be an integer >= 1, got {layout.dp!r}")
    spec = shape.moe
    if spec is None:
        if layout != DENSE_LAYOUT:
            raise ValueError(
                f"{shape.name} is dense: layout {layout.key!r} applies to MoE shapes only "
                "(data parallelism of a dense model is replicas)"
            )
        return
    problems = []
    moe_tp, ep = layout.moe_tp_size(tp), layout.ep_size(tp)
    if spec.expert_intermediate_size % moe_tp:
        problems.append(
            f"expert_intermediate_size {spec.expert_intermediate_size} is not a multiple of "
            f"the MoE TP size {moe_tp}"
        )
    if spec.num_experts % ep:
        problems.append(f"num_experts {spec.num_experts} is not a multiple of the EP size {ep}")
    if spec.shared_intermediate_size % tp:
        problems.append(
            f"shared_intermediate_size {spec.shared_intermediate_size} is not a multiple of tp"
        )
    if problems:
        raise ValueError(
            f"layout tp={tp} {layout.key or 'dense'} does not fit {shape.name}: "
            + "; ".join(problems)
        )


def expert_tokens(pricing: Pricing, m: np.ndarray) -> np.ndarray:
    """Tokens the fused MoE of one rank runs over: all dp ranks' (equally loaded)."""
    return pricing.layout.dp * m


def moe_params(pricing: Pricing, m: np.ndarray) -> dict[str, object]:
    """`OpKind.MOE`'s parameters for `m` tokens per rank (fields as in `optimizer.dims`)."""
    spec, tp, layout = pricing.shape.moe, pricing.tp, pricing.layout
    assert spec is not None
    return {
        "num_tokens": expert_tokens(pricing, m),
        "n": spec.expert_intermediate_size,
        "k": pricing.shape.hidden_size,
        "batch_size": spec.experts_per_token,
        "num_heads": spec.num_experts,
        "tp": layout.moe_tp_size(tp),
        "num_gpus": layout.ep_size(tp),
    }


def _a2a_params(pricing: Pricing, m: np.ndarray) -> dict[str, object]:
    spec = pricing.shape.moe
    assert spec is not None
    ep = pricing.layout.ep_size(pricing.tp)
    return {"num_tokens": m, "k": pricing.shape.hidden_size, "batch_size": spec.experts_per_token,
            "num_heads": spec.num_experts, "num_gpus": ep}  # fmt: skip


def exchange_gpus(pricing: Pricing) -> int:
    """GPUs the dp ranks' tokens are exchanged over: the dp GPUs, or with sequence-parallel
    MoE the whole EP group."""
    layout, tp = pricing.layout, pricing.tp
    return layout.ep_size(tp) if layout.sequence_parallel(tp) else layout.dp


EXCHANGE_OPS = (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER)  # the AgRs dispatch, combine


def _gather_ms(pricing: Pricing, m: np.ndarray) -> np.ndarray:
    """NCCL all-gather + reduce-scatter of dp x m tokens' hidden states over the exchange
    GPUs (`exchange_gpus`), each from its measured table at that GPU count, else the
    roofline (`Pricing.price_ms`)."""
    dp, gpus = pricing.layout.dp, exchange_gpus(pricing)
    msg = dp * m * pricing.shape.hidden_size * pricing.shape.dtype_bytes
    return sum(pricing.price_ms(op, num_gpus=gpus, message_bytes=msg, num_tokens=dp * m)
               for op in EXCHANGE_OPS)  # fmt: skip


def moe_block_ms(pricing: Pricing, m: np.ndarray) -> np.ndarray:
    """One MoE layer's experts, router and layout communication for `m` (padded) tokens
    per rank, ms (the module docstring)."""
    spec, shape, tp = pricing.shape.moe, pricing.shape, pricing.tp
    assert spec is not None
    h = shape.hidden_size
    total = pricing.price_ms(OpKind.GEMM, num_tokens=m, n=spec.num_experts, k=h)  # router
    total = total + pricing.price_ms(OpKind.MOE, **moe_params(pricing, m))
    shared = spec.shared_intermediate_size // tp
    if shared:
        total = total + pricing.price_ms(OpKind.MLP_UP, num_tokens=m, n=2 * shared, k=h)
        total = total + pricing.price_ms(OpKind.MLP_DOWN, num_tokens=m, n=h, k=shared)
        width = 1.5 * shared if pricing.rules.fused_elementwise else shared
        total = total + pricing.price_ms(OpKind.ACTIVATION, num_tokens=m, n=width, k=0)
    if pricing.all2all == "deepep" and pricing.layout.ep_size(tp) > 1:
        a2a = _a2a_params(pricing, m)
        total = total + pricing.price_ms(OpKind.MOE_DISPATCH, **a2a)
        total = total + pricing.price_ms(OpKind.MOE_COMBINE, **a2a)
    elif pricing.layout.dp > 1:
        total = total + _gather_ms(pricing, m)
    if pricing.layout.sequence_parallel(tp):  # the layer's output all-gathered over tp
        msg = m * h * shape.dtype_bytes
        kind = pricing.all_reduce_kinds()[0]
        total = total + pricing.price_ms(kind, num_gpus=tp, message_bytes=msg, num_tokens=m)
    elif tp > 1:  # its output's all-reduce stays apart from the norm (`unfused_reduce_ms`)
        total = total + pricing.unfused_reduce_ms(m)
    return total


def priced_ops(pricing: Pricing) -> list[OpKind]:
    """The operators a MoE shape's layers add to a dense step's (none for a dense shape)."""
    if pricing.shape.moe is None:
        return []
    ops = [OpKind.GEMM, OpKind.MOE]
    if pricing.all2all == "deepep" and pricing.layout.ep_size(pricing.tp) > 1:
        ops += [OpKind.MOE_DISPATCH, OpKind.MOE_COMBINE]
    return ops


def estimated_parts(pricing: Pricing) -> tuple[str, ...]:
    """Parts of a MoE step priced by the roofline that are not an operator of their own:
    the dp all-gather / reduce-scatter when NCCL's were not measured at the exchange's GPU
    count."""
    if pricing.shape.moe is None or pricing.layout.dp == 1 or pricing.all2all == "deepep":
        return ()
    measured = all(pricing.measured(op) for op in EXCHANGE_OPS)
    return () if measured else ("moe_allgather_reducescatter",)
