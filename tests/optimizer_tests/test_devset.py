"""The development set (LLM-Inference-Bench vLLM batch runs) and its replay."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from optimizer.engines import vllm_server_budget
from optimizer.hardware import get_accelerator
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.sim import simulate
from optimizer.validation.devset import (
    BatchRun,
    Deployment,
    DevSetError,
    closed_loop_deployment,
    closed_loop_runs_of,
    deployment,
    read_closed_loop,
    runs_of,
)

HEADER = "gpu,num_gpus,model,input_tokens,output_tokens,batch_size,latency_s,ttft_s\n"


def _run(**change: object) -> BatchRun:
    fields = dict(gpu="a100", tp=1, model="meta-llama/Llama-2-7b-hf", input_tokens=10,
                  output_tokens=3, batch_size=2, latency_s=1.0, ttft_s=None)  # fmt: skip
    fields.update(change)
    return BatchRun(**fields)  # type: ignore[arg-type]


def test_a_run_replays_as_the_v0_engine_ran_it() -> None:
    dep = deployment(_run())
    assert isinstance(dep, Deployment)
    cfg = dep.config
    assert cfg.model == "meta-llama/Llama-2-7b-hf"
    inst = cfg.replica
    assert inst.accelerator == "a100-40gb" and inst.scheduling == "prefill_first"
    assert not inst.enable_chunked_prefill and inst.max_num_batched_tokens == 4096
    assert inst.max_num_seqs == 256
    # By hand, one step costing C: both prompts prefill in one step (first token), then
    # two decode steps: the makespan is 3 C; the TTFT run is that one step.
    c = 0.01
    const = SingleLatencySource(LinearLatency(base_s=c))
    res = simulate(dep.workload, cfg, const, seed=0)
    assert float(np.nanmax(res.e2e_s)) == pytest.approx(3 * c)
    res = simulate(dep.ttft_workload, cfg, const, seed=0)
    assert float(np.nanmax(res.e2e_s)) == pytest.approx(c)


def test_unmodelled_runs_say_why() -> None:
    assert "not a dense Llama-style shape" in str(deployment(_run(model="bigscience/bloom-7b1")))
    assert "is not one of" in str(deployment(_run(gpu="mi250")))
    # LLaMA-1 has Llama-2's dimensions with a 2,048-token context
    dep = deployment(_run(model="huggyllama/llama-7b"))
    assert isinstance(dep, Deployment) and dep.config.replica.max_num_batched_tokens == 2048


def test_malformed_rows_are_named(tmp_path: Path) -> None:
    path = tmp_path / "dev.csv"
    path.write_text(HEADER + "a100,1,m,1024,1024,many,1.0,\n")
    with pytest.raises(DevSetError, match="line 2"):
        runs_of(path)
    with pytest.raises(DevSetError, match="cannot read"):
        runs_of(tmp_path / "missing.csv")


def test_the_shared_file(shared_data: Path) -> None:
    runs = runs_of(shared_data / "observations" / "llm-inference-bench" / "vllm_nvidia.csv")
    assert len(runs) == 754
    assert sum(r.ttft_s is not None for r in runs) == 9
    replayed = [r for r in runs if isinstance(deployment(r), Deployment)]
    assert len(replayed) >= 590  # every dense Llama-style model on A100, H100 and GH200


def test_offline_batches_are_priced_as_the_v0_engine() -> None:
    dep = deployment(_run())
    assert isinstance(dep, Deployment)
    assert dep.config.engine_release.generation.key == "vllm-v0"


CLOSED_HEADER = (
    "backend,backend_version,model_path,system,precision,mode,isl,osl,batch_size,tp_size,"
    "pp_size,silicon_ttft_ms,silicon_tpot_ms\n"
)


def test_closed_loop_runs_replay_aiconfigurators_protocol(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(CLOSED_HEADER + "vllm,0.12.0,Qwen/Qwen3-32B,h100_sxm,,agg,1024,128,8,2,1,"
                    "154.2,18.0\nvllm,0.12.0,Qwen/Qwen3-32B,h100_sxm,fp8,agg,4000,1000,24,1,1,"
                    "294.8,16.9\n", encoding="utf-8")  # fmt: skip
    bf16, fp8 = closed_loop_runs_of(path)
    assert bf16.ttft_s == pytest.approx(0.1542) and bf16.key == "bf16 tp2 1024/128 c8"
    config, spec = closed_loop_deployment(bf16)
    assert config.engine_release.label == "vLLM 0.12.0, V1 with synchronous scheduling"
    # The peer's generator: 8 clients + 1,024 tokens + 1,500 to a step, 8 sequences.
    assert (config.replica.tp, config.replica.max_num_batched_tokens) == (2, 2532)
    assert config.replica.max_num_seqs == 8 and config.enable_prefix_caching
    wl = spec.workload()  # 10 x 8 measured after 2 x 8 warm-ups
    assert (len(wl), wl.num_warmups, wl.num_clients) == (96, 16, 8)
    assert set(wl.input_tokens.tolist()) == {1032}  # Qwen3's chat template adds 8
    config, _ = closed_loop_deployment(fp8)
    assert config.shape.precision.label == "w-fp8.kv-fp8"
    assert (config.replica.max_num_batched_tokens, config.replica.max_num_seqs) == (5524, 24)
    path.write_text(CLOSED_HEADER + "sglang,0.5,Qwen/Qwen3-32B,h100_sxm,,agg,1,1,1,1,1,1,1\n"
                    "vllm,0.12.0,Qwen/Qwen3-32B,h100_sxm,,agg,1024,x,8,2,1,1,1\n",
                    encoding="utf-8")  # fmt: skip
    with pytest.raises(DevSetError, match=r"line 3: .*'x'"):
        closed_loop_runs_of(path)
    path.write_text(CLOSED_HEADER + "sglang,0.5,Qwen/Qwen3-32B,h100_sxm,,agg,1,1,1,1,1,1,1\n",
                    encoding="utf-8")  # fmt: skip
    sample = read_closed_loop(path)  # another backend's row is left out, and said so
    assert sample.runs == [] and sample.left_out == ["line 2: backend 'sglang' (not vLLM)"]


# AIConfigurator's current schema (the fields its accuracy tools pass to cli_estimate).
CURRENT_HEADER = (
    "id,model_path,system,backend,backend_version,mode,isl,osl,gemm_quant_mode,"
    "moe_quant_mode,kvcache_quant_mode,tp_size,pp_size,attention_dp_size,moe_tp_size,"
    "moe_ep_size,batch_size,silicon_ttft_ms,silicon_tpot_ms\n"
)


def test_closed_loop_rows_of_the_current_schema_replay_moe_splits_and_formats(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sample.csv"
    path.write_text(CURRENT_HEADER + "\n".join([
        "1,openai/gpt-oss-120b,b200_sxm,vllm,0.11.0,agg,1024,1024,,w4a16_mxfp4,,4,1,1,4,1,16,1,1",
        "2,Qwen/Qwen3-235B-A22B-FP8,h200_sxm,vllm,0.12.0,agg,4096,512,fp8_block,fp8_block,,4,1,2,"
        "1,8,8,1,1",
        "3,Qwen/Qwen3-235B-A22B,b200_sxm,vllm,0.12.0,agg,1024,1024,nvfp4,nvfp4,fp8,8,1,1,8,1,32,1,1",
        "4,Qwen/Qwen3-30B-A3B,a100_sxm,vllm,0.12.0,agg,1024,128,fp8,fp8,,2,1,1,2,1,4,1,1",
    ]) + "\n", encoding="utf-8")  # fmt: skip
    gpt, qwen_fp8, qwen_fp4, a100 = read_closed_loop(path).runs
    config, spec = closed_loop_deployment(gpt)  # MXFP4 experts as the checkpoint ships them
    assert config.quantization is None and config.shape.precision.label == "w-mxfp4.kv-auto"
    assert (config.replica.accelerator, config.replica.tp, config.replica.dp) == ("b200", 4, 1)
    assert not config.replica.expert_parallel and spec.max_concurrency == 16
    # batch_size is per attention-DP rank: 8 x 2 clients; EP over all 4 x 2 GPUs
    assert qwen_fp8.concurrency == 16 and qwen_fp8.key == "fp8_block tp4 dp2 ep8 4096/512 c16"
    config, spec = closed_loop_deployment(qwen_fp8)
    assert (config.replica.dp, config.replica.expert_parallel) == (2, True)
    # each attention-DP rank's engine: its batch of 8 + 4,096 + 1,500 tokens, 8 sequences
    assert (config.replica.max_num_batched_tokens, config.replica.max_num_seqs) == (5604, 8)
    # a pre-quantised checkpoint keeps its own KV format (vLLM's --kv-cache-dtype auto)
    assert config.quantization is None and config.shape.precision.label == "w-fp8.kv-auto"
    assert (spec.num_prompts, spec.num_warmups) == (160, 32)
    config, _ = closed_loop_deployment(qwen_fp4)  # NVFP4 at load, the row's FP8 KV cache
    assert config.quantization == "fp4" and config.shape.precision.label == "w-fp4.kv-fp8"
    dense = replace(qwen_fp8, model="Qwen/Qwen3-32B", dp=2, moe_tp=0, moe_ep=0)
    config, _ = closed_loop_deployment(dense)  # a dense model's DP ranks: two replicas
    assert (config.num_replicas, config.replica.dp, config.replica.tp) == (2, 1, 4)
    assert (config.replica.max_num_batched_tokens, config.replica.max_num_seqs) == (5604, 8)
    config, _ = closed_loop_deployment(a100)  # the generator's budget on any GPU
    assert (config.replica.max_num_batched_tokens, config.replica.max_num_seqs) == (2528, 4)
    assert config.shape.precision.label == "w-fp8.kv-fp8"  # quantised at load, as before


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (
            "Qwen/Qwen3-235B-A22B,h100_sxm,vllm,0.12.0,agg,1024,1024,nvfp4,nvfp4,,8,1,1,8,1,32",
            r"fp4 .*needs FP4 tensor cores.*h100",
        ),
        (
            "Qwen/Qwen3-30B-A3B,gb200,vllm,0.12.0,agg,1024,1024,,,,2,1,1,2,1,16",
            r"system 'gb200' is not one of",
        ),
        (
            "Qwen/Qwen3-30B-A3B,h100_sxm,vllm,0.12.0,disagg,1024,1024,,,,2,1,1,2,1,16",
            r"mode 'disagg'",
        ),
        (
            "Qwen/Qwen3-30B-A3B,h100_sxm,vllm,0.12.0,agg,1024,1024,,,,2,2,1,2,1,16",
            r"pipeline parallel \(2\)",
        ),
        (
            "Qwen/Qwen3-30B-A3B,h100_sxm,vllm,0.12.0,agg,1024,1024,sq,,,2,1,1,2,1,16",
            r"weight format 'sq' is not a format servetune prices",
        ),
        (
            "Qwen/Qwen3-30B-A3B,h100_sxm,vllm,0.12.0,agg,1024,1024,,,,2,1,2,2,2,16",
            r"moe_tp_size 2 x moe_ep_size 2 over tp 2 x attention dp 2",
        ),
        (
            "acme/NoSuchModel,h100_sxm,vllm,0.12.0,agg,1024,1024,,,,2,1,1,2,1,16",
            r"unknown model shape 'acme/NoSuchModel'",
        ),
    ],
)
def test_a_closed_loop_row_that_cannot_replay_is_refused_by_name(
    tmp_path: Path, row: str, reason: str
) -> None:
    path = tmp_path / "sample.csv"
    path.write_text(CURRENT_HEADER + f"1,{row},1,1\n", encoding="utf-8")
    (run,) = read_closed_loop(path).runs
    with pytest.raises(DevSetError, match=reason):
        closed_loop_deployment(run)


def test_vllm_server_budget_follows_vllms_rule_by_gpu_memory() -> None:
    # >= 70 GiB and not an A100: 8,192 tokens and 1,024 sequences; else 2,048 and 256
    def budget(name: str) -> tuple[int, int]:
        acc = get_accelerator(name)
        return vllm_server_budget(acc.memory_gib, acc.family)

    assert budget("h100") == budget("b300") == (8192, 1024)
    assert budget("a100") == budget("l40s") == (2048, 256)


@pytest.mark.shared_data
def test_the_closed_loop_development_set_reads_and_every_run_is_accepted(shared_data) -> None:
    runs = closed_loop_runs_of(
        shared_data / "observations" / "aic-silicon-dev" / "qwen3_32b_h100_vllm.csv"
    )
    assert len(runs) == 93 and {r.version for r in runs} == {"0.12.0"}
    for run in runs:  # none refused: each config validates (FP8 at TP1 included)
        config, spec = closed_loop_deployment(run)
        assert config.roles()[0].kv_blocks > 0 and spec.num_warmups == 2 * run.concurrency
        assert spec.num_prompts == 10 * run.concurrency  # measured requests, as run
