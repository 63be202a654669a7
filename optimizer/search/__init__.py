"""Optuna Pareto search over serving configs: space, objective, study, recommendation,
launch flags, diagnosis and reports. `api.services.tuning.run_tuning_job` is the entry point."""

from optimizer.search.objective import EvalSettings, EvalStatus, Evaluation, TraceEvaluator
from optimizer.search.space import SearchSpace, build_config, enumerate_grid

__all__ = [
    "EvalSettings",
    "EvalStatus",
    "Evaluation",
    "SearchSpace",
    "TraceEvaluator",
    "build_config",
    "enumerate_grid",
]
