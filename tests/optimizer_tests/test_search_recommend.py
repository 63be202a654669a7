"""Choosing the recommendation: fewest GPUs (or $/h) first, the defaults kept unless
clearly beaten, the Pareto front of cost against interactivity (hand-made evaluations)."""

from __future__ import annotations

import pytest

from optimizer.config import (
    InstanceConfig,
    ServingConfig,
)
from optimizer.search.evaluation import EvalStage, EvalStatus, Evaluation
from optimizer.search.recommend import (
    TrialOutcome,
    hypervolume_2d,
    pareto_front,
    recommend,
)
from optimizer.search.sizing import fleet_of


def _ev(gpus: int, *, status=EvalStatus.FEASIBLE, tok_s=100.0, price=None, **kw) -> Evaluation:
    return Evaluation(status, EvalStage.VERIFIED, gpus, num_units=gpus, unit_gpus=1,
                      interactivity_tok_s=tok_s, price_per_hour=price, **kw)  # fmt: skip


CFG = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_seqs=64))


def test_the_fewest_gpus_win_whatever_the_per_gpu_goodput():
    a = TrialOutcome(0, CFG, _ev(4, goodput_per_gpu=9.0))
    b = TrialOutcome(1, CFG, _ev(3, goodput_per_gpu=1.0))
    assert recommend([a, b]).number == 1
    # With prices, the lowest USD per hour wins instead.
    c = TrialOutcome(2, CFG, _ev(2, price=12.0))
    d = TrialOutcome(3, CFG, _ev(3, price=9.0))
    assert recommend([c, d], per_dollar=True).number == 3
    assert recommend([c, d]).number == 2


def test_infeasible_and_invalid_fleets_are_never_recommended():
    cheap_but_missing = TrialOutcome(0, CFG, _ev(1, status=EvalStatus.INFEASIBLE, tok_s=1e9))
    invalid = TrialOutcome(1, CFG, _ev(1, status=EvalStatus.INVALID))
    ok = TrialOutcome(2, CFG, _ev(4))
    assert recommend([cheap_but_missing, invalid, ok]).number == 2
    assert recommend([cheap_but_missing, invalid]) is None


def test_at_equal_cost_the_defaults_stay_unless_clearly_more_interactive():
    defaults = TrialOutcome(None, CFG, _ev(2, tok_s=100.0))
    assert recommend([defaults, TrialOutcome(4, CFG, _ev(2, tok_s=102.9))]).number is None
    assert recommend([defaults, TrialOutcome(4, CFG, _ev(2, tok_s=103.5))]).number == 4
    assert recommend([defaults, TrialOutcome(4, CFG, _ev(1, tok_s=50.0))]).number == 4


def test_pareto_front_trades_cost_for_interactivity_and_keeps_the_defaults_point():
    def unit(seqs: int, n: int) -> ServingConfig:
        cfg = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_seqs=seqs))
        return fleet_of(cfg, n)

    rows = [
        TrialOutcome(None, unit(1024, 2), _ev(2, tok_s=80.0)),
        TrialOutcome(1, unit(64, 2), _ev(2, tok_s=70.0)),  # dominated by the defaults
        TrialOutcome(2, unit(128, 4), _ev(4, tok_s=150.0)),
        TrialOutcome(3, unit(256, 1), _ev(1, tok_s=40.0)),
        TrialOutcome(4, unit(32, 1), _ev(1, status=EvalStatus.INFEASIBLE, tok_s=500.0)),
        TrialOutcome(5, unit(128, 4), _ev(4, tok_s=150.0)),  # the same fleet as trial 2
    ]
    front = pareto_front(rows)
    assert [(r.trial, r.predicted.num_gpus) for r in front] == [(3, 1), (None, 2), (2, 4)]
    # Another fleet at the same point (within 0.1%) is not a second row ...
    twin = TrialOutcome(6, unit(512, 2), _ev(2, tok_s=80.05))
    assert [r.trial for r in pareto_front([*rows, twin])] == [3, None, 2]
    # ... and the recommendation is always a row, dominated or not.
    kept = pareto_front(rows, keep=rows[1])
    assert [r.trial for r in kept] == [3, None, 1, 2]


def test_hypervolume_of_a_staircase():
    assert hypervolume_2d([(2, 1), (1, 2)]) == pytest.approx(3.0)
    assert hypervolume_2d([(2, 1), (1, 1)]) == pytest.approx(2.0)
