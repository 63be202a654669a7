"""Search: space/grid, seeded study, constraints, reproducibility, flags, baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from optimizer.config import (
    InstanceConfig,
    ServingConfig,
    ServingMode,
    SpecMethod,
    SpeculationConfig,
)
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.search.flags import launch_commands
from optimizer.search.objective import EvalSettings, EvalStatus, TraceEvaluator
from optimizer.search.recommend import baseline_config, hypervolume_2d, recommend
from optimizer.search.space import SearchSpace, SearchSpaceError, config_key, enumerate_grid
from optimizer.search.study import Objective, open_study, run_trials, trial_outcomes
from optimizer.sim import SLO
from optimizer.workload import FixedLength, LognormalLength, synthetic_workload

LAT = SingleLatencySource(LinearLatency(base_s=0.007, per_token_s=2.7e-5, per_kv_token_s=4e-8))


def _workload():
    return synthetic_workload(
        200, 4.0, input_lengths=LognormalLength(800, 0.5, max_tokens=4000),
        output_lengths=FixedLength(60), seed=1,
    )  # fmt: skip


def _space(**kw) -> SearchSpace:
    base = dict(
        model="llama-3.1-8b", accelerators=("h100",), gpu_budget=4,
        tp=(1, 2), max_num_batched_tokens=(256, 1024, 4096), max_num_seqs=(64, 512),
    )  # fmt: skip
    base.update(kw)
    return SearchSpace(**base)


def _evaluator() -> TraceEvaluator:
    return TraceEvaluator.for_trace(
        _workload(), LAT, EvalSettings(SLO(2.0, 0.05), max_requests=200, seed=0)
    )


def test_grid_covers_each_path_once_and_flags_invalid_ones():
    pts = list(enumerate_grid(_space(modes=(ServingMode.COLOCATED,))))
    # 2 tp x 3 tokens x 2 seqs x 2 chunked
    assert len(pts) == 24
    assert len({p.params for p in pts}) == 24
    bad = [p for p in pts if p.config is None]
    # max_num_batched_tokens 256 < max_num_seqs 512 breaks vLLM's rule (2 tp x 2 chunked)
    assert len(bad) == 4 and all("max_num_seqs" in p.error for p in bad)


def test_disaggregated_split_stays_within_budget():
    for p in enumerate_grid(_space(modes=(ServingMode.DISAGGREGATED,))):
        if p.config is not None:
            assert p.config.num_gpus <= 4
            assert p.config.num_prefill >= 1 and p.config.num_decode >= 1


def test_space_rejects_bad_overrides_with_the_field_named():
    with pytest.raises(SearchSpaceError, match="unknown keys \\['chunk'\\]"):
        _space().with_overrides({"chunk": [1]})
    with pytest.raises(SearchSpaceError, match="spec_k"):
        _space(spec_k=(0, 9), spec_method=SpecMethod.EAGLE)


def _run(seed: int, n: int = 5):
    study = open_study(f"s{seed}", None, seed=seed, n_startup_trials=3)
    run_trials(study, Objective(_space(), _evaluator()), n)
    return study


def test_seeded_study_is_reproducible_and_never_recommends_invalid():
    a, b = _run(3), _run(3)
    assert [t.params for t in a.trials] == [t.params for t in b.trials]
    assert [t.values for t in a.trials] == [t.values for t in b.trials]
    assert len(a.trials) == 5
    outcomes = trial_outcomes(a)
    rec = recommend(outcomes)
    if rec is not None:
        assert rec.evaluation.status is EvalStatus.FEASIBLE
    for t in a.trials:
        if "config_error" in t.user_attrs:
            assert t.constraints == [1.0]


def test_invalid_config_never_recommended_even_with_high_goodput():
    ev = _evaluator()
    good = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_seqs=64), num_replicas=4)
    outcomes = [o for o in trial_outcomes(_run(1)) if o.evaluation.feasible]
    if not outcomes:
        pytest.skip("no feasible trial in 5")
    from dataclasses import replace

    from optimizer.search.recommend import TrialOutcome

    fake = TrialOutcome(99, good, replace(ev.evaluate(good), status=EvalStatus.INFEASIBLE,
                                          goodput_per_gpu=1e9))  # fmt: skip
    assert recommend([*outcomes, fake]).number != 99


def test_ties_go_to_fewer_gpus():
    from dataclasses import replace

    from optimizer.search.objective import Evaluation
    from optimizer.search.recommend import TrialOutcome

    cfg = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(), num_replicas=2)
    a = TrialOutcome(0, cfg, Evaluation(EvalStatus.FEASIBLE, 8, goodput_per_gpu=1.0))
    b = TrialOutcome(1, cfg, replace(a.evaluation, num_gpus=6, goodput_per_gpu=0.995))
    assert recommend([a, b]).number == 1


def test_hypervolume_of_a_staircase():
    assert hypervolume_2d([(2, 1), (1, 2)]) == pytest.approx(3.0)
    assert hypervolume_2d([(2, 1), (1, 1)]) == pytest.approx(2.0)


def test_baseline_is_vllm_defaults():
    cfg = baseline_config(_space())
    assert cfg.replica.max_num_batched_tokens == 8192 and cfg.replica.max_num_seqs == 1024
    assert cfg.num_replicas == 4 and cfg.speculation.enabled is False
    a100 = baseline_config(_space(accelerators=("a100",)))
    assert (a100.replica.max_num_batched_tokens, a100.replica.max_num_seqs) == (2048, 256)


def _outcome_with_best_at(ratio: float):
    """build_outcome on the stand-in with one trial at `ratio` x the defaults' goodput."""
    from dataclasses import replace

    from optimizer.search.outcome import LatencyInfo, build_outcome
    from optimizer.search.recommend import TrialOutcome
    from optimizer.search.request import TuneRequest

    ev = _evaluator()
    request = TuneRequest(
        trace_id=1, model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=4,
        slo_ttft_ms=2000.0, slo_tpot_ms=50.0,
    )  # fmt: skip
    base = ev.evaluate(baseline_config(request.space()))
    assert base.feasible
    cfg = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_seqs=64), num_replicas=4)
    trial = TrialOutcome(7, cfg, replace(ev.evaluate(cfg), status=EvalStatus.FEASIBLE,
                                         goodput_per_gpu=ratio * base.goodput_per_gpu))  # fmt: skip
    out = build_outcome(
        request, [trial], ev, study_name="t", num_trials=1,
        latency=LatencyInfo("stand-in", True),
    )  # fmt: skip
    return out, base, cfg


def test_a_best_config_within_the_search_resolution_keeps_the_defaults():
    out, base, _ = _outcome_with_best_at(1.02)
    rec = out.recommendation
    assert rec.trial is None and rec.config == baseline_config(out.request.space())
    assert rec.predicted == base and out.baseline.gain == pytest.approx(1.0)
    assert "--max-num-batched-tokens 8192" in rec.launch[0].command
    assert out.diagnosis.account[1].startswith("The best config found changes max_num_seqs")
    assert "so the recommendation keeps the defaults" in out.diagnosis.account[2]
    assert out.to_dict()["recommendation"]["trial"] is None
    # The outcome is its JSON: written and read back, it is the same outcome.
    from optimizer.search.outcome import TuneOutcome

    doc = json.loads(json.dumps(out.to_dict()))
    assert doc["recommendation"]["predicted"]["num_gpus"] == rec.predicted.num_gpus
    assert TuneOutcome.from_dict(doc).to_dict() == out.to_dict()


def test_a_best_config_clearly_above_the_defaults_is_recommended():
    out, _, cfg = _outcome_with_best_at(1.5)
    rec = out.recommendation
    assert rec.trial == 7 and rec.config == cfg
    assert out.baseline.gain == pytest.approx(1.5)
    assert out.diagnosis.account[1].startswith("Recommendation changes max_num_seqs 1024 -> 64")


def test_cache_returns_the_same_evaluation():
    ev = _evaluator()
    cfg = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_seqs=64), num_replicas=2)
    first = ev.evaluate(cfg)
    assert ev.evaluate(cfg) is first and ev.cache.hits == 1
    assert config_key(cfg) in ev.cache.entries


def test_vllm_and_sglang_golden_commands():
    cfg = ServingConfig.colocated(
        "llama-3.1-8b",
        InstanceConfig(tp=2, max_num_batched_tokens=2048, max_num_seqs=128),
        num_replicas=4,
        speculation=SpeculationConfig(method=SpecMethod.EAGLE, num_speculative_tokens=3),
    )
    vllm, sglang = launch_commands(cfg, draft_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    assert vllm.count == 4 and vllm.role == "replica"
    assert vllm.command == (
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 2 "
        "--max-num-batched-tokens 2048 --max-num-seqs 128 --enable-chunked-prefill "
        "--gpu-memory-utilization 0.9 --block-size 16 --speculative-config "
        """'{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", """
        """"num_speculative_tokens": 3}'"""
    )
    assert sglang.command == (
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct "
        "--tp-size 2 --chunked-prefill-size 2048 --max-prefill-tokens 2048 "
        "--max-running-requests 128 --mem-fraction-static 0.9 --disable-radix-cache "
        "--speculative-algorithm EAGLE3 --speculative-draft-model-path "
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B --speculative-num-steps 3 "
        "--speculative-num-draft-tokens 4 --speculative-eagle-topk 1"
    )


def test_disaggregated_commands_carry_the_kv_roles():
    cfg = ServingConfig.disaggregated(
        "llama-3.1-8b",
        InstanceConfig(enable_chunked_prefill=False),
        InstanceConfig(max_num_batched_tokens=2048),
        num_prefill=2,
        num_decode=6,
    )
    cmds = launch_commands(cfg)
    pre = next(c for c in cmds if c.engine == "vllm" and c.role == "prefill")
    dec = next(c for c in cmds if c.engine == "vllm" and c.role == "decode")
    assert pre.count == 2 and dec.count == 6
    assert pre.command.endswith(
        """--no-enable-chunked-prefill --gpu-memory-utilization 0.9 --block-size 16 """
        # chunked prefill off: vLLM needs max_model_len <= the token budget
        """--max-model-len 8192 """
        """--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'"""
    )
    assert """"kv_role":"kv_consumer"}'""" in dec.command
    assert [c.role for c in cmds if c.engine == "vllm"] == ["prefill", "decode", "proxy"]
    proxy = next(c for c in cmds if c.engine == "vllm" and c.role == "proxy")
    assert proxy.count == 1 and proxy.command == (
        "python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --port 8192 "
        "--prefiller-hosts PREFILL_HOST_1 PREFILL_HOST_2 --prefiller-ports 8000 8000 "
        "--decoder-hosts DECODE_HOST_1 DECODE_HOST_2 DECODE_HOST_3 DECODE_HOST_4 "
        "DECODE_HOST_5 DECODE_HOST_6 --decoder-ports 8000 8000 8000 8000 8000 8000"
    )
    sg = [c for c in cmds if c.engine == "sglang"]
    assert [c.role for c in sg] == ["prefill", "decode", "proxy"]
    assert "--chunked-prefill-size -1" in sg[0].command
    assert "--context-length 8192" in sg[0].command
    assert "--max-model-len" not in dec.command  # chunked: no limit beyond the KV cache
    assert "--disaggregation-mode decode --disaggregation-transfer-backend nixl" in sg[1].command
    assert sg[2].command == (
        "python -m sglang_router.launch_router --pd-disaggregation "
        "--prefill http://PREFILL_HOST_1:30000 --prefill http://PREFILL_HOST_2:30000 "
        + " ".join(f"--decode http://DECODE_HOST_{i}:30000" for i in range(1, 7))
    )


def test_configs_that_reject_the_traces_longest_request_are_invalid():
    from optimizer.workload import Workload

    wl = _workload()
    # One long prompt late in the trace, outside the 200-request evaluation window.
    long = Workload(
        arrival_s=np.append(wl.arrival_s, wl.arrival_s[-1] + 1.0),
        input_tokens=np.append(wl.input_tokens, 6000),
        output_tokens=np.append(wl.output_tokens, 100),
    )
    ev = TraceEvaluator.for_trace(long, LAT, EvalSettings(SLO(2.0, 0.05), max_requests=200))
    assert ev.longest_request_tokens == 6100
    unchunked = ServingConfig.colocated(
        "llama-3.1-8b", InstanceConfig(max_num_batched_tokens=4096, enable_chunked_prefill=False)
    )
    bad = ev.evaluate(unchunked)
    assert bad.status is EvalStatus.INVALID
    assert "6100" in bad.error and "4096" in bad.error
    chunked = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_batched_tokens=4096))
    assert ev.evaluate(chunked).status is not EvalStatus.INVALID


def test_heterogeneous_gpu_types_split_prefill_and_decode_and_are_priced_per_role():
    """Two GPU types on offer: the grid pairs an H100 prefill with an A100 decode, the
    roofline prices each role on its own GPU, and the fleet price sums both roles."""
    from optimizer.latency import build_catalog
    from optimizer.shapes import get_shape

    space = SearchSpace(
        model="llama-3.1-8b", accelerators=("h100", "a100"), gpu_budget=4,
        modes=(ServingMode.DISAGGREGATED,), tp=(1,), max_num_batched_tokens=(4096,),
        max_num_seqs=(256,), chunked_prefill=(True,),
        prices=(("h100", 4.0), ("a100", 2.0)),
    )  # fmt: skip
    mixed = [
        p.config
        for p in enumerate_grid(space)
        if p.config is not None
        and p.config.prefill.accelerator == "h100"
        and p.config.decode.accelerator == "a100"
    ]
    assert {(c.num_prefill, c.num_decode) for c in mixed} == {(1, 3), (2, 2), (3, 1)}
    cfg = next(c for c in mixed if c.num_prefill == 2)
    assert cfg.price_per_hour() == pytest.approx(2 * 4.0 + 2 * 2.0)
    catalog = build_catalog(get_shape("llama-3.1-8b"), [])  # roofline for both GPU types
    assert catalog.for_instance("h100", 1) is not catalog.for_instance("a100", 1)
    ev = TraceEvaluator.for_trace(
        _workload(), catalog, EvalSettings(SLO(2.0, 0.05), max_requests=200, seed=0)
    )
    hetero = ev.evaluate(cfg)
    same = ev.evaluate(
        ServingConfig.disaggregated(
            "llama-3.1-8b", cfg.prefill, cfg.prefill, num_prefill=2, num_decode=2
        )
    )
    assert hetero.status is not EvalStatus.INVALID and hetero.num_gpus == 4
    assert hetero.goodput_per_dollar == pytest.approx(hetero.max_rate / 12.0)
    # A100 decode (2.0 TB/s against 3.35) is slower per token than H100 decode.
    assert hetero.tpot_p90_ms > same.tpot_p90_ms
    commands = {(c.engine, c.role): c for c in launch_commands(cfg)}
    assert commands[("vllm", "prefill")].count == 2 and commands[("vllm", "decode")].count == 2
