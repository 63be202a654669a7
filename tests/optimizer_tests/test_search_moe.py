"""The search space of a MoE model also tries dp ranks and expert parallelism within the
GPU budget; a dense model's space asks for neither."""

from __future__ import annotations

from collections import Counter

import pytest

from optimizer.config import ServingMode
from optimizer.search.space import SearchSpace, SearchSpaceError, enumerate_grid
from tests.optimizer_tests.moe_fixtures import fake_layout_weights, register_moe


@pytest.fixture(autouse=True)
def _moe(monkeypatch):
    register_moe(monkeypatch)
    fake_layout_weights(monkeypatch)


def space(model: str, budget: int, **kw) -> SearchSpace:
    base = dict(
        model=model, accelerators=("h200",), gpu_budget=budget, tp=(1, 2, 4),
        max_num_batched_tokens=(2048,), max_num_seqs=(256,), chunked_prefill=(True,),
    )  # fmt: skip
    base.update(kw)
    return SearchSpace(**base)


def test_moe_colocated_grid_tries_dp_and_ep_within_the_budget():
    pts = list(enumerate_grid(space("test-moe", 4, modes=(ServingMode.COLOCATED,))))
    layouts = Counter(
        (p.config.replica.tp, p.config.replica.dp, p.config.replica.expert_parallel)
        for p in pts
        if p.config is not None and p.config.replica is not None
    )
    # by hand: tp 1 with dp 1, 2, 4; tp 2 with dp 1, 2; tp 4 with dp 1: six splits within
    # 4 GPUs, each with experts tensor-split or sharded whole
    want = {(t, d, e) for t, d in ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (4, 1))
            for e in (False, True)}  # fmt: skip
    assert set(layouts) == want and all(n == 1 for n in layouts.values())
    assert all(p.config.num_gpus <= 4 for p in pts if p.config is not None)
    assert {name for p in pts for name, _ in p.params} >= {"replica.dp", "replica.expert_parallel"}


def test_moe_disaggregated_units_count_tp_x_dp_against_the_budget():
    sp = space("test-moe", 4, modes=(ServingMode.DISAGGREGATED,), pd_ratios=((1, 1),))
    pts = list(enumerate_grid(sp))
    units = [p.config for p in pts if p.config is not None]
    assert units and all(c.num_gpus <= 4 for c in units)
    assert any(c.prefill.dp > 1 for c in units) and any(c.decode.expert_parallel for c in units)
    errors = [p.error for p in pts if p.config is None]
    assert any("x dp" in e and "more than the budget of 4" in e for e in errors)


def test_dense_spaces_ask_for_no_moe_knobs():
    pts = list(enumerate_grid(space("llama-3.1-8b", 4)))
    names = {name for p in pts for name, _ in p.params}
    assert not any(n.endswith((".dp", ".expert_parallel")) for n in names)
    assert all(
        i.dp == 1 and not i.expert_parallel
        for p in pts
        if p.config is not None
        for i in (p.config.replica, p.config.prefill, p.config.decode)
        if i is not None
    )


def test_the_moe_knobs_validate_and_round_trip():
    sp = space("test-moe", 8, dp=(1, 4), expert_parallel=(True,))
    back = SearchSpace.from_dict(sp.to_dict())
    assert back == sp and back.dp == (1, 4) and back.expert_parallel == (True,)
    old = sp.to_dict()
    del old["dp"], old["expert_parallel"]  # stored before issue 27
    assert SearchSpace.from_dict(old).dp == (1, 2, 4, 8)
    with pytest.raises(SearchSpaceError, match=r"dp: expected ascending values"):
        space("test-moe", 8, dp=(4, 1))
    with pytest.raises(SearchSpaceError, match=r"expert_parallel: expected booleans"):
        space("test-moe", 8, expert_parallel=(1,))
    with pytest.raises(SearchSpaceError, match=r"expert_parallel: duplicate values"):
        space("test-moe", 8, expert_parallel=(True, True))


@pytest.mark.parametrize(
    ("acc", "defaults"),
    [("b200", (8192, 1024)), ("b300", (8192, 1024)), ("gh200", (8192, 1024)),
     ("a100", (2048, 256)), ("l40s", (2048, 256))],
)  # fmt: skip
def test_baseline_takes_vllms_large_defaults_on_gpus_of_70_gib_but_a100(acc, defaults):
    from optimizer.search.recommend import baseline_config

    inst = baseline_config(space("llama-3.1-8b", 8, accelerators=(acc,))).replica
    assert inst is not None
    assert (inst.max_num_batched_tokens, inst.max_num_seqs) == defaults


def test_a_seeded_moe_study_evaluates_dp_and_ep_units():
    from optimizer.latency.analytic import LinearLatency, SingleLatencySource
    from optimizer.search.evaluation import EvalSettings, EvalStatus
    from optimizer.search.study import Objective, open_study, run_trials, trial_outcomes
    from optimizer.search.trace_evaluator import TraceEvaluator
    from optimizer.sim import SLO
    from optimizer.workload import FixedLength, LognormalLength, synthetic_workload

    wl = synthetic_workload(
        200, 8.0, input_lengths=LognormalLength(800, 0.5, max_tokens=4000),
        output_lengths=FixedLength(60), seed=1,
    )  # fmt: skip
    lat = SingleLatencySource(LinearLatency(base_s=0.007, per_token_s=2.7e-5, per_kv_token_s=4e-8))
    settings = EvalSettings(slo=SLO(2.0, 0.05), gpu_budget=4, screen_requests=100, seed=0)
    evaluator = TraceEvaluator.for_trace(wl, lat, settings)
    sp = space("test-moe", 4, modes=(ServingMode.COLOCATED,), tp=(1, 2))
    study = open_study("moe", None, seed=2, n_startup_trials=6)
    run_trials(study, Objective(sp, evaluator), 6)
    outcomes = trial_outcomes(study)
    assert outcomes and all(o.config.num_gpus <= 4 for o in outcomes)
    assert all(o.evaluation.status is not EvalStatus.INVALID for o in outcomes)
    assert any(o.config.replica.dp > 1 for o in outcomes)
