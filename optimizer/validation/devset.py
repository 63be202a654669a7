"""The development sets: measured vLLM runs that servetune's predictions are checked on.

- Offline batches of a V0-era vLLM (LLM-Inference-Bench; `runs_of`, `deployment`).
- Closed-loop runs of vLLM 0.12 serving Qwen3-32B on H100 (AIConfigurator's validation
  sample; `closed_loop_runs_of`, `closed_loop_deployment`).

The offline batches (argonne-lcf; ../shared/data/observations/llm-inference-bench, its
README gives the protocol):

Each row is one `vllm.LLM.generate()` call on `batch_size` prompts of exactly
`input_tokens` random tokens, all submitted at once, each generating exactly
`output_tokens` (ignore_eos): `latency_s` is the makespan, and on 9 rows `ttft_s`
the makespan of a separate run with one output token (the last request's TTFT).
The engine is vLLM v0 (0.5.x): chunked prefill off, so prompts get steps of their
own (`scheduling="prefill_first"`), the token budget is max(max_model_len, 2048),
256 sequences, fp16, gpu_memory_utilization 0.9, block 16.

`runs_of` reads the file; `deployment` turns a run into the `ServingConfig` and
workload that replay it (None with the reason when the model is not a dense
Llama-style shape servetune models: DeciLM's variable GQA, Bloom, GPT-J, OPT,
Gemma and Aquila rows are left out and counted). GPUs: the
A100s are taken as 40 GB parts (ALCF Polaris; see the data README), GH200 as its
H100 GPU with 96 GB of HBM3 at 4 TB/s.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optimizer.bench_serve import BenchServeSpec
from optimizer.closed_loop_workload import NO_FRONTEND, ClosedLoopWorkload
from optimizer.config import ConfigError, InstanceConfig, ServingConfig
from optimizer.shapes import ShapeError, get_shape

GPUS = {"a100": "a100-40gb", "h100": "h100", "gh200": "gh200"}
# max_position_embeddings of each checkpoint: vLLM's max_model_len, and with chunked
# prefill off its default token budget, max(max_model_len, 2048).
CONTEXT = {
    "meta-llama/Llama-2-7b-hf": 4096,
    "meta-llama/Llama-2-13b-hf": 4096,
    "meta-llama/Llama-2-70b-hf": 4096,
    "meta-llama/Meta-Llama-3-8B": 8192,
    "meta-llama/Meta-Llama-3-70B": 8192,
    "mistralai/Mistral-7B-v0.1": 32768,
    "mistralai/Mistral-7B-v0.3": 32768,
    "Qwen/Qwen2-7B": 32768,
    "Qwen/Qwen2-72B": 32768,
    "Qwen/Qwen1.5-7B": 32768,
    "huggyllama/llama-7b": 2048,
    "huggyllama/llama-13b": 2048,
}
V0_MAX_NUM_SEQS = 256
# The vLLM release the offline batches ran (gh200 pinned 0.5.3.post1; the A100 and H100
# requirements match 0.5.4-0.6.1): the V0 engine, priced with its own generation.
V0_RELEASE = "0.5.3"


class DevSetError(ValueError):
    """A development-set file that cannot be read (the message names the row and column)."""


@dataclass(frozen=True, slots=True)
class BatchRun:
    """One measured offline batch."""

    gpu: str
    tp: int
    model: str
    input_tokens: int
    output_tokens: int
    batch_size: int
    latency_s: float
    ttft_s: float | None  # the 9 rows of a separate one-token run

    @property
    def key(self) -> str:
        return f"{self.gpu} tp{self.tp} {self.model}"


def _csv_rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DevSetError(f"{path}: cannot read: {exc}") from exc


def runs_of(path: str | Path) -> list[BatchRun]:
    """Rows of `vllm_nvidia.csv`."""
    path = Path(path)
    out = []
    for i, row in enumerate(_csv_rows(path), start=2):
        try:
            ttft = row.get("ttft_s") or ""
            out.append(BatchRun(
                gpu=row["gpu"], tp=int(row["num_gpus"]), model=row["model"],
                input_tokens=int(row["input_tokens"]), output_tokens=int(row["output_tokens"]),
                batch_size=int(row["batch_size"]), latency_s=float(row["latency_s"]),
                ttft_s=float(ttft) if ttft else None,
            ))  # fmt: skip
        except (KeyError, ValueError) as exc:
            raise DevSetError(f"{path}: line {i}: {exc!r}") from None
    return out


@dataclass(frozen=True, slots=True)
class Deployment:
    config: ServingConfig
    workload: ClosedLoopWorkload  # the batch, released at once
    ttft_workload: ClosedLoopWorkload  # the same prompts with one output token


def deployment(run: BatchRun) -> Deployment | str:
    """The config and workloads that replay `run` (a string: why it cannot be)."""
    if run.gpu not in GPUS:
        return f"gpu {run.gpu!r} is not one of {sorted(GPUS)}"
    context = CONTEXT.get(run.model)
    if context is None:
        return f"{run.model}: not a dense Llama-style shape servetune models"
    try:
        get_shape(run.model)
        inst = InstanceConfig(
            accelerator=GPUS[run.gpu], tp=run.tp, max_num_batched_tokens=max(context, 2048),
            max_num_seqs=V0_MAX_NUM_SEQS, enable_chunked_prefill=False,
            scheduling="prefill_first",
        )  # fmt: skip
        config = ServingConfig.colocated(
            run.model, inst, max_model_len=context, engine_version=V0_RELEASE
        )
    except (ConfigError, ShapeError) as exc:
        return str(exc)
    n = run.batch_size

    def batch(output: int) -> ClosedLoopWorkload:
        return ClosedLoopWorkload(
            num_clients=n,
            input_tokens=np.full(n, run.input_tokens),
            output_tokens=np.full(n, output),
            name=f"{run.key} {run.input_tokens}/{output} x{n}",
            frontend=NO_FRONTEND,  # offline: generate() hands the batch over at once
        )

    return Deployment(config, batch(run.output_tokens), batch(1))


def abs_error(predicted: float, measured: float) -> float:
    """|predicted - measured| / measured."""
    return abs(predicted - measured) / measured if measured > 0 else math.inf


# ----------------------------------------------------------------------------- closed loop
# AIConfigurator's benchmark pipeline (../shared/data/observations/aic-silicon-dev, its
# README): aiperf's chat endpoint, streaming, closed loop at concurrency C with 10 x C
# measured requests after 2 x C warm-up requests that are drained first, fixed lengths,
# ignore_eos. The server is the pipeline's generated launch script: its config generator
# gives an aggregated vLLM worker `--max-num-batched-tokens` = batch + isl + 1,500 and
# `--max-num-seqs` = batch (`generator_budget`; batch: the row's `batch_size`, per
# attention-DP rank), chunked prefill, gpu_memory_utilization 0.9, block 16. That rule is
# inferred from the peer's public generator, which the data match; the rows carry no
# launch flags. Its CUDA-graph capture sizes 1..batch are not modelled: the steps are
# priced with vLLM's default sizes up to 512 tokens (`optimizer.engines`). Prefix caching
# is on (random prompts share no prefix).
#
# The sample's rows come in two schemas: the development set's (`precision`: "" or "fp8")
# and AIConfigurator's current one (`gemm_quant_mode`, `moe_quant_mode`,
# `kvcache_quant_mode`, `attention_dp_size`, `moe_tp_size`, `moe_ep_size`: the fields its
# tools/accuracy_regression_testing pass to `cli_estimate`). Both read here; a column a
# file lacks takes its default. `batch_size` is per attention-DP rank, as AIConfigurator
# counts it: the client's concurrency is batch_size x attention_dp_size.
# Qwen3's chat template around one user message (docs/closed-loop.md); other models' rows
# are given the same 8 tokens, not measured for their own templates.
QWEN3_CHAT_TOKENS = 8
GPU_OF_SYSTEM = {
    "a100_sxm": "a100", "h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200",
    "b300_sxm": "b300", "l40s": "l40s",
}  # fmt: skip
# AIConfigurator's quant modes (its sdk/common.py GEMMQuantMode / MoEQuantMode) as
# servetune's weight formats; "" is the checkpoint's own. A mode missing here is refused
# by name (int8 weight-only, SmoothQuant, W4A8 FP8: formats servetune does not price).
QUANT_MODES = {
    "": "", "bfloat16": "", "float16": "", "fp8": "fp8", "fp8_block": "fp8",
    "fp8_static": "fp8", "fp8_ootb": "fp8", "nvfp4": "fp4", "int4_wo": "int4",
    "w4a16_mxfp4": "mxfp4", "w4a8_mxfp4_mxfp8": "mxfp4", "w4a8_mxfp4_mxfp8_trtllm": "mxfp4",
    "w4a16_mxfp4_cutlass": "mxfp4",
}  # fmt: skip
KV_MODES = {"": "", "bfloat16": "auto", "float16": "auto", "fp8": "fp8"}
# The benchmark's requests per client: measured and warm-up (the README above).
MEASURED_PER_CLIENT = 10
WARMUPS_PER_CLIENT = 2
# What the generator adds to a batch's seats and one prompt for the step's token budget.
GENERATOR_BUDGET_MARGIN = 1500


@dataclass(frozen=True, slots=True)
class ClosedLoopRun:
    """One measured closed-loop run: its deployment, protocol and mean TTFT / TPOT.

    `precision` is the row's weight format as written (the development set's column, or
    `gemm_quant_mode`); `moe_precision` and `kv_precision` the MoE and KV-cache modes where
    the row gives them. `dp` is the attention-DP ranks, `moe_tp` / `moe_ep` how the experts
    are split (0: not given), `concurrency` the client's (all ranks')."""

    version: str
    model: str
    gpu: str
    precision: str  # "" (bf16) or a quant mode
    isl: int
    osl: int
    concurrency: int
    tp: int
    ttft_s: float
    tpot_s: float
    mode: str = "agg"
    pp: int = 1
    dp: int = 1
    moe_tp: int = 0
    moe_ep: int = 0
    moe_precision: str = ""
    kv_precision: str = ""

    @property
    def key(self) -> str:
        parts = [self.precision or "bf16", f"tp{self.tp}"]
        if self.moe_precision and self.moe_precision != self.precision:
            parts.insert(1, f"moe-{self.moe_precision}")
        if self.dp > 1:
            parts.append(f"dp{self.dp}")
        if self.moe_ep > 1:
            parts.append(f"ep{self.moe_ep}")
        parts += [f"{self.isl}/{self.osl}", f"c{self.concurrency}"]
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class ClosedLoopSample:
    """The vLLM runs of a sample file and the rows left out (other backends), each named."""

    runs: list[ClosedLoopRun]
    left_out: list[str]


def _int(row: dict[str, str], column: str, default: int) -> int:
    value = (row.get(column) or "").strip()
    return int(float(value)) if value else default


def read_closed_loop(path: str | Path) -> ClosedLoopSample:
    """Rows of AIConfigurator's validation sample (`qwen3_32b_h100_vllm.csv`, or a file of
    its current schema); rows of other backends are left out, by line. A row that cannot
    be read raises DevSetError naming its line."""
    path = Path(path)
    runs, left_out = [], []
    for i, row in enumerate(_csv_rows(path), start=2):
        try:
            if row["backend"] != "vllm":
                left_out.append(f"line {i}: backend {row['backend']!r} (not vLLM)")
                continue
            dp = _int(row, "attention_dp_size", 1)
            precision = row.get("precision")
            if precision is None:
                precision = row.get("gemm_quant_mode") or ""
            runs.append(ClosedLoopRun(
                version=row["backend_version"], model=row["model_path"], gpu=row["system"],
                precision=precision.strip(), isl=int(row["isl"]), osl=int(row["osl"]),
                concurrency=int(row["batch_size"]) * dp, tp=int(row["tp_size"]),
                ttft_s=float(row["silicon_ttft_ms"]) / 1e3,
                tpot_s=float(row["silicon_tpot_ms"]) / 1e3,
                mode=(row.get("mode") or "agg").strip(), pp=_int(row, "pp_size", 1), dp=dp,
                moe_tp=_int(row, "moe_tp_size", 0), moe_ep=_int(row, "moe_ep_size", 0),
                moe_precision=(row.get("moe_quant_mode") or "").strip(),
                kv_precision=(row.get("kvcache_quant_mode") or "").strip(),
            ))  # fmt: skip
        except (KeyError, ValueError) as exc:
            raise DevSetError(f"{path}: line {i}: {exc!r}") from None
    return ClosedLoopSample(runs, left_out)


def closed_loop_runs_of(path: str | Path) -> list[ClosedLoopRun]:
    """The vLLM runs of a sample file (`read_closed_loop`)."""
    return read_closed_loop(path).runs


def _format(run: ClosedLoopRun, mode: str, table: dict[str, str], what: str) -> str:
    if mode not in table:
        raise DevSetError(
            f"{run.key}: {what} {mode!r} is not a format servetune prices (one of "
            f"{sorted(m for m in table if m)})"
        )
    return table[mode]


def _expert_parallel(run: ClosedLoopRun) -> bool:
    """Whether `run` splits its experts by EP (vLLM's --enable-expert-parallel: EP over all
    tp x dp GPUs) or by TP over them; other splits are refused."""
    gpus = run.tp * run.dp
    ep = run.moe_ep or 1
    tp = run.moe_tp or gpus // ep
    if ep == gpus and tp == 1 and gpus > 1:
        return True
    if ep == 1 and tp == gpus:
        return False
    raise DevSetError(
        f"{run.key}: moe_tp_size {run.moe_tp} x moe_ep_size {run.moe_ep} over tp {run.tp} x "
        f"attention dp {run.dp}: vLLM splits experts by EP over all {gpus} GPUs or by TP"
    )


def generator_budget(run: ClosedLoopRun) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of `run`'s server, per engine (attention-DP
    rank), as the peer's config generator sets them: batch + isl + 1,500 tokens and batch
    sequences, where batch is the row's batch_size (inferred: the README above)."""
    batch = run.concurrency // run.dp
    return batch + run.isl + GENERATOR_BUDGET_MARGIN, batch


def closed_loop_deployment(run: ClosedLoopRun) -> tuple[ServingConfig, BenchServeSpec]:
    """The config and the benchmark client that replay `run`; DevSetError (why) when it
    cannot be replayed. The development set's "fp8" rows ran FP8 weights quantised at load
    and an FP8 KV cache: with a 16-bit KV cache, one decode step of their batches would
    read more bytes than the measured TPOT leaves time for on the GPU's bandwidth (e.g.
    TP1, 24 x ~4,500 tokens: 61 GB, 18 ms at 3.35 TB/s, against 16.9 ms measured). A
    pre-quantised checkpoint (an -FP8 or NVFP4 id) runs as it ships."""
    gpu = GPU_OF_SYSTEM.get(run.gpu)
    if gpu is None:
        raise DevSetError(f"{run.key}: system {run.gpu!r} is not one of {sorted(GPU_OF_SYSTEM)}")
    if run.mode != "agg":
        raise DevSetError(f"{run.key}: mode {run.mode!r}: only aggregated (agg) runs replay")
    if run.pp != 1:
        raise DevSetError(f"{run.key}: pipeline parallel ({run.pp}) is not modelled")
    try:
        shape = get_shape(run.model)
    except ShapeError as exc:
        raise DevSetError(f"{run.key}: {exc}") from None
    weights = _format(run, run.precision, QUANT_MODES, "weight format")
    experts = _format(run, run.moe_precision, QUANT_MODES, "MoE format")
    kv = _format(run, run.kv_precision, KV_MODES, "KV-cache format") or "auto"
    quantization = None
    if shape.quantization == "none":  # a 16-bit checkpoint, quantised at load if the row says
        quantization = weights or experts or None
        if quantization == "fp8" and not run.kv_precision:
            kv = "fp8"  # quantised at load, no KV mode given: FP8 KV (the docstring)
    moe = shape.moe is not None
    expert_parallel = _expert_parallel(run) if moe else False
    # A dense model's DP ranks are independent replicas behind one server (vLLM balances
    # the requests over them); a MoE's are one instance whose experts span them all.
    dp, replicas = (run.dp, 1) if moe else (1, run.dp)
    tokens, seqs = generator_budget(run)
    try:
        inst = InstanceConfig(accelerator=gpu, tp=run.tp, dp=dp,
                              expert_parallel=expert_parallel, max_num_batched_tokens=tokens,
                              max_num_seqs=seqs)  # fmt: skip
        config = ServingConfig.colocated(
            run.model, inst, num_replicas=replicas, engine_version=run.version,
            enable_prefix_caching=True, quantization=quantization, kv_cache_dtype=kv,
        )  # fmt: skip
        config.roles()  # fits the GPUs, formats the GPU runs
    except (ConfigError, ShapeError) as exc:
        raise DevSetError(f"{run.key}: {exc}") from None
    c = run.concurrency
    spec = BenchServeSpec(
        random_input_len=run.isl, random_output_len=run.osl, num_prompts=MEASURED_PER_CLIENT * c,
        max_concurrency=c, num_warmups=WARMUPS_PER_CLIENT * c,
        chat_template_tokens=QWEN3_CHAT_TOKENS,
        client="aiperf",
    )  # fmt: skip
    return config, spec
