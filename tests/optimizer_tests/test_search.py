"""Search: space/grid, seeded study, constraints, the recommendation, flags, baseline
(the trace evaluator's sizing and verification: test_search_evaluator.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from optimizer.config import (
    InstanceConfig,
    ServingConfig,
    ServingMode,
    SpecMethod,
    SpeculationConfig,
)
from optimizer.latency.analytic import LinearLatency, MappingLatencySource, SingleLatencySource
from optimizer.search.attainment import Load
from optimizer.search.evaluation import EvalSettings, EvalStatus, TrialError
from optimizer.search.flags import launch_commands
from optimizer.search.outcome import LatencyInfo, TuneOutcome, build_outcome
from optimizer.search.recommend import (
    TrialOutcome,
    baseline_config,
    recommend,
)
from optimizer.search.request import TuneRequest, TuneRequestError
from optimizer.search.sizing import fleet_of
from optimizer.search.space import SearchSpace, SearchSpaceError, enumerate_grid
from optimizer.search.study import Objective, open_study, run_trials, trial_outcomes
from optimizer.search.trace_evaluator import TraceEvaluator
from optimizer.sim import SLO, SimulationError, simulate
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


def _evaluator(**kw) -> TraceEvaluator:
    settings = dict(slo=SLO(2.0, 0.05), gpu_budget=4, screen_requests=100, seed=0)
    settings.update(kw)
    return TraceEvaluator.for_trace(_workload(), LAT, EvalSettings(**settings))


def test_grid_covers_each_path_once_and_flags_invalid_ones():
    pts = list(enumerate_grid(_space(modes=(ServingMode.COLOCATED,))))
    # 2 tp x 3 tokens x 2 seqs x 2 chunked
    assert len(pts) == 24
    assert len({p.params for p in pts}) == 24
    bad = [p for p in pts if p.config is None]
    # max_num_batched_tokens 256 < max_num_seqs 512 breaks vLLM's rule (2 tp x 2 chunked)
    assert len(bad) == 4 and all("max_num_seqs" in p.error for p in bad)
    # The search picks units; the evaluator sizes the fleet.
    assert {p.config.num_replicas for p in pts if p.config is not None} == {1}


def test_disaggregated_units_use_the_ratios_and_stay_within_budget():
    space = _space(modes=(ServingMode.DISAGGREGATED,), pd_ratios=((1, 1), (1, 3), (2, 1)))
    units = [p.config for p in enumerate_grid(space) if p.config is not None]
    assert {(c.num_prefill, c.num_decode) for c in units} == {(1, 1), (1, 3), (2, 1)}
    assert all(c.num_gpus <= 4 for c in units)
    # 1:3 with a tp-2 prefill would need 5 GPUs: refused with the sizes named.
    errors = [p.error for p in enumerate_grid(space) if p.config is None]
    assert any("P:D unit 1:3 at tp 2/1 needs 5 GPUs, more than the budget of 4" in e
               for e in errors)  # fmt: skip


def test_space_rejects_bad_overrides_with_the_field_named():
    with pytest.raises(SearchSpaceError, match="unknown keys \\['chunk'\\]"):
        _space().with_overrides({"chunk": [1]})
    with pytest.raises(SearchSpaceError, match="spec_k"):
        _space(spec_k=(0, 9), spec_method=SpecMethod.EAGLE)
    with pytest.raises(SearchSpaceError, match=r"pd_ratios: expected \[prefill, decode\] pairs"):
        _space().with_overrides({"pd_ratios": [[1, 0]]})
    assert _space().with_overrides({"pd_ratios": [[1, 2]]}).pd_ratios == ((1, 2),)


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
            assert t.constraints == {"constraint": 1.0}
    # A trial's objective values are its screen's figures.
    for o in outcomes:
        values = a.trials[o.number].values
        assert values == [o.evaluation.goodput_per_gpu, o.evaluation.interactivity_tok_s]


def test_baseline_is_one_replica_of_vllm_defaults():
    cfg = baseline_config(_space())
    assert cfg.replica.max_num_batched_tokens == 8192 and cfg.replica.max_num_seqs == 1024
    assert cfg.num_replicas == 1 and cfg.speculation.enabled is False
    a100 = baseline_config(_space(accelerators=("a100",)))
    assert (a100.replica.max_num_batched_tokens, a100.replica.max_num_seqs) == (2048, 256)


SLOW = LinearLatency(base_s=0.007, per_token_s=2.7e-5, per_kv_token_s=4e-8)
FAST = LinearLatency(base_s=0.003, per_token_s=0.7e-5, per_kv_token_s=1e-8)
BY_TP = MappingLatencySource((("h100", 1, SLOW), ("h100", 2, FAST)))
TP2 = ServingConfig.colocated(
    "llama-3.1-8b", InstanceConfig(tp=2, max_num_batched_tokens=2048, max_num_seqs=256)
)


def _tuned(rate: float, **request):
    """build_outcome with one screened trial (TP2, priced 4x faster than TP1) at `rate`."""
    wl = synthetic_workload(
        400, rate, input_lengths=LognormalLength(1500, 0.8, max_tokens=8000),
        output_lengths=FixedLength(60), seed=1,
    )  # fmt: skip
    fields = dict(
        trace_id=1, model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=8,
        slo_ttft_ms=2000, slo_tpot_ms=20, screen_requests=200, search_space={"tp": [1, 2]},
    )  # fmt: skip
    fields.update(request)
    req = TuneRequest(**fields)
    ev = TraceEvaluator.for_trace(wl, BY_TP, req.eval_settings())
    trial = TrialOutcome(5, TP2, ev.evaluate(TP2))
    out = build_outcome(
        req,
        req.space(),
        [trial],
        ev,
        study_name="t",
        num_trials=1,
        latency=LatencyInfo("by tp", True),
    )
    return out, wl, ev


def test_the_recommendation_is_the_smaller_fleet_verified_on_the_whole_trace():
    out, wl, ev = _tuned(40.0)
    rec = out.recommendation
    assert rec.trial == 5 and rec.config == fleet_of(TP2, 1)
    assert rec.predicted.num_gpus == 2 and out.baseline.predicted.num_gpus == 4
    assert out.baseline.gain == pytest.approx(2.0)
    assert out.diagnosis.account[1].startswith(
        "Recommendation (trial 5) meets the SLOs with 2 GPUs instead of the defaults' 4 GPUs"
    )
    # Its figures are those of simulating the recommended config on the whole trace.
    direct = simulate(wl, rec.config, BY_TP, seed=0, slo=ev.settings.slo)
    assert rec.predicted.ttft_p90_ms == direct.ttft.p90 * 1e3
    assert rec.predicted.at(Load.TRACE).share == direct.attainment(ev.settings.slo)
    assert "--tensor-parallel-size 2" in rec.launch[0].command and rec.launch[0].count == 1
    # The capacity plan starts at the recommendation and never shrinks with traffic.
    gpus = [c.num_gpus for c in out.capacity]
    assert [c.traffic for c in out.capacity] == [1.0, 2.0, 4.0]
    assert gpus[0] == 2 and gpus == sorted(gpus) and all(c.feasible for c in out.capacity)
    assert out.capacity[2].mean_rate == pytest.approx(4 * ev.trace_rate)
    # The outcome is its JSON: written and read back, it is the same outcome.
    doc = json.loads(json.dumps(out.to_dict()))
    assert doc["recommendation"]["predicted"]["stage"] == "verified"
    assert doc["evaluated"]["trace"]["num_requests"] == 400
    assert TuneOutcome.from_dict(doc).to_dict() == out.to_dict()


def test_the_defaults_are_kept_when_nothing_is_cheaper():
    out, _, _ = _tuned(40.0, search_space={"tp": [1, 2]}, gpu_budget=2)
    # The defaults need 4 GPUs and the budget is 2: only the TP2 unit fits.
    assert out.baseline.predicted.status is EvalStatus.INFEASIBLE
    assert out.recommendation.trial == 5 and out.baseline.gain is None
    low, _, _ = _tuned(5.0)
    # At 5 req/s one TP1 replica of the defaults meets the SLOs: 1 GPU beats TP2's 2.
    assert low.recommendation.trial is None and low.recommendation.predicted.num_gpus == 1
    assert "keeps them" in low.diagnosis.account[1]
    assert "--max-num-batched-tokens 8192" in low.recommendation.launch[0].command


def test_an_impossible_slo_names_the_binding_slo_and_how_close_it_came():
    out, _, _ = _tuned(40.0, slo_ttft_ms=20.0)
    assert out.recommendation is None and out.capacity == ()
    headline = out.verdict.headline
    assert headline.startswith("No fleet within 8 GPUs meets the SLOs for 90% of requests.")
    # The closest fleet, its deciding attainment with the traffic it was measured at, and
    # the SLO that binds there (TTFT alone; TPOT does not).
    closest = max((p.predicted for p in out.pareto), key=lambda e: e.share)
    att = closest.attainment
    assert f"{att.share:.1%} at {att.rate:,.2f} req/s" in headline
    there = headline.split("; there ")[1]
    assert there.startswith("TTFT <= 20 ms binds") and "TPOT" not in there


def test_errors_that_are_not_the_configs_fail_the_trial_loudly():
    # tp 2 has no latency model: a LookupError, not an invalid config.
    only_tp1 = MappingLatencySource((("h100", 1, SLOW),))
    ev = TraceEvaluator.for_trace(_workload(), only_tp1, EvalSettings(SLO(2.0, 0.05)))
    with pytest.raises(SimulationError, match="no latency model"):
        ev.evaluate(TP2)
    study = open_study("err", None, seed=0, n_startup_trials=1)
    space = _space(tp=(2,), max_num_seqs=(64,), modes=(ServingMode.COLOCATED,))
    with pytest.raises(TrialError, match=r"trial 0 failed: .*SimulationError") as info:
        run_trials(study, Objective(space, ev), 3)
    assert "Traceback" in info.value.traceback
    assert "no latency model" in study.trials[0].user_attrs["error"]


def test_prefix_caching_is_searched_when_the_trace_has_prefix_hashes():
    req = TuneRequest(trace_id=1, model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=2,
                      slo_ttft_ms=2000, slo_tpot_ms=50)  # fmt: skip
    assert req.space().prefix_caching == (False,)
    space = req.space(trace_has_prefix_hashes=True)
    assert space.prefix_caching == (True, False)
    assert baseline_config(space).enable_prefix_caching is True  # vLLM's default
    grid = enumerate_grid(replace(space, modes=(ServingMode.COLOCATED,), tp=(1,)))
    assert {p.config.enable_prefix_caching for p in grid if p.config} == {True, False}
    fixed = replace(req, search_space={"prefix_caching": [False]})
    assert fixed.space(trace_has_prefix_hashes=True).prefix_caching == (False,)
    # Spaces stored before the knob was a choice still read.
    legacy = SearchSpace("llama-3.1-8b", ("h100",), 2).with_overrides(
        {"enable_prefix_caching": True}
    )
    assert legacy.prefix_caching == (True,)


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
    # Default P:D ratios that fit 4 one-GPU instances.
    assert {(c.num_prefill, c.num_decode) for c in mixed} == {(1, 1), (1, 2), (1, 3), (2, 1),
                                                               (3, 1)}  # fmt: skip
    cfg = next(c for c in mixed if (c.num_prefill, c.num_decode) == (2, 1))
    assert cfg.price_per_hour() == pytest.approx(2 * 4.0 + 1 * 2.0)
    catalog = build_catalog(get_shape("llama-3.1-8b"), [])  # roofline for both GPU types
    assert catalog.for_instance("h100", 1) is not catalog.for_instance("a100", 1)
    ev = TraceEvaluator.for_trace(_workload(), catalog, EvalSettings(SLO(2.0, 0.05), seed=0))
    hetero = ev.evaluate(cfg)
    same = ev.evaluate(
        ServingConfig.disaggregated(
            "llama-3.1-8b", cfg.prefill, cfg.prefill, num_prefill=2, num_decode=1
        )
    )
    assert hetero.status is not EvalStatus.INVALID and hetero.unit_gpus == 3
    assert hetero.goodput_per_dollar == pytest.approx(hetero.unit_rate / 10.0)
    assert hetero.price_per_hour == pytest.approx(10.0 * hetero.num_units)
    # A100 decode (2.0 TB/s against 3.35) is slower per token than H100 decode.
    assert hetero.tpot_p90_ms > same.tpot_p90_ms
    vllm = [c for c in launch_commands(cfg) if c.engine == "vllm"]
    # One node per GPU type: the H100 prefill servers and the A100 decode server.
    assert [(c.role, c.node, c.accelerator) for c in vllm] == [
        ("prefill", 0, "h100"), ("prefill", 0, "h100"), ("decode", 1, "a100"), ("proxy", 0, "")
    ]  # fmt: skip


def test_naming_a_drafter_searches_speculation_depths():
    base = dict(trace_id=1, model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=2,
                slo_ttft_ms=2000, slo_tpot_ms=50)  # fmt: skip
    eagle = TuneRequest(**base, draft_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    space = eagle.space()
    assert space.spec_method is SpecMethod.EAGLE and space.spec_k == (0, 1, 2, 3, 4, 5)
    assert space.acceptance_rate == 0.7 and not space.use_trace_acceptance
    assert eagle.space(trace_has_acceptance=True).use_trace_acceptance
    draft = TuneRequest(**base, draft_model="llama-3.2-1b", acceptance_rate=0.6)
    ds = draft.space(trace_has_acceptance=True)
    assert ds.spec_method is SpecMethod.DRAFT and ds.draft_model == "llama-3.2-1b"
    assert ds.acceptance_rate == 0.6 and not ds.use_trace_acceptance  # the user's rate wins
    with pytest.raises(TuneRequestError, match="neither a model shape preset"):
        TuneRequest(**base, draft_model="some/unknown-model")
    with pytest.raises(TuneRequestError, match="acceptance_rate: give draft_model too"):
        TuneRequest(**base, acceptance_rate=0.5)
    # The launch commands name the drafter as the user did (presets as their HF id).
    cfg = ServingConfig.colocated(
        "llama-3.1-8b", InstanceConfig(),
        speculation=SpeculationConfig(method=SpecMethod.DRAFT, num_speculative_tokens=3,
                                      draft_model="llama-3.2-1b"),
    )  # fmt: skip
    assert '"model": "meta-llama/Llama-3.2-1B-Instruct"' in launch_commands(cfg)[0].command


def test_the_drafter_takes_memory_from_the_kv_cache():
    from optimizer.memory import eagle_head_footprint, kv_capacity_blocks
    from optimizer.shapes import get_shape

    shape = get_shape("llama-3.1-8b")
    head = eagle_head_footprint(shape, 1)
    # One Llama-3.1-8B layer (218.1 M) + fusion 3h x h (50.3 M) + 32k x h LM head (131.1 M),
    # in bf16; its KV is one layer's of 32.
    assert head.weight_bytes == 2 * (218_103_808 + 50_331_648 + 131_072_000)
    assert head.kv_bytes_per_token == shape.kv_bytes_per_token(1) // 32
    inst = InstanceConfig()
    plain = kv_capacity_blocks(shape, inst)
    with_head = kv_capacity_blocks(shape, inst, head)
    assert with_head < plain
    spec = SpeculationConfig(method=SpecMethod.EAGLE, num_speculative_tokens=3)
    pd = ServingConfig.disaggregated("llama-3.1-8b", inst, inst, speculation=spec)
    prefill, decode = pd.roles()
    # A prefill server does not speculate: no drafter there.
    assert prefill.kv_blocks == plain and decode.kv_blocks == with_head
