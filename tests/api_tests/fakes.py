"""A fake tuning executor for service tests: N "trials" that resume after a takeover,
returning a real `TuneOutcome` (the search's own type) built without simulating."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from api.worker import JobContext
from optimizer.config import InstanceConfig, ServingConfig
from optimizer.search import EvalStatus, Evaluation, TuneOutcome, TuneProgress, TuneRequest
from optimizer.search.attainment import Attainment, Load
from optimizer.search.diagnose import Diagnosis, PhaseDiagnosis
from optimizer.search.evaluation import EvalStage
from optimizer.search.flags import launch_commands
from optimizer.search.outcome import CapacityRow, LatencyInfo, Recommendation, SLOCheck
from optimizer.search.recommend import BaselineComparison, ParetoRow
from optimizer.search.trials import TrialsSummary
from optimizer.search.verdict import Verdict
from optimizer.search.windows import EvaluatedTrace, TraceWindow


def _config(tokens: int) -> ServingConfig:
    inst = InstanceConfig(accelerator="h100", max_num_batched_tokens=tokens, max_num_seqs=256)
    return ServingConfig.colocated("llama-3.1-8b", inst, num_replicas=2)


def _attainment(load: Load, rate: float, share: float) -> Attainment:
    return Attainment(load, rate, share, ttft_share=share, tpot_share=1.0)


def _evaluation(goodput: float, interactivity: float, feasible: bool = True) -> Evaluation:
    status = EvalStatus.FEASIBLE if feasible else EvalStatus.INFEASIBLE
    share = 0.95 if feasible else 0.5
    attained = (_attainment(Load.SIZING, 7.5, share), _attainment(Load.TRACE, 5.0, share + 0.03))
    return Evaluation(
        status, EvalStage.VERIFIED, 2, num_units=2, unit_gpus=1, unit_rate=goodput,
        goodput_per_gpu=goodput, interactivity_tok_s=interactivity,
        attainments=attained, ttft_p90_ms=850.0, tpot_p90_ms=31.0,
    )  # fmt: skip


_WINDOW = TraceWindow(1000, 0.0, 200.0, 5.0)
EVALUATED = EvaluatedTrace(_WINDOW, _WINDOW, 7.5, 60.0, 1.0, 7.5)


def _phase(label: str) -> PhaseDiagnosis:
    return PhaseDiagnosis(
        label, 10.0, 0.2, 0.7, 0.1, 12.0, 30.0, 900.0, 295.0, 0.4, 0, 0.1, 0.02,
        float("nan"), 850.0, 31.0,
    )  # fmt: skip


def fake_outcome(request: TuneRequest, num_trials: int) -> TuneOutcome:
    pareto = tuple(
        ParetoRow(t, _config(2048 * (t + 1)), _evaluation(2.0 - 0.1 * t, 40.0 + 10 * t, t % 2 == 0))
        for t in range(min(num_trials, 6))
    )
    best = pareto[0] if pareto else ParetoRow(0, _config(2048), _evaluation(2.0, 40.0))
    rec = Recommendation(
        trial=best.trial,
        config=best.config,
        predicted=best.predicted,
        slo_checks=(SLOCheck("ttft_p90_ms", 850.0, request.slo_ttft_ms),
                    SLOCheck("tpot_p90_ms", 31.0, request.slo_tpot_ms)),
        launch=launch_commands(best.config),
    )  # fmt: skip
    base_cfg = _config(8192)
    baseline = BaselineComparison(
        "vLLM defaults (8192 tokens, 1024 seqs)", base_cfg, _evaluation(1.25, 35.0), 1.6
    )
    account = ("Decode-bound: smaller chunks cut ITL spikes from co-scheduled prefills.",)
    return TuneOutcome(
        request=request,
        study_name="fake",
        num_trials=num_trials,
        latency=LatencyInfo("fake latency", True),
        recommendation=rec,
        baseline=baseline,
        evaluated=EVALUATED,
        pareto=pareto,
        capacity=(
            CapacityRow(1.0, 5.0, 7.5, 2, 2, None, _attainment(Load.SIZING, 7.5, 0.95), True),
            CapacityRow(2.0, 10.0, 15.0, 4, 4, None, _attainment(Load.SIZING, 15.0, 0.93), True),
        ),
        diagnosis=Diagnosis(_phase("baseline"), _phase("recommendation"), account),
        verdict=Verdict(
            headline=f"Recommendation (trial {best.trial}): 2 GPUs (2 x 1-GPU unit).",
            baseline="Baseline (vLLM defaults): meets the SLOs with 2 GPUs.",
            runner_up="",
            what_ifs=(),
        ),
        trials=TrialsSummary(num_trials, (), ()),
    )


def make_fake_executor(delay_s: float = 0.0) -> Callable[[JobContext], TuneOutcome]:
    """Runs `params.num_trials` trials of `delay_s` each, reporting after every one and
    resuming from the last reported count after a takeover."""

    def execute(ctx: JobContext) -> TuneOutcome:
        request = ctx.job.params
        total = request.num_trials
        done = ctx.job.progress.trials_done if ctx.job.progress else 0
        log = os.environ.get("SERVETUNE_FAKE_START_LOG")
        if log:  # where each attempt resumed, for the takeover test
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(f"{done}\n")
        for _ in range(done, total):
            if ctx.should_stop():
                return fake_outcome(request, done)
            time.sleep(delay_s)
            done += 1
            ctx.report(TuneProgress(done, total, 2.0, delay_s * (total - done)))
        return fake_outcome(request, total)

    return execute
