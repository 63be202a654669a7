"""The per-step data of vLLM 0.20.1 on B300 (observations/aic-fpm-b300) and the one fit of
the async generation's step constants on it (`optimizer.engines`: kernel scale, exposed
time per sequence, CPU work per step, host time per kernel launch outside CUDA graphs),
shared by benchmarks/bench_devset.py and benchmarks/bench_moe_steps.py (`--fit`).

What the fit uses, each (run, step type) weighed alike (`fit_async_step_pricing`):
- every step of Qwen3-32B (dense) at TP 1/2/4/8: the kernel scale, the exposed time per
  sequence and the CPU work per step are fitted on these, at each host time per launch;
- the prefill and mixed steps of Qwen3.6-35B-A3B (a MoE of 3B active parameters, 30
  Gated DeltaNet layers) at TP 2/4/8 with and without expert parallelism: the steps the
  host's launches bind, which pick the time per launch (the dense steps only bound it)
  without moving the rest. Its TP 1 run is left out: its records of host-bound steps pair
  up (the first of two consecutive prefill steps carries both, the second reads 0.3 ms),
  and its DP + EP runs are left out to check the fit. So are its steps after an idle gap:
  their records take in time off the request's path (a lone 4,096-token prompt at TP 2
  measures 83 ms end to end, frontend included, while its two steps' records sum to 90 ms:
  49.4 after the gap, 41.0 for the next; the same first chunk without a gap reads 40.5).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from bench_common import AICONFIGURATOR, SHARED

from optimizer.engines import CUDA_GRAPH_MAX_TOKENS, EngineRelease
from optimizer.latency import TableReach, build_catalog, fit_latency_model
from optimizer.latency.launches import NO_HOST_FLOOR, HostFloor, count_launches
from optimizer.latency.model import FitOptions, LatencyModel
from optimizer.latency.table import CompiledStepLatency
from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.records import OpKind
from optimizer.shapes import DEFAULT_PRECISION, ModelShape, get_shape
from optimizer.validation.forward_passes import (
    StepPhase,
    StepPricingFit,
    fit_async_step_pricing,
    read_forward_pass_metrics,
)
from profiler.importers.aiconfigurator_moe import DEFAULT_MOE_DISTRIBUTION

RUNS = SHARED / "observations" / "aic-fpm-b300"
DENSE = RUNS / "fpm_upfront_qwen32_full_once_20260613_194007"
UPFRONT = RUNS / "fpm_upfront_qwen36_moe_full_once_20260613_201336"
DP_EP = RUNS / "fpm_gap_qwen36_dp_ep_official_20260614_025420"
RELEASE = EngineRelease("vllm", "0.20.1")
REACH = TableReach(8192, 256, 8192, 32768)
STEPS = "fpm_metrics_detail.csv"


TABLES = ("shared", "package")  # where the B300 tables come from (`fit_b300`)


def fit_b300(
    routing: str = DEFAULT_MOE_DISTRIBUTION, max_iter: int = 100, *, tables: str = "shared"
) -> LatencyModel:
    """The B300 tables fitted as `servetune profile import` + fit does, the MoE op on
    `routing`'s rows. `tables`: "shared" reads the shared copy (profiles/aiconfigurator/
    b300_sxm), "package" the installed aiconfigurator-core's b300_sxm as `servetune profile
    import --aiconfigurator --gpu b300` does (its spec YAML beside data/). aiconfigurator-core
    0.12.0's b300_sxm holds the shared copy's vLLM 0.24.0 tables byte for byte; its spec's
    `misc.nccl_version` 2.27 names a NCCL table the shared copy lacks (it holds 2.29.2
    only), so the two differ in their 189 NCCL rows alone (all-gather up to x0.76-x1.64)."""
    from profiler.importers import ImportFormat, import_profile
    from profiler.importers.aiconfigurator_moe import moe_samples
    from profiler.importers.aiconfigurator_package import (
        choose_systems,
        import_system,
        locate_package,
    )

    if tables == "package":
        package = locate_package()
        choice = choose_systems(package, "b300", "vllm")[0][0]
        folder = package.folder(choice.system)
        samples = import_system(package, choice, "vllm").samples
    elif tables == "shared":
        folder = AICONFIGURATOR / "b300_sxm"
        samples = import_profile(folder, ImportFormat.AICONFIGURATOR).samples
    else:
        raise ValueError(f"tables {tables!r}: expected one of {TABLES}")
    if routing != DEFAULT_MOE_DISTRIBUTION:
        samples = [s for s in samples if s.op is not OpKind.MOE] + moe_samples(folder, routing)
    return fit_latency_model(samples, accelerator="b300", options=FitOptions(max_iter=max_iter))


def moe_folders() -> Iterator[tuple[Path, int, ExpertLayout]]:
    """(folder, tp, layout) of every MoE run: the TP/EP runs (`tpN_ep1`, `tpN_epN`), then
    the DP + EP ones (`tpT_epE`: dp = E / T, rank 0's steps)."""
    for d in sorted(UPFRONT.glob("tp*_ep*_past4096")):
        tp, ep = (int(x) for x in d.name.removeprefix("tp").split("_past")[0].split("_ep"))
        yield d, tp, ExpertLayout(1, ep > 1)
    for d in sorted(DP_EP.glob("tp*_dp_ep/tp*_ep*_past4096")):
        tp, ep = (int(x) for x in d.name.removeprefix("tp").split("_past")[0].split("_ep"))
        yield d, tp, ExpertLayout(ep // tp, True)


def table(model: LatencyModel, shape: ModelShape, tp: int, layout=DENSE_LAYOUT):
    """`shape` on `tp` B300s as the simulator prices it with `model`."""
    return build_catalog(shape, [model]).for_instance(
        "b300", tp, REACH, DEFAULT_PRECISION, engine=RELEASE, layout=layout
    )


def _groups(t: CompiledStepLatency, shape: ModelShape, tp: int, layout, path: Path, name: str,
            phases: set[StepPhase], after_idle: bool = True) -> dict[str, list]:  # fmt: skip
    """(step, its kernels as tabulated before the engine's scale, its forward's launches,
    the one-token forward outside MoE blocks) per step type of one run; without the steps
    after an idle gap unless `after_idle`."""
    raw = replace(t, host=NO_HOST_FLOOR)
    scale = RELEASE.generation.kernel_scale("b300")
    n = count_launches(shape, tp, layout)
    launches = HostFloor(CUDA_GRAPH_MAX_TOKENS, n.piecewise, n.eager)
    out: dict[str, list] = {}
    for s in read_forward_pass_metrics(path):
        if s.phase in phases and (after_idle or not s.after_idle):
            host = launches.floor_s(s.load.num_tokens, bool(s.load.prefill_q))
            out.setdefault(f"{name}-{s.phase}", []).append(
                (s, raw.kernel_time_s(s.load) / scale, host, t.forward_s)
            )
    return out


def fit_v1_async(model: LatencyModel) -> StepPricingFit:
    """The async generation's constants fitted on the steps the module docstring names."""
    dense = get_shape("qwen3-32b")
    groups: dict[str, list] = {}
    for tp in (1, 2, 4, 8):
        path = DENSE / f"tp{tp}_ep1_past4096" / STEPS
        groups |= _groups(table(model, dense, tp), dense, tp, DENSE_LAYOUT, path,
                          f"qwen3-32b-tp{tp}", set(StepPhase))  # fmt: skip
    moe = get_shape("qwen3.6-35b-a3b")
    judge: dict[str, list] = {}
    for folder, tp, layout in moe_folders():
        path = folder / STEPS
        if layout.dp > 1 or tp == 1 or not path.is_file():
            continue
        judge |= _groups(table(model, moe, tp, layout), moe, tp, layout, path, folder.name,
                         {StepPhase.PREFILL, StepPhase.MIXED}, after_idle=False)  # fmt: skip
    return fit_async_step_pricing(groups, judge=judge)


def describe(fit: StepPricingFit) -> str:
    return (f"kernel scale {fit.kernel_scale:.3f}, exposed {fit.exposed.describe()}, CPU "
            f"{fit.cpu.describe()}, host {fit.host_launch_s * 1e6:.1f} us per launch outside "
            f"CUDA graphs ({fit.num_steps} steps, {fit.num_dropped} dropped)")  # fmt: skip
