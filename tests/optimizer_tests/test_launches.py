"""The host's kernel launches outside CUDA graphs: counts, the floor they put under a
step's kernels, and the fit of the per-launch time."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from optimizer.engines import CUDA_GRAPH_MAX_TOKENS, EngineRelease
from optimizer.hardware import get_accelerator
from optimizer.latency import StepLoad
from optimizer.latency.catalog import compile_roofline
from optimizer.latency.launches import NO_HOST_FLOOR, HostFloor, LaunchCount, count_launches
from optimizer.model_shape import ModelShape
from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.shape_parts import MoESpec
from optimizer.shapes import get_shape
from optimizer.validation.forward_passes import MeasuredStep, StepPhase, fit_async_step_pricing
from tests.optimizer_tests.step_loads import batch_step_times

TOY = ModelShape("toy", 2, 256, 4, 2, 64, 512, 1000)


def test_launch_counts_of_a_dense_and_a_moe_model_worked_by_hand() -> None:
    """Dense, 2 layers, tp 1. Eager: per layer GQA attention 5 + its block end 1 (add +
    RMSNorm) + dense MLP 3 + its block end 1 = 10, x 2 = 20, + embedding, final norm and
    LM head 3 = 23. Piecewise: per layer the KV-cache write and attention, 2, x 2 = 4,
    + one graph replay per piece (layers + 1 = 3) = 7.
    tp 2: each block end also all-reduces: 2 x (5 + 2 + 3 + 2) + 3 = 27 eager; piecewise
    unchanged (the all-reduces are inside the graphs).
    MoE with shared experts on dp 2: the MLP is 8 + 5 (shared) + 4 x 2 (three tensors
    all-gathered and one reduce-scattered, one NCCL call per rank each) = 21, so at tp 1:
    2 x (5 + 1 + 21 + 1) + 3 = 59 eager."""
    assert count_launches(TOY, 1, DENSE_LAYOUT) == LaunchCount(23, 7)
    assert count_launches(TOY, 2, DENSE_LAYOUT) == LaunchCount(27, 7)
    moe = dataclasses.replace(TOY, moe=MoESpec(8, 2, 128, shared_intermediate_size=128))
    assert count_launches(moe, 1, ExpertLayout(2, True)) == LaunchCount(59, 7)
    # DeepEP's dispatch and combine are two kernels: 2 x (5 + 1 + 15 + 1) + 3 = 47
    assert count_launches(moe, 1, ExpertLayout(2, True), "deepep") == LaunchCount(47, 7)
    # tp 2 x dp 2 with EP is vLLM's sequence-parallel MoE: the exchange spans the 4-GPU EP
    # group (4 x 4 calls) and the output is all-gathered over tp (1): the MLP is
    # 8 + 5 + 16 + 1 = 30, so 2 x (5 + 2 + 30 + 2) + 3 = 81
    assert ExpertLayout(2, True).sequence_parallel(2)
    assert not ExpertLayout(2, True).sequence_parallel(1)
    assert not ExpertLayout(1, True).sequence_parallel(2)
    assert not ExpertLayout(2, False).sequence_parallel(2)
    assert count_launches(moe, 2, ExpertLayout(2, True)) == LaunchCount(81, 7)


def test_launch_counts_of_qwen3_6_worked_by_hand() -> None:
    """Qwen3.6-35B-A3B at tp 2: 10 gated full-attention layers (5 + the gate's 1 + a block
    end of 2 = 8 each: 80), 30 Gated DeltaNet layers (7 projections and copies + the
    core's 20 + 2 = 29 each: 870), 40 MoE MLPs with a shared expert (8 + 5 + 2 = 15 each:
    600), + 3 = 1,553 eager. Piecewise: 10 x 2 + 30 x 20 + 41 graph replays = 661."""
    shape = get_shape("qwen3.6-35b-a3b")
    assert count_launches(shape, 2, DENSE_LAYOUT) == LaunchCount(1553, 661)


def test_the_host_floor_bounds_prefill_and_eager_steps_but_not_graphed_decode() -> None:
    """vLLM 0.20 (V1, async): a decode-only step of <= 512 tokens replays a full graph (no
    floor); a step with a prefill chunk of <= 512 tokens lasts at least the piecewise
    launches; any larger step at least the eager ones. vLLM 0.12's generation has no
    measured per-launch time, so no floor."""
    h100 = get_accelerator("h100")
    shape = get_shape("qwen3-0.6b")
    table = compile_roofline(shape, h100, 1, engine=EngineRelease("vllm", "0.20.1"))
    host = table.host
    g = EngineRelease("vllm", "0.20.1").generation
    n = count_launches(shape, 1, DENSE_LAYOUT)
    assert host == HostFloor(
        CUDA_GRAPH_MAX_TOKENS, n.piecewise * g.host_launch_s, n.eager * g.host_launch_s
    )
    raw = dataclasses.replace(table, host=NO_HOST_FLOOR)
    decode = StepLoad(8, 8, (), (), 8, 8 * 100)
    prefill = StepLoad(64, 1, (64,), (64,))
    eager = StepLoad(600, 1, (600,), (600,))
    assert table.kernel_time_s(decode) == raw.kernel_time_s(decode)
    # a 0.6B model's kernels are far shorter than its launches: the floors bind
    assert raw.kernel_time_s(prefill) < host.piecewise_s == table.kernel_time_s(prefill)
    assert raw.kernel_time_s(eager) < host.eager_s == table.kernel_time_s(eager)
    # the vectorised path prices the same steps alike
    loads = (decode, prefill, eager)
    batch = batch_step_times(table, list(loads))
    assert batch == pytest.approx([table.step_time_s(ld) for ld in loads])
    sync = compile_roofline(shape, h100, 1, engine=EngineRelease("vllm", "0.12.0"))
    assert sync.host == NO_HOST_FLOOR


def test_another_per_launch_time_is_another_release_key(monkeypatch) -> None:
    import optimizer.engines as engines

    before = EngineRelease("vllm", "0.20.1").key
    gens = tuple(dataclasses.replace(g, host_launch_s=g.host_launch_s + 1e-6)
                 for g in engines.GENERATIONS)  # fmt: skip
    monkeypatch.setattr(engines, "GENERATIONS", gens)
    assert EngineRelease("vllm", "0.20.1").key != before


def test_the_fit_recovers_the_per_launch_time_beside_the_other_constants() -> None:
    """Synthetic steps made by the model itself, step = max(1.05 x kernels, launches x
    20 us) + 0.5% of the one-token forward x sequences (+ 2 ms when synchronous), some
    host-bound, of two models (forwards of 6 and 2 ms): the fit finds each constant."""
    rng = np.random.default_rng(0)
    groups: dict[str, list] = {}
    for i in range(400):
        kernels = float(rng.uniform(2e-3, 40e-3))
        launches = float(rng.choice([0.0, 300.0, 1200.0]))
        seqs = int(rng.integers(1, 64))
        after_idle = bool(i % 10 == 0)
        forward = 6e-3 if i % 2 else 2e-3
        latency = max(1.05 * kernels, launches * 20e-6) + 0.005 * forward * seqs
        latency += 2e-3 * after_idle
        load = StepLoad(seqs, seqs, (), (), seqs, seqs * 100)
        step = MeasuredStep(StepPhase.DECODE, "sweep", load, latency, after_idle)
        groups.setdefault(f"g{int(launches)}", []).append((step, kernels, launches, forward))
    fit = fit_async_step_pricing(groups)
    assert fit.host_launch_s == pytest.approx(20e-6)
    assert fit.kernel_scale == pytest.approx(1.05, rel=1e-6)
    assert fit.exposed.per_seq_forward == pytest.approx(0.005, rel=1e-6)
    assert fit.exposed.per_seq_s == 0.0
    assert fit.cpu.base_s == pytest.approx(2e-3, rel=1e-6)


def test_judged_steps_pick_the_host_time_and_leave_the_rest_to_the_fitted_ones() -> None:
    """Dense-like steps the host never binds fit scale 1.05 and 30 us a sequence (1% of a
    3 ms forward) whatever the host time; host-bound steps (1,000 launches, 22 ms
    measured, 5 ms of kernels) judged alone pick 22 us, and the scale stays the dense
    steps'."""
    rng = np.random.default_rng(1)
    load = StepLoad(8, 8, (), (), 8, 800)
    dense = []
    for _ in range(200):
        kernels = float(rng.uniform(10e-3, 40e-3))
        step = MeasuredStep(StepPhase.DECODE, "sweep", load, 1.05 * kernels + 8 * 30e-6, False)
        dense.append((step, kernels, 0.0, 3e-3))
    bound = [(MeasuredStep(StepPhase.MIXED, "sweep", load, 22e-3 + 8 * 30e-6, False), 5e-3,
              1000.0, 3e-3) for _ in range(20)]  # fmt: skip
    fit = fit_async_step_pricing({"dense": dense}, judge={"moe": bound})
    assert fit.host_launch_s == pytest.approx(22e-6)
    assert fit.kernel_scale == pytest.approx(1.05, rel=1e-6)
