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
# AIConfigurator's benchmark (../shared/data/observations/aic-silicon-dev, its README):
# aiperf's chat endpoint, streaming, closed loop at concurrency C with 20 x C measured
# requests after 2 x C warm-up requests, fixed lengths, ignore_eos; vLLM's API-server
# defaults on an H100 (8,192 batched tokens, 1,024 sequences, chunked prefill, prefix
# caching on; random prompts share no prefix).
QWEN3_CHAT_TOKENS = 8  # Qwen3's chat template around one user message (docs/closed-loop.md)
GPU_OF_SYSTEM = {"h100_sxm": "h100", "h200_sxm": "h200"}


@dataclass(frozen=True, slots=True)
class ClosedLoopRun:
    """One measured closed-loop run: its deployment, protocol and mean TTFT / TPOT."""

    version: str
    model: str
    gpu: str
    precision: str  # "" (bf16) or "fp8"
    isl: int
    osl: int
    concurrency: int
    tp: int
    ttft_s: float
    tpot_s: float

    @property
    def key(self) -> str:
        return f"{self.precision or 'bf16'} tp{self.tp} {self.isl}/{self.osl} c{self.concurrency}"


def closed_loop_runs_of(path: str | Path) -> list[ClosedLoopRun]:
    """Rows of AIConfigurator's validation sample (`qwen3_32b_h100_vllm.csv`)."""
    path = Path(path)
    out = []
    for i, row in enumerate(_csv_rows(path), start=2):
        try:
            if row["backend"] != "vllm" or int(row["pp_size"]) != 1:
                raise ValueError(f"backend {row['backend']!r}, pp {row['pp_size']}: not vLLM, PP 1")
            out.append(ClosedLoopRun(
                version=row["backend_version"], model=row["model_path"], gpu=row["system"],
                precision=row["precision"], isl=int(row["isl"]), osl=int(row["osl"]),
                concurrency=int(row["batch_size"]), tp=int(row["tp_size"]),
                ttft_s=float(row["silicon_ttft_ms"]) / 1e3,
                tpot_s=float(row["silicon_tpot_ms"]) / 1e3,
            ))  # fmt: skip
        except (KeyError, ValueError) as exc:
            raise DevSetError(f"{path}: line {i}: {exc!r}") from None
    return out


def closed_loop_deployment(run: ClosedLoopRun) -> tuple[ServingConfig, BenchServeSpec]:
    """The config and the benchmark client that replay `run`. Its "fp8" rows ran FP8
    weights quantised at load and an FP8 KV cache: with a 16-bit KV cache, one decode step
    of their batches would read more bytes than the measured TPOT leaves time for on the
    GPU's bandwidth (e.g. TP1, 24 x ~4,500 tokens: 61 GB, 18 ms at 3.35 TB/s, against
    16.9 ms measured)."""
    gpu = GPU_OF_SYSTEM.get(run.gpu)
    if gpu is None:
        raise DevSetError(f"{run.key}: system {run.gpu!r} is not one of {sorted(GPU_OF_SYSTEM)}")
    fp8 = run.precision == "fp8"
    inst = InstanceConfig(accelerator=gpu, tp=run.tp, max_num_batched_tokens=8192,
                          max_num_seqs=1024)  # fmt: skip
    config = ServingConfig.colocated(
        run.model, inst, engine_version=run.version, enable_prefix_caching=True,
        quantization="fp8" if fp8 else None, kv_cache_dtype="fp8" if fp8 else "auto",
    )  # fmt: skip
    c = run.concurrency
    spec = BenchServeSpec(
        random_input_len=run.isl, random_output_len=run.osl, num_prompts=20 * c,
        max_concurrency=c, num_warmups=2 * c, chat_template_tokens=QWEN3_CHAT_TOKENS,
        client="aiperf",
    )  # fmt: skip
    return config, spec
