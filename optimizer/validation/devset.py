"""The development set: measured offline vLLM batch runs (LLM-Inference-Bench, argonne-lcf;
../shared/data/observations/llm-inference-bench, its README gives the protocol).

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

from optimizer.config import ConfigError, InstanceConfig, ServingConfig
from optimizer.shapes import ShapeError, get_shape
from optimizer.workload import NO_FRONTEND, ClosedLoopWorkload

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


def runs_of(path: str | Path) -> list[BatchRun]:
    """Rows of `vllm_nvidia.csv`."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise DevSetError(f"{path}: cannot read: {exc}") from exc
    out = []
    for i, row in enumerate(rows, start=2):
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
        config = ServingConfig.colocated(run.model, inst, max_model_len=context)
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
