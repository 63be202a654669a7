"""A fake tuning executor for service tests: N "trials" that resume after a takeover."""

from __future__ import annotations

import time
from collections.abc import Callable

from api.worker import JobContext
from storage.tuning_records import (
    Baseline,
    Engine,
    JobProgress,
    LaunchCommand,
    ParetoPoint,
    Recommendation,
    TuningOutcome,
)


def fake_outcome(num_trials: int) -> TuningOutcome:
    pareto = tuple(
        ParetoPoint(
            trial=t,
            goodput_per_gpu=2.0 - 0.1 * t,
            interactivity_tok_s=40.0 + 10 * t,
            num_gpus=8,
            meets_slo=t % 2 == 0,
            config={"mode": "colocated", "max_num_batched_tokens": 2048 * (t + 1)},
        )
        for t in range(min(num_trials, 6))
    )
    rec = Recommendation(
        trial=0,
        goodput_per_gpu=2.0,
        interactivity_tok_s=40.0,
        num_gpus=8,
        predicted={"ttft_p90_ms": 850.0, "tpot_p90_ms": 31.0, "attainment": 0.95},
        launch_commands=(
            LaunchCommand(Engine.VLLM, "replica", "vllm serve m --max-num-batched-tokens 2048"),
            LaunchCommand(Engine.SGLANG, "replica", "python -m sglang.launch_server --tp-size 1"),
        ),
        config={"mode": "colocated", "max_num_batched_tokens": 2048},
    )
    baseline = Baseline(
        description="vLLM defaults (8192 tokens, 1024 seqs)",
        goodput_per_gpu=1.25,
        interactivity_tok_s=35.0,
        predicted={"ttft_p90_ms": 2400.0},
        gain=1.6,
    )
    return TuningOutcome(
        pareto=pareto,
        recommendation=rec,
        baseline=baseline,
        diagnosis=("Decode-bound: smaller chunks cut ITL spikes from co-scheduled prefills.",),
        num_trials=num_trials,
    )


def make_fake_executor(delay_s: float = 0.0) -> Callable[[JobContext], TuningOutcome]:
    """Runs `params.num_trials` trials of `delay_s` each, reporting after every one."""

    def execute(ctx: JobContext) -> TuningOutcome:
        total = ctx.job.params.num_trials
        done = ctx.job.progress.completed_trials if ctx.job.progress else ()
        for trial in range(len(done), total):
            if ctx.should_stop():
                return fake_outcome(len(done))
            time.sleep(delay_s)
            done = (*done, trial)
            ctx.report(
                JobProgress(
                    trials_done=len(done),
                    trials_total=total,
                    best_goodput_per_gpu=2.0,
                    eta_s=delay_s * (total - len(done)),
                    completed_trials=done,
                )
            )
        return fake_outcome(total)

    return execute
